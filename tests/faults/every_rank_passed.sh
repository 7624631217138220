#!/usr/bin/env bash
# Runs a multi-rank gtest job and passes when each of its <ranks> ranks reported PASSED and none
# FAILED, whatever the launcher's exit status. Under mpirun the fault suite needs this: after a
# collective failed, the mpi backend skips MPI_Finalize at exit (MPI cannot cancel what the
# collective left in flight, and finalizing would wait for it), which mpirun reports as an
# abnormal exit of the job.
#
#   every_rank_passed.sh <ranks> <command...>
set -uo pipefail
ranks=$1
shift
out=$("$@" --gtest_color=no 2>&1)
echo "$out"
passed=$(grep -c '^\[  PASSED  \]' <<<"$out")
if [ "$passed" -ne "$ranks" ] || grep -q '^\[  FAILED  \]' <<<"$out"; then
  echo "every_rank_passed: $passed of $ranks ranks passed"
  exit 1
fi
