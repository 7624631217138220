#!/usr/bin/env bash
# Three "hosts" on one machine (scripts/netns-hosts.sh), each host's link capped at 1 Gbit/s:
# runs the conformance suite across them with the MPI backend (mpirun) and with the Gloo backend
# (hvdrun --hostfile, which launches through mpirun), then removes everything it made. Exits 77 (skipped) with the reason where
# namespaces cannot be made.
#
#   three_hosts_test.sh <hvdrun> <hvd_conformance_test>
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

echo "== gloo backend across 3 hosts (hvdrun --hostfile)"
ip netns exec "$a" "$hvdrun" -np 3 --hostfile "$NETNS_HOSTFILE" --backend gloo --verbose \
  --mpi-args "$NETNS_MPI_ARGS" "$conformance" --gtest_brief=1 | tee "$NETNS_WORK/gloo.log"
[ "$(grep -c 'PASSED' "$NETNS_WORK/gloo.log")" -eq 3 ] || { echo "gloo: not every rank passed"; exit 1; }
echo "three hosts at 1 Gbit/s: mpi and gloo conformance passed on every rank"
