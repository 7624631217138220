#!/usr/bin/env bash
# The rendezvous store under attack, with the figures measured (not part of CI: about a minute).
# Builds hvd-store-attack (tests/stress/store_attack.cpp) and runs it: the store, in a process of
# its own, takes 100,000 connect/close cycles, 500 concurrent unauthenticated connections each
# announcing a 1 GiB frame, 500 that send half a hello and stop, and a server with only 256
# descriptors flooded past them, while a real rank keeps joining (connect with the secret, one set,
# one get). It passes when the server survives, its RSS grows by less than 64 MiB and every join
# takes under 1 s; it prints cycles/s, RSS before and after, and the slowest join.
#
#   scripts/store-attack.sh                          the goals above
#   scripts/store-attack.sh --cycles 20000 --threads 4 --flood 1000
#   HVD_BUILD_DIR=build-store scripts/store-attack.sh    another build directory (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."

build=${HVD_BUILD_DIR:-build}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$build" --target hvd-store-attack
# The server's rate-limited warnings go to stderr; the figures to stdout.
exec "$build/bin/hvd-store-attack" "$@"
