#!/usr/bin/env bash
# Prepares kit/prefix/: the libraries ditrl builds and runs with that a bare
# GPU machine lacks (Open MPI, parallel HDF5, Boost.JSON, toml++,
# spdlog + fmt, CLI11, Catch2, OpenSSL's libcrypto, libcurl, libpng, libwebp and pkg-config),
# as Debian bookworm packages unpacked into one
# relocatable prefix, for scripts/gpu_check.sh. The device tool copies the
# tree to the GPU machine with at most 64 MiB of ignored paths, so the prefix
# is pruned (no docs, static libraries, Fortran/Java/OpenSHMEM, only the
# Boost modules Boost.JSON includes) and packed; the pack must stay under 40 MiB.
#   bash scripts/prepare_gpu_kit.sh [KIT_DIR]     (default kit/; idempotent)
# It also packs the prefix as KIT_DIR/prefix.tar.xz, the one file to carry to
# the GPU machine (scripts/gpu_check.sh unpacks it where kit/prefix is absent).
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=$(realpath -m "${1:-kit}")
PREFIX=$KIT/prefix
DEBS=$KIT/debs
LIMIT_MIB=40
ARCH=x86_64-linux-gnu

PACKAGES=(
  libopenmpi3 openmpi-bin openmpi-common libopenmpi-dev libpmix2 libhwloc15
  libevent-2.1-7 libevent-core-2.1-7 libevent-pthreads-2.1-7
  libhdf5-openmpi-103-1 libhdf5-openmpi-hl-100 libhdf5-openmpi-dev libsz2 libaec0
  libboost-json1.81.0 libboost-json1.81-dev libboost1.81-dev
  libtomlplusplus3 libtomlplusplus-dev libspdlog1.10 libspdlog-dev libfmt9 libfmt-dev libcli11-dev catch2
  libtcmalloc-minimal4 libssl3 libssl-dev libcurl4 libcurl4-openssl-dev
  libpng16-16 libpng-dev zlib1g-dev libwebp7 libwebpmux3 libwebpdemux2 libwebp-dev pkgconf pkgconf-bin libpkgconf3
)

# Where a machine with a C++ compiler has its own copy (the C library and the
# compiler's runtime): never carried.
SYSTEM_LIBS='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libutil|libstdc\+\+|libgcc_s)\.so'

# Up to date when this script and the pinned requirements made it (CI reruns cost nothing then).
stamp=$(cat "$0" scripts/requirements.txt | sha256sum | cut -d' ' -f1)
if [[ -f $KIT/prefix.tar.xz && "$(cat "$PREFIX/.stamp" 2>/dev/null)" == "$stamp" ]]; then
  echo "prepare_gpu_kit: $PREFIX and $KIT/prefix.tar.xz are up to date"
  exit 0
fi

mkdir -p "$DEBS"
( cd "$DEBS" && for p in "${PACKAGES[@]}"; do ls "${p}"_*.deb >/dev/null 2>&1 || apt-get download "$p"; done ) 2>&1 |
  grep -v '^W: Download is performed unsandboxed' || true

rm -rf "$PREFIX"
mkdir -p "$PREFIX"
for p in "${PACKAGES[@]}"; do dpkg-deb -x "$(ls "$DEBS/${p}"_*.deb | tail -1)" "$PREFIX"; done
U=$PREFIX/usr
L=$U/lib/$ARCH

# --- prune -----------------------------------------------------------------
rm -rf "$U/share/doc" "$U/share/man" "$U/share/lintian" "$PREFIX/etc" "$L/fortran" "$L/openmpi/lib/"*java* \
  "$U/include/$ARCH/openmpi" "$U/share/java"
find "$PREFIX" -name '*.a' ! -name 'libCatch2*' -delete  # Catch2's CMake targets name its own
find "$PREFIX" \( -name '*oshmem*' -o -name 'mca_spml_*' -o -name 'mca_sshmem_*' -o -name 'mca_scoll_*' \
  -o -name 'mca_atomic_*' -o -name 'mca_memheap_*' -o -name '*mpifh*' -o -name '*usempi*' -o -name '*f08*' \) -exec rm -rf {} +
# Components Debian's own openmpi-mca-params.conf switches off (UCX, OFI,
# verbs) and the PSM (Omni-Path / InfiniPath) ones: their libraries do not travel.
rm -f "$L/openmpi/lib/openmpi3/"mca_{pml_ucx,osc_ucx,btl_uct,mtl_ofi,mtl_psm,mtl_psm2,btl_ofi,btl_openib,common_ucx,common_ofi,common_verbs}*.so \
  "$L/openmpi/lib/"libmca_common_{ucx,ofi,verbs}.so* "$L/"libmca_common_{ucx,ofi,verbs}.so*
rm -f "$U/bin/"{osh*,shmem*,mpif*,mpijavac*,h5pfc*,aggregate_profile,profile2mat}
# OpenSSL's two generated headers (configuration.h, opensslconf.h) sit in
# Debian's multiarch folder, which only Debian's own compiler searches: beside
# the other OpenSSL headers, in the folder CMake's FindOpenSSL names.
mv "$U/include/$ARCH/openssl/"*.h "$U/include/openssl/"
rmdir "$U/include/$ARCH/openssl"
# Boost: the modules Boost.JSON's headers reach (whole module folders, so a
# compiler's other #if branches find theirs too) and the top-level headers.
keep=$(printf '#include <boost/json.hpp>\n#include <boost/version.hpp>\n' |
  g++ -std=c++17 -M -I"$U/include" -x c++ - | tr ' \\' '\n\n' | grep "^$U/include/boost/.*/" |
  sed "s|^$U/include/boost/||; s|/.*||" | sort -u)
for d in "$U/include/boost/"*/; do
  m=$(basename "$d")
  grep -qx "$m" <<<"$keep" || rm -rf "$d"
done
rm -rf "$L/cmake/"boost_{atomic,chrono,container,context,contract,coroutine,date_time,exception,fiber,filesystem,graph,iostreams,locale,log,math,nowide,prg,program_options,python,random,regex,serialization,stacktrace,test,thread,timer,type_erasure,unit_test,url,wave,wserialization}* 2>/dev/null || true

# --- the libraries these depend on that a bare machine may lack ------------
# (copied from this Debian machine's own files: the same bookworm packages).
elf_files() { find "$PREFIX" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec sh -c 'head -c4 "$1" | grep -q ELF && echo "$1"' _ {} \; ; }
libpath="$L:$L/openmpi/lib:$L/pmix2/lib"
for round in 1 2 3 4; do
  added=0
  while read -r lib; do
    [[ -e "$L/$(basename "$lib")" ]] && continue
    cp -L "$lib" "$L/$(basename "$lib")"
    owner=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "/usr$lib" 2>/dev/null || true)  # usrmerge: /lib is /usr/lib
    echo "$(basename "$lib") ${owner%%:*}" >>"$KIT/closure.txt.new"
    added=1
  done < <(elf_files | xargs -r env LD_LIBRARY_PATH="$libpath" ldd 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    grep -vE "$SYSTEM_LIBS" | awk '{print $2}' | grep -v "^$PREFIX/" | sort -u)
  ((added)) || break
done
# The link-time names (libcurl.so, libsz.so, ...) that h5pcc's -l flags ask
# CMake's FindHDF5 to find.
( cd "$L" && for f in lib*.so.*; do base=${f%%.so.*}.so; [[ -e $base ]] || ln -s "$f" "$base"; done )
missing=$(elf_files | xargs -r env LD_LIBRARY_PATH="$libpath" ldd 2>/dev/null | grep 'not found' | sort -u || true)
[[ -z "$missing" ]] || { echo "prepare_gpu_kit: unresolved libraries: $missing"; exit 1; }

# --- relocation ------------------------------------------------------------
# Debian's update-alternatives links, made relative.
( cd "$U/bin"
  for t in mpicc mpicxx mpic++ mpiexec mpirun; do ln -sf "$t.openmpi" "$t"; done
  ln -sf h5pcc.openmpi h5pcc )
# h5pcc names /usr; it finds its prefix from where it lies instead.
sed -i 's|^prefix="/usr"|prefix="$(cd "$(dirname "$(readlink -f "$0")")/.." \&\& pwd)"|' "$U/bin/h5pcc.openmpi"
grep -q '^prefix="\$(cd' "$U/bin/h5pcc.openmpi" || { echo "prepare_gpu_kit: h5pcc prefix not rewritten"; exit 1; }
# h5pcc calls mpicc by its Debian name; the kit's bin comes first on PATH.
# pkg-config files: relative to their own folder.
for pc in $(find "$PREFIX" -name '*.pc'); do
  rel=$(realpath --relative-to="$(dirname "$pc")" "$U")
  sed -i "s|^prefix=/usr\$|prefix=\${pcfiledir}/$rel|" "$pc"
done
# CMake package files must not name /usr or the build tree they came from.
if grep -rlE '"/usr/(include|lib)|/build/boost' --include='*.cmake' "$PREFIX" | xargs -r grep -LE '_realOrig|_BOOST_CMAKEDIR_ORIGINAL' |
  grep .; then
  echo "prepare_gpu_kit: CMake files above name absolute install paths"; exit 1
fi

glibc=$(elf_files | xargs -r objdump -T 2>/dev/null | grep -oE 'GLIBC_[0-9]+\.[0-9]+' | sort -t. -k2 -n -u | tail -1)
cat >"$PREFIX/env.sh" <<EOF
# Source this (scripts/gpu_check.sh does): the kit's libraries and Open MPI,
# wherever the kit folder lies.
export KIT_USR=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)/usr
export OPAL_PREFIX=\$KIT_USR  # Open MPI's compiled-in /usr, relocated (plugins, help files, wrapper data)
export PMIX_PREFIX=\$KIT_USR/lib/$ARCH/pmix2 PMIX_MCA_mca_base_component_path=\$KIT_USR/lib/$ARCH/pmix2/lib/pmix  # PMIx's plugins
export HDF5_USE_SHLIB=yes  # h5pcc -show: the shared libraries (the static ones do not travel)
export PATH=\$KIT_USR/bin:\$PATH
export LD_LIBRARY_PATH=\$KIT_USR/lib/$ARCH:\$KIT_USR/lib/$ARCH/openmpi/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export CMAKE_PREFIX_PATH=\$KIT_USR\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}
export PKG_CONFIG_PATH=\$KIT_USR/lib/$ARCH/pkgconfig:\$KIT_USR/share/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}  # libwebp's .pc files
# Debian's /etc/openmpi/openmpi-mca-params.conf, which does not travel.
export OMPI_MCA_btl_base_warn_component_unused=0 OMPI_MCA_mtl='^ofi' OMPI_MCA_btl='^uct,openib,ofi' \\
  OMPI_MCA_pml='^ucx' OMPI_MCA_osc='^ucx,pt2pt'
export DITRL_KIT_GLIBC=${glibc#GLIBC_}  # the newest glibc symbol version the kit's binaries use
EOF
{
  echo "# ditrl GPU kit, prepared $(date -u '+%Y-%m-%d %H:%M UTC') on $(. /etc/os-release; echo "$PRETTY_NAME")"
  echo "# needs glibc >= ${glibc#GLIBC_}"
  for p in "${PACKAGES[@]}"; do basename "$(ls "$DEBS/${p}"_*.deb | tail -1)" .deb; done
  echo "# copied from this machine (runtime closure):"
  sort -u "$KIT/closure.txt.new" 2>/dev/null || true
} >"$PREFIX/MANIFEST"
rm -f "$KIT/closure.txt.new"

# diffusers for the benchmark's PyTorch peer (benchmarks/gpu/), pure Python,
# and the one of its requirements the GPU machines' python3 lacks; flow_grpo's
# pure-Python imports for the loop benchmark's peer (benchmarks/gpu/loop.sh).
mkdir -p "$PREFIX/wheels"
"${DITRL_VENV:-$HOME/.cache/ditrl/venv}/bin/pip" download --disable-pip-version-check -q --no-deps --only-binary=:all: \
  -d "$PREFIX/wheels" "$(grep '^diffusers==' scripts/requirements.txt)" importlib_metadata==10.2.0 \
  "$(grep '^peft==' scripts/requirements.txt)" "$(grep '^accelerate==' scripts/requirements.txt)" \
  $(grep -E '^(absl-py|ml_collections)==' benchmarks/peer/flow_grpo/requirements.txt)
ls "$PREFIX/wheels" >>"$PREFIX/MANIFEST"

echo "$stamp" >"$PREFIX/.stamp"
tar -C "$KIT" -cJf "$KIT/prefix.tar.xz.tmp" prefix && mv "$KIT/prefix.tar.xz.tmp" "$KIT/prefix.tar.xz"
mib=$(du -sm "$PREFIX" | cut -f1) packed=$(($(stat -c %s "$KIT/prefix.tar.xz") / 1048576))
echo "prepare_gpu_kit: $PREFIX ($mib MiB; $KIT/prefix.tar.xz $packed MiB), glibc >= ${glibc#GLIBC_}"
((packed <= LIMIT_MIB)) || { echo "prepare_gpu_kit: prefix.tar.xz is $packed MiB, over the $LIMIT_MIB MiB it may take"; exit 1; }
