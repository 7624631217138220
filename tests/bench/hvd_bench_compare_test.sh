#!/usr/bin/env bash
# hvd-bench --compare at 2 ranks: kvs (a test backend with no direct baseline) against gloo, named
# second on purpose: gloo must run first, every kvs row must carry a positive ratio equal to
# gloo's time over kvs's, in the table and in the JSON, and kvs's direct columns must read n/a
# with the reason once (--baseline). Then the latency mode's p50 ratio, the usage errors, and,
# given mpirun, gloo against mpi.
#
#   hvd_bench_compare_test.sh HVDRUN HVD_BENCH TEST_PLUGIN_DIR [MPIRUN]
set -euo pipefail
hvdrun=$1 bench=$2 test_plugins=$3 mpirun=${4:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v jq >/dev/null || fail "jq is missing (scripts/install-deps.sh installs it)"
export HVD_PLUGIN_PATH=$test_plugins

# The ratio columns of BACKEND's tables in a text report (after the last '|'), one line per row.
ratios() {
  awk -v b="$2" '/^# Backend / { mine = ($3 == b) } /^# Out of bounds/ { mine = 0 }
                 mine && /^ +[0-9]/ { n = split($0, f, "|"); print f[n] }' "$1"
}
positive='^[0-9]+\.[0-9]+$'

echo "== bandwidth: kvs,gloo --compare gloo --baseline, allreduce and alltoall"
"$hvdrun" -np 2 --timeout 120 -- "$bench" --backend kvs,gloo --compare gloo --baseline \
  -C allreduce,alltoall -b 8 -e 64K -f 8 -n 3 -w 1 -J "$work/bw.json" |
  sed 's/^\[[0-9]*\]<stdout>://' >"$work/bw.txt"
cat "$work/bw.txt"
first=$(grep -m1 '^# Backend ' "$work/bw.txt" | awk '{print $3}')
[ "$first" = gloo ] || fail "the reference gloo did not run first (first table: $first)"
grep -q 'busbw vs gloo' "$work/bw.txt" || fail "no 'busbw vs gloo' column"
grep -q '^# vs gloo: busbw / gloo' "$work/bw.txt" || fail "no line saying what the ratio is"
grep -q '^# busbw vs gloo (this / gloo' "$work/bw.txt" || fail "no ratio footer"
[ "$(grep -c 'kvs: no direct baseline' "$work/bw.txt")" = 1 ] ||
  fail "kvs's missing baseline is not explained exactly once"
[ "$(grep -c 'baseline: n/a; compared with gloo' "$work/bw.txt")" = 2 ] ||
  fail "kvs's table titles do not say baseline n/a and compared with gloo"
awk '/^# Backend / { mine = ($3 == "gloo") } mine && /vs gloo/' "$work/bw.txt" | grep -q . &&
  fail "gloo's own tables have a ratio column"
rows=0
while read -r oop ip; do
  rows=$((rows + 1))
  [[ $oop =~ $positive ]] && [ "$oop" != 0.000 ] || fail "out-of-place ratio '$oop' is not positive"
  [[ $ip =~ $positive || $ip == N/A ]] || fail "in-place ratio '$ip' is neither positive nor N/A"
done < <(ratios "$work/bw.txt" kvs)
[ "$rows" = 10 ] || fail "$rows kvs rows with ratios, expected 10 (5 sizes x 2 collectives)"

jq -e '.settings.compare == "gloo"' "$work/bw.json" >/dev/null || fail "settings.compare is not gloo"
jq -e '[.results[] | select(.backend == "gloo") | has("compare")] | any | not' "$work/bw.json" \
  >/dev/null || fail "gloo's rows have a compare object"
jq -e '[.results[] | select(.backend == "kvs")] | length == 10 and all(
         .compare.backend == "gloo" and .compare.metric == "busbw" and
         .compare.ratio_out_of_place > 0 and
         (if .collective == "alltoall" then (.compare | has("ratio_in_place") | not)
          else .compare.ratio_in_place > 0 end) and
         .direct.call == null and (.direct.unsupported | test("no direct baseline")))' \
  "$work/bw.json" >/dev/null || fail "kvs rows: $(jq -c '[.results[] | select(.backend == "kvs")]' "$work/bw.json")"
# The ratio is gloo's mean time over kvs's for the same message (= kvs busbw / gloo busbw).
jq -e '[.results[] | select(.backend == "gloo")] as $ref |
       [.results[] | select(.backend == "kvs") | . as $r |
        ($ref[] | select(.collective == $r.collective and .size == $r.size)) as $g |
        (($g.out_of_place.time / $r.out_of_place.time) / $r.compare.ratio_out_of_place - 1) |
        fabs < 1e-4] | length == 10 and all' "$work/bw.json" >/dev/null ||
  fail "a ratio is not gloo's time over kvs's"

echo "== latency: --compare gloo --latency, p50 ratio"
"$hvdrun" -np 2 --timeout 120 -- "$bench" --backend kvs,gloo --compare gloo --latency \
  -b 8 -e 512 -f 8 -n 20 -w 2 -J "$work/lat.json" | sed 's/^\[[0-9]*\]<stdout>://' >"$work/lat.txt"
grep -q "^# vs gloo: gloo's p50 / this p50" "$work/lat.txt" || fail "no latency ratio header"
jq -e '[.results[] | select(.backend == "gloo")] as $ref |
       [.results[] | select(.backend == "kvs") | . as $r |
        ($ref[] | select(.size == $r.size)) as $g |
        .compare.backend == "gloo" and .compare.metric == "p50" and .compare.ratio > 0 and
        ((($g.latency_us.p50 / $r.latency_us.p50) / .compare.ratio - 1) | fabs < 1e-4)] |
       length == 3 and all' "$work/lat.json" >/dev/null ||
  fail "latency compare: $(jq -c '.results' "$work/lat.json")"

echo "== usage errors (exit 2, naming the backends given)"
expect_usage() {
  local want=$1
  shift
  if "$bench" "$@" >"$work/err.txt" 2>&1; then fail "'$*' was accepted"; else rc=$?; fi
  [ "$rc" = 2 ] || fail "'$*' exited $rc, not 2: $(cat "$work/err.txt")"
  grep -qF -- "$want" "$work/err.txt" || fail "'$*' said: $(cat "$work/err.txt")"
}
expect_usage "--compare nosuch: not one of the backends of --backend kvs,gloo" \
  --backend kvs,gloo --compare nosuch
expect_usage "--compare gloo: no --backend given" --compare gloo
expect_usage "--compare gloo: --backend gloo has no other backend" --backend gloo --compare gloo
expect_usage "not --tensors" --backend kvs,gloo --compare gloo --tensors 4

if [ -n "$mpirun" ]; then
  echo "== under mpirun: gloo against mpi"
  "$mpirun" --allow-run-as-root --oversubscribe --bind-to none -np 2 "$bench" --backend gloo,mpi \
    --compare mpi -b 8 -e 4K -f 8 -n 3 -w 1 -J "$work/mpi.json" >"$work/mpi.txt"
  first=$(grep -m1 '^# Backend ' "$work/mpi.txt" | awk '{print $3}')
  [ "$first" = mpi ] || fail "under mpirun the reference mpi did not run first (first: $first)"
  jq -e '[.results[] | select(.backend == "gloo")] | length == 4 and all(
           .compare.backend == "mpi" and .compare.ratio_out_of_place > 0 and
           .compare.ratio_in_place > 0)' "$work/mpi.json" >/dev/null ||
    fail "gloo vs mpi: $(jq -c '.results' "$work/mpi.json")"
fi
echo "PASS"
