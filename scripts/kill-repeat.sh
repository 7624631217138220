#!/usr/bin/env bash
# kill-repeat.sh — SIGKILL hvdrun N times mid-job and count the runs that left a rank behind.
#
#   scripts/kill-repeat.sh [N=100] [--mpi] [--np R] [--within S] [--build DIR] [--hvdrun PATH]
#
# Each run starts R ranks (default 3) of hvd_probe (init, an allreduce, then a long sleep) under
# hvdrun, or under hvdrun --mpi (through mpirun), and SIGKILLs hvdrun with hvd_kill_job: odd runs
# as soon as every rank has started (while they initialize), even runs after every rank finished
# its allreduce and a random 0-300 ms more. A run fails when a rank or any process of the job
# still runs S seconds (default 5; 10 with --mpi) after the kill, or when the job ended on its own
# before the kill (died silently). Prints one line per run that failed, then a summary: runs per
# outcome, how the ranks ended (exit status or signal, where hvd_kill_job could see it) and the
# kill-to-last-rank-gone times. Exit status 0 when every run passed.
#
# --hvdrun runs another hvdrun against the same test (an older one, to see it fail).
# Needs a build with the tests (hvd_kill_job, hvd_probe): cmake --build DIR. Not part of CI:
# ctest runs the same check once per launcher (orphans.local.np3, orphans.mpirun.np3).
set -euo pipefail

runs=100 mpi=0 np=3 within="" build="" hvdrun=""
while [ $# -gt 0 ]; do
  case "$1" in
    --mpi) mpi=1 ;;
    --np) np=$2; shift ;;
    --within) within=$2; shift ;;
    --build) build=$2; shift ;;
    --hvdrun) hvdrun=$2; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    [0-9]*) runs=$1 ;;
    *) echo "kill-repeat.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
here=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "$build" ]; then
  for candidate in "$here/build" "$here"/build*; do
    if [ -x "$candidate/bin/hvd_kill_job" ]; then build=$candidate; break; fi
  done
fi
if [ -z "$build" ] || [ ! -x "$build/bin/hvd_kill_job" ]; then
  echo "kill-repeat.sh: no build with bin/hvd_kill_job found (pass --build DIR)" >&2
  exit 2
fi
bin=$build/bin
hvdrun=${hvdrun:-$bin/hvdrun}
args=(--hvdrun "$hvdrun" --np "$np")
if [ "$mpi" = 1 ]; then
  args+=(--hvdrun-arg --mpi)
  within=${within:-10}
fi
args+=(--within "${within:-5}")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
declare -A outcome=()
echo "kill-repeat: $runs runs of $np ranks under $hvdrun$([ "$mpi" = 1 ] && echo " --mpi")"
for ((i = 1; i <= runs; i++)); do
  if ((i % 2)); then
    when=()
  else
    when=(--ready "allreduce = $((np * (np + 1) / 2))" --random-delay-ms 300)
  fi
  set +e
  "$bin/hvd_kill_job" "${args[@]}" "${when[@]}" -- "$bin/hvd_probe" --allreduce --hang \
    >"$work/run.$i" 2>&1
  rc=$?
  set -e
  result=$(sed -n 's/^RESULT \([a-z]*\).*/\1/p' "$work/run.$i")
  result=${result:-driver-failed}
  outcome[$result]=$((${outcome[$result]:-0} + 1))
  if [ "$rc" -ne 0 ]; then
    echo "run $i: $result (exit $rc)"
    sed 's/^/    /' "$work/run.$i"
  fi
done

echo
echo "outcomes:"
for k in "${!outcome[@]}"; do printf "  %-14s %d\n" "$k" "${outcome[$k]}"; done
echo "how the ranks ended:"
sed -n 's/^rank [0-9]* (pid [0-9]*): gone after [0-9.]* ms, //p' "$work"/run.* | sort | uniq -c |
  sed 's/^/  /'
cat "$work"/run.* | awk '/STILL RUNNING/ { n++ } END { printf "  still running after the bound: %d\n", n }'
sed -n 's/^RESULT ok last_rank_ms=\([0-9.]*\) all_gone_ms=\([0-9.]*\)/\1 \2/p' "$work"/run.* |
  sort -n | awk '
    { rank[NR] = $1; if ($2 > all) all = $2 }
    END {
      if (NR == 0) exit
      printf "kill -> last rank gone (ms), %d passing runs: min %.1f, median %.1f, p95 %.1f, max %.1f\n",
             NR, rank[1], rank[int((NR + 1) / 2)], rank[int(NR * 0.95 + 0.999)], rank[NR]
      printf "kill -> every process of the job gone (ms): max %.1f\n", all
    }'
failed=$((runs - ${outcome[ok]:-0}))
echo "runs that left a rank or process alive: ${outcome[alive]:-0}; died before the kill: ${outcome[early]:-0}; other failures: $((failed - ${outcome[alive]:-0} - ${outcome[early]:-0}))"
[ "$failed" -eq 0 ]
