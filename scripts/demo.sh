#!/usr/bin/env bash
# The main job on the embedded default: install, build, and run a 2-rank allreduce over the Gloo
# backend on loopback (no cluster, no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build --target hvdrun hvd-info hello_allreduce hvd-backend-gloo

echo
build/bin/hvd-info
echo
echo "+ build/bin/hvdrun -np 2 build/bin/hello_allreduce"
build/bin/hvdrun -np 2 build/bin/hello_allreduce
