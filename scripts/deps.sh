#!/usr/bin/env bash
# Installs the Debian packages ditrl builds, tests and runs with. Idempotent:
# installs only what is missing, and runs `apt-get update` only when it must.
set -euo pipefail

PACKAGES=(
  build-essential cmake ccache git xz-utils libtcmalloc-minimal4
  libopenmpi-dev openmpi-bin
  libhdf5-openmpi-dev hdf5-tools
  libboost-json1.81-dev libtomlplusplus-dev catch2 libcli11-dev libspdlog-dev libssl-dev libcurl4-openssl-dev
  libpng-dev libwebp-dev pkg-config chromium
  python3-h5py python3-matplotlib python3-numpy python3-pil python3-venv
)

missing=()
for package in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "deps: all ${#PACKAGES[@]} Debian packages present"
else
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  echo "deps: installing ${missing[*]}"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi

# The pinned PyPI packages (scripts/requirements.txt) in one venv; pip runs
# only when the pinned set changed since the last install.
VENV=${DITRL_VENV:-$HOME/.cache/ditrl/venv}
REQUIREMENTS="$(dirname "$0")/requirements.txt"
# Packages whose declared dependencies would replace what the venv shares
# with Debian (ltx-core asks for numpy 2, which Debian's h5py is not built
# against): installed without their dependencies, which the first set covers.
NODEPS="$(dirname "$0")/requirements-nodeps.txt"
if [[ ! -x "$VENV/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
want=$(cat "$REQUIREMENTS" "$NODEPS" | sha256sum | cut -d' ' -f1)
if [[ "$(cat "$VENV/.requirements.sha256" 2>/dev/null)" != "$want" ]]; then
  echo "deps: pip install -r $REQUIREMENTS (and --no-deps -r $NODEPS) into $VENV"
  "$VENV/bin/pip" install --disable-pip-version-check -r "$REQUIREMENTS"
  "$VENV/bin/pip" install --disable-pip-version-check --no-deps -r "$NODEPS"
  echo "$want" > "$VENV/.requirements.sha256"
fi
echo "deps: Python packages in $VENV"
