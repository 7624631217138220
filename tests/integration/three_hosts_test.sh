#!/usr/bin/env bash
# Three "hosts" on one machine (scripts/netns-hosts.sh), each host's link capped at 1 Gbit/s:
# runs the conformance suite across them with the MPI backend (mpirun), and with each backend
# named (hvdrun --hostfile, which launches through mpirun; ofi must pick tcp;ofi_rxm), then
# removes everything it made. Exits 77 (skipped) with the reason where
# namespaces cannot be made.
#
#   three_hosts_test.sh <hvdrun> <hvd_conformance_test> <backend>...   (gloo, ofi: through hvdrun)
set -euo pipefail
hvdrun=$1
conformance=$2
here=$(cd "$(dirname "$0")" && pwd)

command -v mpirun >/dev/null || { echo "SKIPPED: Open MPI (mpirun) is not installed"; exit 77; }
# shellcheck source=../../scripts/netns-hosts.sh
source "$here/../../scripts/netns-hosts.sh"
netns_hosts_up 3 1gbit || { echo "SKIPPED: see above"; exit 77; }
a=$(netns_host a)

echo "== mpi backend across 3 hosts (mpirun)"
# shellcheck disable=SC2086
ip netns exec "$a" mpirun --allow-run-as-root --hostfile "$NETNS_HOSTFILE" -np 3 $NETNS_MPI_ARGS \
  -x HVD_BACKEND=mpi "$conformance" --gtest_brief=1 | tee "$NETNS_WORK/mpi.log"
[ "$(grep -c 'PASSED' "$NETNS_WORK/mpi.log")" -eq 3 ] || { echo "mpi: not every rank passed"; exit 1; }

for backend in "${@:3}"; do
  echo "== $backend backend across 3 hosts (hvdrun --hostfile)"
  ip netns exec "$a" env HVD_LOG_LEVEL=info "$hvdrun" -np 3 --hostfile "$NETNS_HOSTFILE" \
    --backend "$backend" --verbose --mpi-args "$NETNS_MPI_ARGS -x HVD_LOG_LEVEL" "$conformance" \
    --gtest_brief=1 2>&1 | tee "$NETNS_WORK/$backend.log"
  [ "$(grep -c 'PASSED' "$NETNS_WORK/$backend.log")" -eq 3 ] ||
    { echo "$backend: not every rank passed"; exit 1; }
done
if [[ " ${*:3} " == *" ofi "* ]]; then
  grep -q "ofi: provider tcp;ofi_rxm" "$NETNS_WORK/ofi.log" ||
    { echo "ofi: not on tcp;ofi_rxm, its default across hosts"; exit 1; }
fi
echo "three hosts at 1 Gbit/s: mpi and ${*:3} conformance passed on every rank"
