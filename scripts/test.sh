#!/usr/bin/env bash
# Install, build with warnings as errors, and run every test; then rebuild with AddressSanitizer
# and UBSan and run every test again; then with ThreadSanitizer and run the unit, integration and
# 2-rank conformance tests. Exit status is non-zero if anything fails.
#
#   scripts/test.sh            everything
#   HVD_TEST_SKIP_SANITIZERS=1 scripts/test.sh   the normal build only
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh
jobs=$(nproc)

echo "== build (warnings are errors)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHVD_WERROR=ON
cmake --build build -j "$jobs"
echo "== test"
(cd build && ctest -j "$jobs" --output-on-failure --timeout 900)

if [ "${HVD_TEST_SKIP_SANITIZERS:-0}" != 1 ]; then
  echo "== build with AddressSanitizer + UBSan"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DHVD_WERROR=ON \
        -DHVD_SANITIZE=address,undefined
  cmake --build build-asan -j "$jobs"
  echo "== test under AddressSanitizer + UBSan"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest -j "$jobs" --output-on-failure --timeout 900)

  echo "== build with ThreadSanitizer"
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DHVD_WERROR=ON -DHVD_SANITIZE=thread
  cmake --build build-tsan -j "$jobs"
  echo "== test under ThreadSanitizer"
  # Not MPI: uninstrumented Open MPI reports a lock-order inversion inside its own btl_tcp.
  (cd build-tsan && ctest -j "$jobs" --output-on-failure --timeout 900 \
                          -R '^(unit|integration)\.|^conformance\.(gloo|kvs)\.np2$')
fi
