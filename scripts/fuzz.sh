#!/usr/bin/env bash
# Fuzz the parsers that read what peers send (tests/fuzz: the rendezvous store's frames and
# requests, the init record and the verdict on backend choices, the scheduler's request gather)
# with libFuzzer. Builds them with clang in build-fuzz (only the sources they reach), runs each
# target for the seconds given, and fails if any target crashes, leaks, hits undefined behaviour
# or allocates more than it should (-malloc_limit_mb).
#
#   scripts/fuzz.sh               20 s per target (three targets: about a minute; scripts/test.sh)
#   scripts/fuzz.sh 200           200 s per target
#
# Each target starts from its seed corpus (tests/fuzz/corpus/<target>, in the repository) and
# from what earlier runs found (build-fuzz/corpus/<target>, kept between runs). A crashing input
# is left in build-fuzz/artifacts/; replay it with build-fuzz/bin/fuzz_<target> <file>.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-20}
targets=(store_protocol init_record negotiation)

CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DHVD_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz --target hvd_fuzz -j "$(nproc)"

mkdir -p build-fuzz/artifacts
failed=0
for target in "${targets[@]}"; do
  corpus=build-fuzz/corpus/$target
  log=build-fuzz/fuzz-$target.log
  mkdir -p "$corpus"
  status=0
  # New inputs go to the first corpus directory; the seeds are only read.
  build-fuzz/bin/fuzz_"$target" -max_total_time="$seconds" -timeout=10 -malloc_limit_mb=256 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=build-fuzz/artifacts/"$target"- \
    "$corpus" tests/fuzz/corpus/"$target" >"$log" 2>&1 || status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$done_line")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$done_line")
  if [ "$status" -ne 0 ]; then
    failed=1
    echo "fuzz_$target: FAILED (exit $status) after ${runs:-?} runs; see $log:"
    grep -E 'ERROR|CHECK failed|runtime error|SUMMARY|Test unit written' "$log" | head -8
  else
    echo "fuzz_$target: ${runs:-?} runs in ${seconds} s, coverage ${cov:-?} edges /" \
         "${ft:-?} features, corpus ${corp:-?} inputs, no crash"
  fi
done
exit "$failed"
