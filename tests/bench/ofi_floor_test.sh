#!/usr/bin/env bash
# hvd-ofi-floor as bench/ofi_bench.sh runs it, briefly: 2 ranks, its six figures present and
# positive, the sums of the exchange and of hvd on ofi checked by the program itself; a third rank
# is refused with the reason.
#
#   ofi_floor_test.sh MPIRUN HVD_OFI_FLOOR
set -euo pipefail
mpirun=$1 floor=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
out=$("$mpirun" --allow-run-as-root --oversubscribe -np 2 "$floor" -n 2000 -w 100 2>&1) ||
  fail "hvd-ofi-floor failed: $out"
echo "$out"
for key in libfabric_exchange_p50_us hvd_ofi_p50_us MPI_Allreduce_p50_us exchange_over_MPI_Allreduce \
           hvd_ofi_over_exchange hvd_ofi_over_MPI_Allreduce; do
  echo "$out" | grep -Eq "^$key [0-9]+\.[0-9]+$" || fail "no positive '$key' line"
  echo "$out" | grep -Eq "^$key 0\.000$" && fail "'$key' is zero"
done
if out=$("$mpirun" --allow-run-as-root --oversubscribe -np 3 "$floor" -n 10 2>&1); then
  fail "3 ranks were not refused"
fi
echo "$out" | grep -q "run 2 ranks" || fail "3 ranks refused without the reason: $out"
echo "PASS"
