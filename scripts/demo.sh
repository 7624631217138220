#!/usr/bin/env bash
# The main job on the embedded default: install, build, make the MNIST digits, and train the
# reference MNIST network data-parallel on 2 ranks over the Gloo backend on loopback, on CPU (no
# cluster, no GPU). Fails unless validation accuracy ends above 0.96. Extra arguments go to
# hvd-mnist (--epochs, --seed, --device, ...; hvd-mnist --help).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build --target hvdrun hvd-info hvd-backend-gloo hvd-mnist
./scripts/make-mnist.sh

echo
build/bin/hvd-info
echo
echo "+ build/bin/hvdrun -np 2 build/bin/hvd-mnist --min-accuracy 0.96 $*"
build/bin/hvdrun -np 2 build/bin/hvd-mnist --min-accuracy 0.96 "$@"
