#!/usr/bin/env bash
# docs/training.md's figures for hvd-mnist on CPU, one thread per rank: at 1 rank the cost of hvd
# (DistributedOptimizer against the bare optimizer, in the same run); at 2 ranks the same ratio
# (bare = no gradient exchange at all), the scaling efficiency against 1 rank, and the share of
# the allreduce time hidden behind the backward pass (from rank 0's timeline).
#
#   bench/train_bench.sh [STEPS]     (default 150 steps of each kind per run; needs jq)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-150}
bin=build/bin
[ -x "$bin/hvd-mnist" ] || { echo "build hvd-mnist first (cmake --build build)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# rate KIND FILE: the samples/s of "bare" or "hvd" in a --compare-bare log
rate() { sed -n "s/.*$1: \([0-9.]*\) samples\/s.*/\1/p" "$2"; }

run() {  # run NAME NP [ENV...]: a --compare-bare run, rank 0's lines kept in $work/NAME.log
  local name=$1 np=$2
  shift 2
  echo "+ $* hvdrun -np $np hvd-mnist --threads 1 --compare-bare $steps"
  env "$@" "$bin/hvdrun" -np "$np" "$bin/hvd-mnist" --threads 1 --compare-bare "$steps" |
    grep '^\[0\]' | sed 's/^\[0\]<stdout>://' | tee "$work/$name.log"
}
run np1 1
run np2 2
# The timeline's writer thread costs CPU that two ranks on two cores do not have to spare, so
# the overlap is measured in a run of its own.
run timeline 2 HVD_TIMELINE="$work/timeline.json"

bare1=$(rate bare "$work/np1.log") hvd1=$(rate hvd "$work/np1.log")
bare2=$(rate bare "$work/np2.log") hvd2=$(rate hvd "$work/np2.log")
exposed=$(sed -n 's/.*waited \([0-9.]*\) ms per hvd step.*/\1/p' "$work/timeline.log")
# The fused allreduces of the gradients (grad.*) on rank 0: each fusion buffer's ALLREDUCE span
# appears once per tensor in it, with the same start; the hvd steps are the timed ones and 5
# warmup steps.
busy=$(jq --argjson steps "$((steps + 5))" '
  (map(select(.ph == "M")) | map({key: (.tid | tostring), value: .args.name}) | from_entries)
    as $names
  | map(select(.ph == "X" and .name == "ALLREDUCE"
               and (($names[.tid | tostring] // "") | startswith("grad."))))
  | unique_by(.ts) | map(.dur) | add / 1000 / $steps' "$work/timeline.json")

echo
awk -v b1="$bare1" -v h1="$hvd1" -v b2="$bare2" -v h2="$hvd2" -v e="$exposed" -v busy="$busy" '
BEGIN {
  printf "1 rank:  hvd/bare %.3f (the cost of hvd: %+.1f%%)\n", h1 / b1, 100 * (h1 / b1 - 1)
  printf "2 ranks: hvd/bare %.3f in the same run; bare 2 ranks / (2 x bare 1 rank) %.3f\n", h2 / b2, b2 / (2 * b1)
  printf "scaling efficiency: hvd 2 ranks / (2 x bare 1 rank) = %.3f (runs one after another)\n", h2 / (2 * b1)
  printf "with the timeline on: allreduces busy %.2f ms per step, rank 0 waited %.2f ms after backward: %.0f%% hidden\n", busy, e, 100 * (1 - e / busy)
}'
