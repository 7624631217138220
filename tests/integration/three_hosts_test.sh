#!/usr/bin/env bash
# Three "hosts" on one machine: network namespaces joined by a bridge on a private test subnet
# that exists only inside them. Runs the conformance suite across them with the MPI backend
# (mpirun) and with the Gloo backend (hvdrun --hostfile, which launches through mpirun), then
# removes everything it made. Exits 77 (skipped) with the reason where namespaces cannot be made.
#
#   three_hosts_test.sh <hvdrun> <hvd_conformance_test>
set -euo pipefail
hvdrun=$1
conformance=$2

skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "network namespaces need root"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
command -v mpirun >/dev/null || skip "Open MPI (mpirun) is not installed"

tag="h$$"                     # unique per run: parallel runs never share namespaces
subnet=10.213.$(( $$ % 200 + 20 ))
hosts=(a b c)
work=$(mktemp -d)
cleanup() {
  for h in "${hosts[@]}" sw; do ip netns del "$tag$h" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

ip netns add "${tag}sw" 2>/dev/null || skip "cannot create network namespaces here"
ip -n "${tag}sw" link add br0 type bridge
ip -n "${tag}sw" link set br0 up
i=1
for h in "${hosts[@]}"; do
  ns="$tag$h"
  ip netns add "$ns"
  ip link add "v$tag$h" netns "$ns" type veth peer name "p$h" netns "${tag}sw"
  ip -n "${tag}sw" link set "p$h" master br0 up
  ip -n "$ns" addr add "$subnet.$i/24" dev "v$tag$h"
  ip -n "$ns" link set "v$tag$h" up
  ip -n "$ns" link set lo up
  echo "$subnet.$i slots=2" >>"$work/hostfile"
  i=$((i + 1))
done

# Wait until the bridge forwards on every port (state 3), or the first connections get lost.
for _ in $(seq 50); do
  ready=0
  for h in "${hosts[@]}"; do
    [ "$(ip netns exec "${tag}sw" cat "/sys/class/net/p$h/brport/state" 2>/dev/null)" = 3 ] && ready=$((ready + 1))
  done
  [ "$ready" -eq ${#hosts[@]} ] && break
  sleep 0.1
done

# mpirun reaches each "host" through this agent instead of ssh: it enters the namespace that
# owns the address and runs the command there.
cat >"$work/agent" <<AGENT
#!/bin/sh
host=\$1; shift
case "\$host" in
  $subnet.1) ns=${tag}a ;; $subnet.2) ns=${tag}b ;; $subnet.3) ns=${tag}c ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" sh -c "\$*"
AGENT
chmod +x "$work/agent"
# rtc_hwloc_vmhole=none: several Open MPI daemons on one machine otherwise race to map the
# shared hwloc topology at the same address, and one occasionally crashes in
# hwloc_shmem_topology_write (Open MPI 4.1.4).
mpi_args="--mca plm_rsh_agent $work/agent --mca oob_tcp_if_include $subnet.0/24 \
--mca btl_tcp_if_include $subnet.0/24 --mca btl tcp,self --map-by node --mca rtc_hwloc_vmhole none"
# Sanitizer settings (scripts/test.sh) must reach ranks on the other "hosts" too.
for v in ASAN_OPTIONS LSAN_OPTIONS TSAN_OPTIONS OMPI_MCA_mca_base_component_disable_dlclose; do
  if [ -n "${!v:-}" ]; then mpi_args="$mpi_args -x $v"; fi
done

echo "== mpi backend across 3 hosts (mpirun)"
# shellcheck disable=SC2086
ip netns exec "${tag}a" mpirun --allow-run-as-root --hostfile "$work/hostfile" -np 3 $mpi_args \
  -x HVD_BACKEND=mpi "$conformance" --gtest_brief=1 | tee "$work/mpi.log"
[ "$(grep -c 'PASSED' "$work/mpi.log")" -eq 3 ] || { echo "mpi: not every rank passed"; exit 1; }

echo "== gloo backend across 3 hosts (hvdrun --hostfile)"
ip netns exec "${tag}a" "$hvdrun" -np 3 --hostfile "$work/hostfile" --backend gloo --verbose \
  --mpi-args "$mpi_args" "$conformance" --gtest_brief=1 | tee "$work/gloo.log"
[ "$(grep -c 'PASSED' "$work/gloo.log")" -eq 3 ] || { echo "gloo: not every rank passed"; exit 1; }
echo "three hosts: mpi and gloo conformance passed on every rank"
