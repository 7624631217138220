#!/usr/bin/env bash
# HVD_TIMELINE: the scheduler job at 2 ranks writes a Chrome trace that parses, with a track per
# tensor and the spans Horovod's timeline has.
#
#   timeline_test.sh HVDRUN HVD_SCHEDULER_JOB
set -euo pipefail
hvdrun=$1 job=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v jq >/dev/null || fail "jq is missing (scripts/install-deps.sh installs it)"

HVD_TIMELINE="$work/timeline.json" HVD_TIMELINE_MARK_CYCLES=1 \
  "$hvdrun" -np 2 --backend gloo -- "$job" --tensors 40 --rounds 2
jq -e 'type == "array" and length > 0' "$work/timeline.json" >/dev/null || fail "not a JSON array"
for span in NEGOTIATE QUEUE ALLREDUCE ALLGATHER BROADCAST MEMCPY_IN_FUSION_BUFFER \
            MEMCPY_OUT_FUSION_BUFFER CYCLE; do
  jq -e --arg s "$span" '[.[] | select(.name == $s)] | length > 0' "$work/timeline.json" \
    >/dev/null || fail "no $span events"
done
jq -e '[.[] | select(.ph == "M" and .args.name == "t0")] | length == 1' "$work/timeline.json" \
  >/dev/null || fail "tensor t0 has no track of its own"
jq -e '[.[] | select(.ph == "X") | .dur >= 0 and .ts >= 0] | all' "$work/timeline.json" \
  >/dev/null || fail "a span has a negative time"
echo "PASS: $(jq length "$work/timeline.json") events"
