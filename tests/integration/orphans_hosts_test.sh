#!/usr/bin/env bash
# hvdrun's death across three "hosts" (network namespaces, scripts/netns-hosts.sh): a job that
# hvdrun hands to mpirun (--hostfile) runs its ranks under mpirun on the first host and under
# Open MPI's daemons on the others. SIGKILL hvdrun, and every rank on every host, every daemon and
# mpirun must be gone within the bound (hvd_kill_job checks and times it). Exits 77 (skipped)
# with the reason where namespaces cannot be made.
#
#   orphans_hosts_test.sh HVDRUN HVD_KILL_JOB HVD_PROBE
set -euo pipefail
hvdrun=$1 kill_job=$2 probe=$3
here=$(cd "$(dirname "$0")" && pwd)

command -v mpirun >/dev/null || { echo "SKIPPED: Open MPI (mpirun) is not installed"; exit 77; }
# shellcheck source=../../scripts/netns-hosts.sh
source "$here/../../scripts/netns-hosts.sh"
netns_hosts_up 3 || { echo "SKIPPED: see above"; exit 77; }

ip netns exec "$(netns_host a)" "$kill_job" --hvdrun "$hvdrun" --np 3 --within 10 \
  --hvdrun-arg --hostfile --hvdrun-arg "$NETNS_HOSTFILE" \
  --hvdrun-arg --mpi-args --hvdrun-arg "$NETNS_MPI_ARGS" \
  --ready "allreduce = 6" -- "$probe" --allreduce --hang
