#!/usr/bin/env bash
# Runs the fault suite (tests/faults) on every backend at 3 ranks (a hierarchical allreduce at 4)
# and prints each fault's slowest rank: the figures of docs/reliability.md. Needs a build
# (scripts/test.sh or the README's build command); about two minutes.
#
#   scripts/reliability.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bin=$build/bin
plugins=$build/tests/plugins
log=$(mktemp)
trap 'rm -f "$log"' EXIT

run() {  # backend, command...
  local backend=$1
  shift
  echo "== $backend" >&2
  # The verdict is each rank's (mpirun exits non-zero after the mpi plugin skips MPI_Finalize).
  "$@" --gtest_brief=1 --gtest_color=no >"$log.$backend" 2>&1 || true
  grep '\[measured\]' "$log.$backend" >>"$log" || true
  if grep -E '^\[  FAILED  \]|Failure' "$log.$backend" >&2; then echo "$backend: FAILED" >&2; fi
  rm -f "$log.$backend"
}

run gloo "$bin/hvdrun" -np 3 --backend gloo --timeout 120 -- "$bin/hvd_faults_test"
run kvs "$bin/hvdrun" -np 3 --backend kvs --plugin-path "$plugins" --timeout 120 -- \
  "$bin/hvd_faults_test"
run kvs10 "$bin/hvdrun" -np 3 --backend kvs10 --plugin-path "$plugins" --timeout 120 -- \
  "$bin/hvd_faults_test"
# A hierarchical allreduce needs two hosts of two: four ranks, their host names faked.
run kvs-hierarchical "$bin/hvdrun" -np 4 --backend kvs --plugin-path "$plugins" --timeout 120 -- \
  tests/integration/fake_hosts.sh 2 "$bin/hvd_faults_test" \
  --gtest_filter=Faults.AHierarchicalAllreduceIsBoundedAsAWhole
if [ -e "$build/lib/hvd/libhvd-backend-ofi.so" ]; then
  run ofi "$bin/hvdrun" -np 3 --backend ofi --timeout 120 -- "$bin/hvd_faults_test"
fi
if command -v mpirun >/dev/null && [ -e "$build/lib/hvd/libhvd-backend-mpi.so" ]; then
  run mpi mpirun --allow-run-as-root --oversubscribe -np 3 -x HVD_BACKEND=mpi \
    "$bin/hvd_faults_test"
fi

echo
printf '%-8s %-70s %s\n' backend test "slowest rank"
sed -E 's/.*backend=([^ ]+) ranks=[0-9]+ rank=[0-9]+ test=([^ ]+) ([a-z]+)=([0-9.]+) s/\1 \2 \3 \4/' "$log" |
  sort -k1,1 -k2,2 -k4,4gr | awk '!seen[$1 " " $2 " " $3]++ { printf "%-8s %-70s %s %s s\n", $1, $2, $3, $4 }'
