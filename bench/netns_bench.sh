#!/usr/bin/env bash
# hvd-bench across "hosts" made of network namespaces on this machine (scripts/netns-hosts.sh),
# optionally with each host's link capped by a tbf qdisc: the figures of docs/performance.md.
#
#   bench/netns_bench.sh [--bin DIR] [--hosts N] [--rate 1gbit] -- [hvd-bench arguments]
#   bench/netns_bench.sh --rate 1gbit -- --backend all --baseline -b 8 -e 64M -f 4 -J 1gbit.json
#
# One rank per host. Needs root. --bin is where hvdrun and hvd-bench are (default: build/bin).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/build/bin
hosts=2
rate=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "netns_bench: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
# shellcheck source=../scripts/netns-hosts.sh
source "$root/scripts/netns-hosts.sh"
netns_hosts_up "$hosts" "$rate"
echo "# $hosts hosts (network namespaces) on $NETNS_SUBNET.0/24${rate:+, each link capped at $rate (tbf)}"
# The JSON path (-J) is relative to where this script was started, not the namespace.
args=()
while [ $# -gt 0 ]; do
  if [ "$1" = -J ] && [ $# -ge 2 ]; then
    args+=(-J "$(cd "$(dirname "$2")" && pwd)/$(basename "$2")")
    shift 2
  else
    args+=("$1")
    shift
  fi
done
ip netns exec "$(netns_host a)" "$bin/hvdrun" -np "$hosts" --hostfile "$NETNS_HOSTFILE" \
  --mpi-args "$NETNS_MPI_ARGS" -- "$bin/hvd-bench" "${args[@]}"
