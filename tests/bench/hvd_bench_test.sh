#!/usr/bin/env bash
# hvd-bench as a user runs it: a short job at 3 ranks, every collective, whose JSON must parse
# and report no wrong element, with the header's memory limits (and theirs at 1 rank); a process
# set of 2 of 3 ranks, the third waiting without spinning; --check-args' overhead columns; the
# same on a deliberately wrong backend, where the check must catch it; the plot.
#
#   hvd_bench_test.sh HVDRUN HVD_BENCH HVD_BENCH_PLOT TEST_PLUGIN_DIR [MPIRUN]
set -euo pipefail
hvdrun=$1 bench=$2 plot=$3 test_plugins=$4 mpirun=${5:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v jq >/dev/null || fail "jq is missing (scripts/install-deps.sh installs it)"

short=(-b 0 -e 64K -f 8 -n 2 -w 1 -C all -d float,int8,half -o sum,max)

echo "== sizes it cannot take are a usage error, never a size read loosely"
for bad in 16Q -8 +8 " 8" 8KK 0x10 20000000000G 18446744073709551616; do
  status=0
  "$bench" -b "$bad" -e 8 >/dev/null 2>"$work/size.txt" || status=$?
  [[ $status == 2 ]] && grep -qF -- "-b: '$bad' is not a size (8, 64K, 32M, 1G) of at most 2^64-1 bytes"     "$work/size.txt" || fail "-b '$bad': exit $status, $(cat "$work/size.txt")"
done

echo "== 3 ranks, every collective, with the baseline"
"$hvdrun" -np 3 --timeout 120 -- "$bench" --backend gloo --baseline "${short[@]}" -J "$work/gloo.json" \
  | tee "$work/gloo.txt"
jq -e . "$work/gloo.json" >/dev/null || fail "the JSON does not parse"
jq -e '.ranks == 3' "$work/gloo.json" >/dev/null || fail "ranks is not 3"
for c in allreduce allgather broadcast reduce_scatter alltoall; do
  jq -e --arg c "$c" '[.results[] | select(.collective == $c and .size == 0)] | length > 0' \
    "$work/gloo.json" >/dev/null || fail "no zero-size $c rows"
  jq -e --arg c "$c" '[.results[] | select(.collective == $c and .size > 30000)] | length > 0' \
    "$work/gloo.json" >/dev/null || fail "no 32 KiB $c rows"
done
# alltoall has no in-place form, so no in_place results.
jq -e '[.results[] | .out_of_place.nwrong, (select(.collective != "alltoall") | .in_place.nwrong)]
       | all(. == 0)' "$work/gloo.json" >/dev/null || fail "hvd-bench counted wrong elements on gloo"
jq -e '[.results[] | select(.collective == "alltoall") | has("in_place")] | any | not' \
  "$work/gloo.json" >/dev/null || fail "alltoall rows have an in-place result"
jq -e '[.results[] | select(.collective == "reduce_scatter" and .type == "float" and .size > 30000) |
        .count == .size / 4 and (.count % 3) == 0 and .ranks == 3] | all' "$work/gloo.json" \
  >/dev/null || fail "reduce_scatter's size is not the input of count x ranks floats"
jq -e '[.results[] | select(.direct.out_of_place) | .direct.ratio_out_of_place] | length > 0' \
  "$work/gloo.json" >/dev/null || fail "no baseline ratios in the JSON"
grep -q "Avg bus bandwidth" "$work/gloo.txt" || fail "no footer in the table"
# The header's memory limits: one thread alone, then every rank at once (one rank: alone only).
grep -Eq "#   memcpy [0-9.]+ GB/s per rank, the 3 ranks copying at once$" "$work/gloo.txt" ||
  fail "no all-ranks memcpy line in the header: $(head -8 "$work/gloo.txt")"
jq -e '.limits.memcpy_GBps > 0 and .limits.memcpy_all_ranks_GBps > 0' "$work/gloo.json" \
  >/dev/null || fail "limits: $(jq -c '.limits' "$work/gloo.json")"
printed=$(sed -nE 's/.*#   memcpy ([0-9.]+) GB\/s per rank.*/\1/p' "$work/gloo.txt")
awk -v p="$printed" -v j="$(jq '.limits.memcpy_all_ranks_GBps' "$work/gloo.json")" \
  'BEGIN {exit !(p - j < 0.006 && j - p < 0.006)}' ||
  fail "the header's all-ranks memcpy ($printed) is not the JSON's"
"$hvdrun" -np 1 --timeout 120 -- "$bench" --backend gloo -b 8 -e 8 -n 1 -w 0 -J "$work/one.json" \
  >"$work/one.txt"
jq -e '.limits.memcpy_GBps > 0 and .limits.memcpy_all_ranks_GBps == null' "$work/one.json" \
  >/dev/null || fail "1 rank's limits: $(jq -c '.limits' "$work/one.json")"
if grep -q "copying at once" "$work/one.txt"; then fail "an all-ranks memcpy line at 1 rank"; fi

echo "== --process-set: ranks 0 and 2 of 3 measure, rank 1 waits in a blocking read"
"$hvdrun" -np 3 --timeout 120 -- "$bench" --backend gloo --process-set 2,0 --baseline -b 8 -e 1M \
  -f 128 -n 3 -w 1 -C allreduce,alltoall -J "$work/set.json" >"$work/set.txt"
jq -e '.ranks == 3 and .process_set == [0, 2] and .idle.waiting == 1 and .idle.members == 2' \
  "$work/set.json" >/dev/null || fail "process set: $(jq -c '{ranks, process_set, idle}' "$work/set.json")"
jq -e '[.results[] | .ranks == 2 and .out_of_place.nwrong == 0 and
        (.direct.out_of_place.nwrong // 0) == 0] | all and length == 6' "$work/set.json" \
  >/dev/null || fail "process set results: $(jq -c '.results' "$work/set.json")"
# Spinning would take a core's share for the whole wait; a blocking read takes next to nothing.
jq -e '.idle.cpu_s <= 0.25 * .idle.wait_s + 0.05' "$work/set.json" >/dev/null ||
  fail "the waiting rank used CPU: $(jq -c '.idle' "$work/set.json")"
grep -q "on a process set of 2 ranks" "$work/set.txt" || fail "no process set in the table's title"
if "$bench" --process-set 0,0 >/dev/null 2>&1; then fail "--process-set 0,0 was accepted"; fi

echo "== latency mode"
"$hvdrun" -np 3 --timeout 120 -- "$bench" --backend gloo --latency --baseline -b 8 -e 64 -f 8 -n 20 \
  -w 2 -J "$work/latency.json" >/dev/null
jq -e '[.results[] | .latency_us.p50 > 0 and .nwrong == 0] | all' "$work/latency.json" \
  >/dev/null || fail "latency results are missing or wrong"

echo "== --check-args: each call also on a communicator with HVD_CHECK_ARGS=1, and the overhead"
"$hvdrun" -np 2 --timeout 120 -- "$bench" --backend gloo --check-args -b 8 -e 512 -f 8 -n 3 -w 1 \
  -C allreduce,broadcast -J "$work/check.json" >"$work/check.txt"
grep -q "overhead" "$work/check.txt" || fail "no overhead column with --check-args"
grep -q "HVD_CHECK_ARGS=1 overhead" "$work/check.txt" || fail "no overhead footer with --check-args"
jq -e '.settings.check_args and ([.results[] | .check_args |
         (.overhead_us_out_of_place | type == "number") and .in_place.nwrong == 0] | all) and
       (.results | length == 6)' "$work/check.json" >/dev/null ||
  fail "check_args results: $(jq -c '.results' "$work/check.json")"
if "$bench" --check-args --latency >/dev/null 2>&1; then fail "--check-args --latency was accepted"; fi

echo "== --huge-pages: the buffers and the header's memcpy on huge pages, said in the header and JSON"
"$hvdrun" -np 2 --timeout 120 -- "$bench" --backend gloo --huge-pages -b 3M -e 6M -n 2 -w 1 \
  -J "$work/huge.json" >"$work/huge.txt"
grep -Eq "# Host buffers and the memcpy on huge pages, advised \(--huge-pages; transparent huge pages: (always|madvise|never|unknown)" \
  "$work/huge.txt" || fail "no huge-pages line in the header: $(head -8 "$work/huge.txt")"
grep -Eq "# Host buffers from malloc \(transparent huge pages: (always|madvise|never|unknown)" \
  "$work/gloo.txt" || fail "no malloc line in the default header: $(head -8 "$work/gloo.txt")"
jq -e '.settings.huge_pages == true and
       (.limits.transparent_huge_pages | test("^(always|madvise|never|unknown)$"))
       and .limits.memcpy_GBps > 0 and ([.results[] | .out_of_place.nwrong == 0 and
       .in_place.nwrong == 0] | all and length == 2)' "$work/huge.json" >/dev/null ||
  fail "huge pages: $(jq -c '{settings, limits, results}' "$work/huge.json")"
jq -e '.settings.huge_pages == false' "$work/gloo.json" >/dev/null || fail "huge pages by default"
for other in "--mem cuda" "--tensors 4"; do
  status=0
  # shellcheck disable=SC2086  # the option and its value are two words
  "$bench" --huge-pages $other >/dev/null 2>"$work/huge-refused.txt" || status=$?
  [ "$status" = 2 ] && grep -q -- "--huge-pages places the tables' host buffers: not with ${other% *}" \
    "$work/huge-refused.txt" || fail "--huge-pages $other: exit $status, $(cat "$work/huge-refused.txt")"
done

echo "== fusion mode: 64 named tensors per step, fused, grouped and unfused"
"$hvdrun" -np 3 --timeout 120 -- "$bench" --backend gloo --tensors 64 --tensor-bytes 1K -n 3 -w 1 \
  -J "$work/fusion.json" >/dev/null
jq -e '[.results[] | select(.mode == "fusion")] | length == 1' "$work/fusion.json" >/dev/null ||
  fail "no fusion result"
jq -e '.results[0] | .nwrong == 0 and .backend_calls_per_step_unfused == 64 and
       .backend_calls_per_step_fused < 64 and .fused_time > 0 and .grouped_time > 0' \
  "$work/fusion.json" >/dev/null || fail "fusion result: $(jq -c '.results[0]' "$work/fusion.json")"

echo "== a backend that returns wrong sums must fail the run"
if HVD_PLUGIN_PATH="$test_plugins" "$hvdrun" -np 3 --timeout 120 -- "$bench" --backend wrongsum \
     -b 4 -e 64 -n 1 -w 0 -J "$work/wrong.json" >"$work/wrong.txt" 2>&1; then
  cat "$work/wrong.txt"; fail "hvd-bench exited 0 on wrong sums"
fi
jq -e '[.results[] | .out_of_place.nwrong] | add > 0' "$work/wrong.json" >/dev/null ||
  fail "the wrong sums were not counted"
grep -q "FAILED" "$work/wrong.txt" || fail "no FAILED line for wrong sums"

echo "== the plot"
if command -v gnuplot >/dev/null; then
  "$plot" -o "$work/plot.png" "$work/gloo.json"
  [ "$(head -c 4 "$work/plot.png" | tail -c 3)" = "PNG" ] || fail "the plot is not a PNG"
else
  echo "skipping the plot: gnuplot is missing"
fi

if [ -n "$mpirun" ]; then
  echo "== under mpirun: every backend, mpi with MPI_Allreduce beside it"
  "$mpirun" --allow-run-as-root --oversubscribe --bind-to none -np 3 "$bench" --backend all \
    --baseline -b 8 -e 4K -f 8 -n 2 -w 1 -J "$work/mpi.json" >/dev/null
  jq -e '[.results[] | select(.backend == "mpi")] | length > 0' "$work/mpi.json" >/dev/null ||
    fail "no mpi results under mpirun"
  jq -e '[.results[] | .out_of_place.nwrong, .in_place.nwrong] | all(. == 0)' "$work/mpi.json" \
    >/dev/null || fail "wrong elements under mpirun"
  echo "== under mpirun: reduce_scatter and alltoall beside MPI's, on a process set of ranks 1 and 2"
  "$mpirun" --allow-run-as-root --oversubscribe --bind-to none -np 3 "$bench" --backend mpi \
    --baseline --process-set 1,2 -C reduce_scatter,alltoall -b 8 -e 64K -f 64 -n 2 -w 1 \
    -J "$work/mpi-set.json" >/dev/null
  jq -e '[.results[] | .ranks == 2 and .out_of_place.nwrong == 0 and
          .direct.out_of_place.nwrong == 0] | all and length == 6' "$work/mpi-set.json" \
    >/dev/null || fail "mpi process set: $(jq -c '.results' "$work/mpi-set.json")"
fi
echo "PASS"
