#!/usr/bin/env bash
# The main job on the embedded default: install, build, make the MNIST digits, and train the
# reference MNIST network data-parallel on 2 ranks over the Gloo backend on loopback, on CPU (no
# cluster, no GPU): first with hvd-mnist (C++, LibTorch), then with the Horovod-style PyTorch
# script examples/python/mnist.py on hvd.torch. Each fails unless validation accuracy ends above
# 0.96. Extra arguments go to hvd-mnist (--epochs, --seed, --device, ...; hvd-mnist --help).
#
# It also makes `import hvd.torch` work for the interpreter hvd.torch was built for (Debian's
# /usr/bin/python3) from the build tree, as `pip install -e` would: a .pth file in that
# interpreter's site-packages names build/python.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build --target hvdrun hvd-info hvd-backend-gloo hvd-mnist hvd_python
./scripts/make-mnist.sh

python=$(sed -n 's/^HVD_PYTHON_BUILT_FOR:INTERNAL=//p' build/CMakeCache.txt)
site=$("$python" -c 'import site; print(site.getsitepackages()[0])')
mkdir -p "$site"
echo "$PWD/build/python" > "$site/hvd-build-tree.pth"
echo "demo: 'import hvd.torch' works in $python (hvd.torch from $PWD/build/python, named by $site/hvd-build-tree.pth)"

echo
build/bin/hvd-info
echo
echo "+ build/bin/hvdrun -np 2 build/bin/hvd-mnist --min-accuracy 0.96 $*"
build/bin/hvdrun -np 2 build/bin/hvd-mnist --min-accuracy 0.96 "$@"
echo
echo "+ build/bin/hvdrun -np 2 $python examples/python/mnist.py --min-accuracy 0.96"
build/bin/hvdrun -np 2 "$python" examples/python/mnist.py --min-accuracy 0.96
