# netns-hosts.sh — several "hosts" on one machine, for tests and benchmarks (source it; root).
#
#   source scripts/netns-hosts.sh
#   netns_hosts_up 3 [RATE]     # hosts a, b, c on a private subnet; RATE ("1gbit") caps each
#                               # host's link with a tbf qdisc
#   ip netns exec "$(netns_host a)" mpirun --hostfile "$NETNS_HOSTFILE" $NETNS_MPI_ARGS ...
#   netns_hosts_down            # also run from the EXIT trap netns_hosts_up installs
#
# Each host is a network namespace with one veth into a bridge that lives in a "switch"
# namespace; the subnet exists only inside them. NETNS_HOSTFILE lists the hosts (2 slots each)
# and NETNS_MPI_ARGS makes mpirun reach them through `ip netns exec` instead of ssh.
# netns_hosts_up returns 77 with a reason on stderr where namespaces cannot be made.

NETNS_TAG="h$$"  # unique per run: parallel runs never share namespaces
NETNS_SUBNET=10.213.$(($$ % 200 + 20))
NETNS_HOSTS=()
NETNS_WORK=""

netns_host() { echo "$NETNS_TAG$1"; }

netns_hosts_down() {
  local h
  for h in "${NETNS_HOSTS[@]}" sw; do ip netns del "$NETNS_TAG$h" 2>/dev/null || true; done
  [ -n "$NETNS_WORK" ] && rm -rf "$NETNS_WORK"
  NETNS_HOSTS=()
}

netns_hosts_up() {
  local count=$1 rate=${2:-} names=(a b c d e f g h) i h ns
  [ "$(id -u)" -eq 0 ] || { echo "network namespaces need root" >&2; return 77; }
  command -v ip >/dev/null || { echo "iproute2 (ip) is not installed" >&2; return 77; }
  command -v unshare >/dev/null && command -v hostname >/dev/null ||
    { echo "unshare (util-linux) or hostname is not installed" >&2; return 77; }
  if [ -n "$rate" ] && ! command -v tc >/dev/null; then
    echo "tc (iproute2) is not installed" >&2
    return 77
  fi
  NETNS_WORK=$(mktemp -d)
  NETNS_HOSTFILE=$NETNS_WORK/hostfile
  trap netns_hosts_down EXIT
  ip netns add "${NETNS_TAG}sw" 2>/dev/null || {
    echo "cannot create network namespaces here" >&2
    return 77
  }
  ip -n "${NETNS_TAG}sw" link add br0 type bridge
  ip -n "${NETNS_TAG}sw" link set br0 up
  for ((i = 1; i <= count; i++)); do
    h=${names[$((i - 1))]}
    ns=$NETNS_TAG$h
    NETNS_HOSTS+=("$h")
    ip netns add "$ns"
    ip link add "v$ns" netns "$ns" type veth peer name "p$h" netns "${NETNS_TAG}sw"
    ip -n "${NETNS_TAG}sw" link set "p$h" master br0 up
    ip -n "$ns" addr add "$NETNS_SUBNET.$i/24" dev "v$ns"
    ip -n "$ns" link set "v$ns" up
    ip -n "$ns" link set lo up
    if [ -n "$rate" ]; then
      ip netns exec "$ns" tc qdisc add dev "v$ns" root tbf rate "$rate" burst 256kb latency 50ms
    fi
    echo "$NETNS_SUBNET.$i slots=2" >>"$NETNS_HOSTFILE"
  done

  # Wait until the bridge forwards on every port (state 3), or the first connections get lost.
  local ready
  for _ in $(seq 50); do
    ready=0
    for h in "${NETNS_HOSTS[@]}"; do
      [ "$(ip netns exec "${NETNS_TAG}sw" cat "/sys/class/net/p$h/brport/state" 2>/dev/null)" = 3 ] &&
        ready=$((ready + 1))
    done
    [ "$ready" -eq "$count" ] && break
    sleep 0.1
  done

  # mpirun reaches each "host" through this agent instead of ssh: it enters the namespace that
  # owns the address and runs the command there.
  {
    echo '#!/bin/sh'
    echo 'host=$1; shift'
    echo 'case "$host" in'
    for ((i = 1; i <= count; i++)); do
      echo "  $NETNS_SUBNET.$i) ns=$NETNS_TAG${names[$((i - 1))]} ;;"
    done
    echo '  *) echo "agent: unknown host $host" >&2; exit 1 ;;'
    echo 'esac'
    # A host of its own name too (a UTS namespace): Open MPI names its shared-memory segments
    # after the host name and local rank, so two "hosts" of one name would share them and crash.
    # mpirun's command may be a list ("PATH=...; export PATH; ...; orted ..."): stop it whole.
    echo 'exec ip netns exec "$ns" unshare --uts sh -c "hostname $ns || exit 1; $*"'
  } >"$NETNS_WORK/agent"
  chmod +x "$NETNS_WORK/agent"
  # rtc_hwloc_vmhole=none: several Open MPI daemons on one machine otherwise race to map the
  # shared hwloc topology at the same address, and one occasionally crashes in
  # hwloc_shmem_topology_write (Open MPI 4.1.4).
  NETNS_MPI_ARGS="--mca plm_rsh_agent $NETNS_WORK/agent --mca oob_tcp_if_include \
$NETNS_SUBNET.0/24 --mca btl_tcp_if_include $NETNS_SUBNET.0/24 --mca btl tcp,vader,self --map-by node \
--mca rtc_hwloc_vmhole none"
  # Every "host" has 2 slots but all of them share this machine's cores. Where those are fewer
  # than the slots, Open MPI would yield a waiting rank's CPU if it knew (it does so by itself
  # when it sees more ranks than slots); told nothing, its ranks spin in every wait and starve
  # the others and the kernel's TCP work.
  if [ "$(nproc)" -lt $((2 * count)) ]; then
    NETNS_MPI_ARGS="$NETNS_MPI_ARGS --mca mpi_yield_when_idle 1"
  fi
  # Sanitizer settings (scripts/test.sh) must reach ranks on the other "hosts" too.
  local v
  for v in ASAN_OPTIONS LSAN_OPTIONS TSAN_OPTIONS OMPI_MCA_mca_base_component_disable_dlclose; do
    if [ -n "${!v:-}" ]; then NETNS_MPI_ARGS="$NETNS_MPI_ARGS -x $v"; fi
  done
}
