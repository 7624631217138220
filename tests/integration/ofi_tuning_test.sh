#!/usr/bin/env bash
# The ofi backend's ring segments: 256 KiB on shm, 1 MiB over a network provider (tcp;ofi_rxm),
# HVD_OFI_SEGMENT_BYTES over either; over ofi_rxm its eager limit follows the segments unless
# FI_OFI_RXM_EAGER_LIMIT is set. What rank 0's init log says, and what rxm itself says it uses,
# from 2-rank jobs that pass.
#
#   ofi_tuning_test.sh HVDRUN HELLO_ALLREDUCE
set -euo pipefail
hvdrun=$1 hello=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

log=""
run_job() {  # the job's log in $log, after checking that the job passed
  log=$(env -u HVD_OFI_PROVIDER -u HVD_OFI_SEGMENT_BYTES -u FI_OFI_RXM_EAGER_LIMIT \
    -u FI_OFI_RXM_BUFFER_SIZE \
    HVD_LOG_LEVEL=info FI_LOG_LEVEL=info FI_LOG_PROV=ofi_rxm "$@" \
    "$hvdrun" -np 2 --backend ofi --timeout 60 -- "$hello" 2>&1) ||
    { echo "$log" >&2; fail "the job failed ($*)"; }
}
init_line() { echo "$log" | grep -o "ofi: provider .*" | head -1 || true; }
# rxm's own account, once per endpoint: "Protocol limits: Eager: N, SAR: N"
rxm_eager() { echo "$log" | grep -o "Protocol limits: Eager: [0-9]*" | sort -u | tr '\n' ' '; }

run_job
[[ "$(init_line)" == "ofi: provider shm "*"ring segments of 262144 B" ]] || fail "shm: '$(init_line)'"
run_job "HVD_OFI_PROVIDER=tcp;ofi_rxm"
[[ "$(init_line)" == "ofi: provider tcp;ofi_rxm "*", eager limit 1048576 B, 2 ranks, ring segments of 1048576 B" ]] ||
  fail "tcp: '$(init_line)'"
[[ "$(rxm_eager)" == "Protocol limits: Eager: 1048576 " ]] || fail "tcp, rxm says: '$(rxm_eager)'"
run_job "HVD_OFI_PROVIDER=tcp;ofi_rxm" HVD_OFI_SEGMENT_BYTES=65536
[[ "$(init_line)" == *", eager limit 65536 B, 2 ranks, ring segments of 65536 B" ]] ||
  fail "HVD_OFI_SEGMENT_BYTES on tcp: '$(init_line)'"
[[ "$(rxm_eager)" == "Protocol limits: Eager: 65536 " ]] || fail "65536 on tcp, rxm says: '$(rxm_eager)'"
run_job "HVD_OFI_PROVIDER=tcp;ofi_rxm" FI_OFI_RXM_EAGER_LIMIT=32768
[[ "$(init_line)" == *", eager limit 32768 B, 2 ranks, ring segments of 1048576 B" ]] ||
  fail "the user's FI_OFI_RXM_EAGER_LIMIT: '$(init_line)'"
[[ "$(rxm_eager)" == "Protocol limits: Eager: 32768 " ]] || fail "the user's limit, rxm says: '$(rxm_eager)'"
# Ranks whose limits differ: rxm would refuse their connections and every send wait for the
# timeout; hvd_init fails at once on every rank, naming the limits. Each rank lingers after its
# error, so that the launcher, which stops the others when one fails, lets them all report.
log=$(env -u HVD_OFI_SEGMENT_BYTES -u FI_OFI_RXM_EAGER_LIMIT -u FI_OFI_RXM_BUFFER_SIZE \
  "HVD_OFI_PROVIDER=tcp;ofi_rxm" \
  "$hvdrun" -np 2 --backend ofi --timeout 10 -- sh -c \
  '[ "$HVD_RANK" = 1 ] && export FI_OFI_RXM_EAGER_LIMIT=32768; "$0"; s=$?; sleep 5; exit $s' \
  "$hello" 2>&1) &&
  { echo "$log" >&2; fail "ranks with different eager limits ran"; }
for rank in 0 1; do
  echo "$log" | grep -q "^\[$rank\]<stderr>:.*the ranks' ofi_rxm eager limits differ (rank 0 1048576 B, rank 1 32768 B)" ||
    { echo "$log" >&2; fail "rank $rank did not name the differing limits"; }
done
# The same limit spelled otherwise (libfabric reads sizes in any base) is the same limit.
log=$(env -u HVD_OFI_SEGMENT_BYTES -u FI_OFI_RXM_EAGER_LIMIT -u FI_OFI_RXM_BUFFER_SIZE \
  "HVD_OFI_PROVIDER=tcp;ofi_rxm" "$hvdrun" -np 2 --backend ofi --timeout 10 -- sh -c \
  '[ "$HVD_RANK" = 1 ] && export FI_OFI_RXM_EAGER_LIMIT=0x100000; exec "$0"' "$hello" 2>&1) ||
  { echo "$log" >&2; fail "1048576 and 0x100000 were taken for different limits"; }
run_job HVD_OFI_SEGMENT_BYTES=1048576
[[ "$(init_line)" == *"ring segments of 1048576 B" ]] || fail "HVD_OFI_SEGMENT_BYTES on shm: '$(init_line)'"
# Values the knobs cannot take fail init on every rank, naming the knob and its range: a negative
# one (which strtoull would wrap), one past the range, one that is not a number, segments too
# small to be worth a message (under 4 KiB).
for bad in HVD_OFI_SEGMENTS_IN_FLIGHT=-1 HVD_OFI_SEGMENTS_IN_FLIGHT=1025 HVD_OFI_SEGMENT_BYTES=-8 \
  HVD_OFI_SEGMENT_BYTES=8 \
  HVD_OFI_SEGMENT_BYTES=99999999999999999999 HVD_OFI_RING_ALLREDUCE_BYTES=64k; do
  log=$(env "$bad" HVD_OFI_PROVIDER=shm "$hvdrun" -np 2 --backend ofi --timeout 10 -- sh -c \
    '"$0"; s=$?; sleep 1; exit $s' "$hello" 2>&1) && { echo "$log" >&2; fail "$bad was taken"; }
  for rank in 0 1; do
    echo "$log" | grep -q "^\[$rank\]<stderr>:hvd init failed: invalid argument: .*ofi: ${bad%%=*}='${bad#*=}' is not a whole number from [0-9]* to [0-9]*$" ||
      { echo "$log" >&2; fail "rank $rank did not refuse $bad"; }
  done
done
# Ranks that differ where they must agree, or one rank that cannot open its endpoint: init fails
# on every rank at once, naming the setting and each rank's value, or the rank and its reason
# (the others would otherwise wait out the timeout for it, or meet messages they do not expect).
per_rank() {  # per_rank VAR VALUE_FOR_RANK_0 VALUE_FOR_RANK_1: the job's output
  env -u HVD_OFI_SEGMENT_BYTES -u HVD_OFI_PROVIDER "$hvdrun" -np 2 --backend ofi --timeout 20 -- \
    sh -c 'if [ "$HVD_RANK" = 0 ]; then export "$1=$2"; else export "$1=$3"; fi; shift 3
           "$0"; s=$?; sleep 1; exit $s' "$hello" "$@" 2>&1
}
check_both() {  # check_both LOG PATTERN WHAT
  for rank in 0 1; do
    echo "$1" | grep -q "^\[$rank\]<stderr>:hvd init failed: .*$2" ||
      { echo "$1" >&2; fail "rank $rank: $3"; }
  done
}
start=$SECONDS
log=$(per_rank HVD_OFI_SEGMENT_BYTES 1048576 65536) && { echo "$log" >&2; fail "differing segments ran"; }
check_both "$log" "ofi: the ranks' HVD_OFI_SEGMENT_BYTES differ (rank 0 1048576, rank 1 65536)" \
  "differing HVD_OFI_SEGMENT_BYTES not named"
log=$(per_rank HVD_OFI_RING_ALLREDUCE_BYTES 0 100000) && { echo "$log" >&2; fail "differing crossovers ran"; }
check_both "$log" "HVD_OFI_RING_ALLREDUCE_BYTES differ (rank 0 0, rank 1 100000)" \
  "differing HVD_OFI_RING_ALLREDUCE_BYTES not named"
log=$(per_rank HVD_OFI_PROVIDER shm bogus) && { echo "$log" >&2; fail "a bogus provider ran"; }
echo "$log" | grep -q "^\[0\]<stderr>:hvd init failed: .*ofi: rank 1 could not open its endpoint: ofi: libfabric has no provider 'bogus'" ||
  { echo "$log" >&2; fail "rank 0 did not name rank 1's bogus provider"; }
echo "$log" | grep -q "^\[1\]<stderr>:hvd init failed: .*ofi: libfabric has no provider 'bogus' .*; HVD_OFI_PROVIDER takes one of those it has: .*\bshm\b" ||
  { echo "$log" >&2; fail "rank 1 did not say its provider is bogus, listing the providers there are"; }
log=$(per_rank HVD_OFI_SEGMENTS_IN_FLIGHT 4 0) && { echo "$log" >&2; fail "a bad knob on one rank ran"; }
echo "$log" | grep -q "^\[0\]<stderr>:hvd init failed: .*ofi: rank 1 could not open its endpoint: ofi: HVD_OFI_SEGMENTS_IN_FLIGHT='0'" ||
  { echo "$log" >&2; fail "rank 0 did not name rank 1's bad knob"; }
[ $((SECONDS - start)) -lt 30 ] || fail "the four jobs took $((SECONDS - start)) s: a rank waited out its timeout"
echo "PASS: differing settings and one rank's failed endpoint named on every rank; bad knob values refused on every rank; shm 256 KiB; tcp;ofi_rxm 1 MiB with rxm's eager limit the same; HVD_OFI_SEGMENT_BYTES over both; the user's FI_OFI_RXM_EAGER_LIMIT kept; differing limits refused on every rank, equal ones in another base taken"
