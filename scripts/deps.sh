#!/usr/bin/env bash
# Installs the Debian packages ditrl builds, tests and runs with. Idempotent:
# installs only what is missing, and runs `apt-get update` only when it must.
set -euo pipefail

PACKAGES=(
  build-essential cmake ccache git
  libtorch-dev libopenblas0-openmp
  libopenmpi-dev openmpi-bin
  libhdf5-openmpi-dev hdf5-tools
  libboost-json1.81-dev libtomlplusplus-dev catch2 libcli11-dev libspdlog-dev
  python3-h5py python3-matplotlib python3-numpy python3-torch
)

missing=()
for package in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "deps: installing ${missing[*]}"
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
