#!/usr/bin/env bash
# Two network namespaces of one machine are two hosts to hvd, though they share the host name:
# four ranks started by hand (HVD_RANK and HVD_SIZE only, no launcher to say who is local), two
# in each namespace, find local ranks 0, 1 and 0, 1 of 2, and allreduce across both over Gloo.
# With HVD_HOSTNAME set alike everywhere, the same ranks are one host of 4. Exits 77 (skipped)
# with the reason where namespaces cannot be made.
#
#   host_identity_test.sh <hvd_probe>
set -euo pipefail
probe=$1
here=$(cd "$(dirname "$0")" && pwd)

# shellcheck source=../../scripts/netns-hosts.sh
source "$here/../../scripts/netns-hosts.sh"
netns_hosts_up 2 || { echo "SKIPPED: see above"; exit 77; }
a=$(netns_host a)
b=$(netns_host b)
name_a=$(ip netns exec "$a" hostname)
name_b=$(ip netns exec "$b" hostname)
[ "$name_a" = "$name_b" ] || { echo "FAIL: the namespaces' host names differ ($name_a, $name_b)"; exit 1; }

# run <label> <extra env...>: ranks 0, 1 in namespace a, 2, 3 in b; rank 0 serves the rendezvous.
run() {
  local label=$1 port=$((20000 + RANDOM % 20000)) pids=() r ns
  shift
  for r in 0 1 2 3; do
    ns=$a
    [ "$r" -ge 2 ] && ns=$b
    ip netns exec "$ns" env -u HVD_LOCAL_RANK -u HVD_LOCAL_SIZE "$@" HVD_RANK=$r HVD_SIZE=4 \
      HVD_RENDEZVOUS_ADDR="$NETNS_SUBNET.1:$port" HVD_SECRET=s3cret HVD_BACKEND=gloo \
      HVD_TIMEOUT=30 "$probe" --print-local --allreduce >"$NETNS_WORK/$label.$r" 2>&1 &
    pids+=($!)
  done
  for r in 0 1 2 3; do
    wait "${pids[$r]}" || { echo "FAIL ($label): rank $r failed:"; cat "$NETNS_WORK/$label.$r"; exit 1; }
  done
  cat "$NETNS_WORK/$label".*
}

expect() {  # expect <label> <rank> <text>
  grep -qx "rank $2: $3" "$NETNS_WORK/$1.$2" ||
    { echo "FAIL ($1): rank $2 did not print '$3':"; cat "$NETNS_WORK/$1.$2"; exit 1; }
}

echo "== host name '$name_a' in both namespaces"
run split
for r in 0 1 2 3; do
  expect split "$r" "local rank $((r % 2)) of 2"
  expect split "$r" "allreduce = 10"
done
echo "== HVD_HOSTNAME=one everywhere"
run together HVD_HOSTNAME=one
for r in 0 1 2 3; do expect together "$r" "local rank $r of 4"; done
echo "two namespaces are two hosts; HVD_HOSTNAME makes them one"
