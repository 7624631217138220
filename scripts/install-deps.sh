#!/usr/bin/env bash
# Install hvd's build and test dependencies from Debian 12's archive. Idempotent: when every
# package is present it touches nothing (and needs no network).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libboost-dev libgloo-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin libfabric-dev libfabric-bin
  iproute2 zlib1g-dev jq gnuplot-nox
  clang libclang-rt-14-dev  # libFuzzer (scripts/fuzz.sh); hvd itself builds with g++
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
