#!/usr/bin/env bash
# openmpi_rerun.sh runs a job again only after Open MPI's "PID 0 ... exiting improperly" report
# with no failed test, and only once.
set -uo pipefail
rerun=$(dirname "$0")/openmpi_rerun.sh
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0
# A fake job: fails with $1's text on its first $2 runs, then passes.
cat > "$dir/job" <<'JOB'
#!/usr/bin/env bash
n=$(cat "$0.runs" 2>/dev/null || echo 0); echo $((n + 1)) > "$0.runs"
if [ "$n" -lt "$2" ]; then printf '%b\n' "$1"; exit 1; fi
echo "[  PASSED  ] 1 test."
JOB
chmod +x "$dir/job"
race='[  PASSED  ] 1 test.\nmpirun has exited due to process rank 0 with PID 0 on\nnode x exiting improperly.'
expect() {  # expect <exit status> <runs> <text> <failing runs>
  rm -f "$dir/job.runs"
  "$rerun" "$dir/job" "$3" "$4" > "$dir/out" 2>&1
  local status=$? runs
  runs=$(cat "$dir/job.runs")
  if [ "$status" -ne "$1" ] || [ "$runs" -ne "$2" ]; then
    echo "FAILED: '$3' failing $4 times: status $status after $runs runs, expected $1 after $2"
    cat "$dir/out"
    fails=1
  fi
}
expect 0 1 "$race" 0                                # passes: one run
expect 0 2 "$race" 1                                # the race once: run again, passes
expect 1 2 "$race" 2                                # the race twice: fails
expect 1 1 "[  FAILED  ] A.B\n$race" 1              # a failed test: no second run
expect 1 1 "mpirun noticed that process rank 0 exited on signal 9" 1  # another failure
[ "$fails" -eq 0 ] && echo "openmpi_rerun_test: all cases passed"
exit "$fails"
