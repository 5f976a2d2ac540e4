#!/usr/bin/env bash
# Ranks that disagree on their collectives (tests/dist/desync_worker.cpp) must stop within seconds,
# with no crash and no hang, each rank printing the error that names the ranks and both
# collectives with their labels.
# Usage: desync_test.sh NUMPROCS MPIEXEC NUMPROC_FLAG WORKER [MPIEXEC_PREFLAGS...]
set -u
np=$1
mpiexec=$2
numproc_flag=$3
worker=$4
shift 4
# More ranks than cores: Open MPI wants to be told.
if "$mpiexec" --version 2>/dev/null | grep -Eq "Open MPI|OpenRTE|open-mpi" && [[ " $* " != *" --oversubscribe "* ]]; then
  set -- "$@" --oversubscribe
fi
log=$(mktemp)
out=$(mktemp -d)  # each rank's "stopped" line (desync_worker.cpp says why not only its output)
trap 'rm -rf "$log" "$out"' EXIT
failed=0
n='[0-9]+'

run() {  # run CASE DEBUG PATTERN [MPIEXEC_PREFLAGS...]
  local case=$1 debug=$2 pattern=$3
  shift 3
  local start status elapsed_ms problem=""
  rm -f "$out"/rank*.txt
  start=$(date +%s%N)
  # A timeout far above the 15 s allowed: the error must come from the fingerprints, not the timeout.
  TANDEM_DESYNC_OUT=$out TANDEM_DIST_DEBUG=$debug TANDEM_DIST_TIMEOUT=60 timeout -s KILL 120 \
    "$mpiexec" "$numproc_flag" "$np" "$@" "$worker" "$case" >"$log" 2>&1
  status=$?
  elapsed_ms=$((($(date +%s%N) - start) / 1000000))
  echo "---- $case (TANDEM_DIST_DEBUG=$debug, $np ranks) ----"
  cat "$log"
  echo "desync_test ($case): status $status after $((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000))) s"
  if [ "$status" -eq 0 ]; then
    problem="the job exited 0"
  elif [ "$elapsed_ms" -gt 15000 ]; then
    problem="the job took longer than 15 s"
  elif grep -Eq "Segmentation|signal 11|core dumped|Aborted" "$log"; then
    problem="a rank crashed"
  else
    for ((r = 0; r < np; ++r)); do
      if ! grep -hE "^rank $r: stopped: " "$log" "$out/rank$r.txt" 2>/dev/null | grep -Eq "$pattern"; then
        problem="rank $r did not stop with /$pattern/"
        break
      fi
    done
  fi
  if [ -n "$problem" ]; then
    echo "desync_test ($case): FAILED: $problem"
    failed=1
  else
    echo "desync_test ($case): passed"
  fi
}

issued="ranks issued different collectives: rank 1 issued"
bucket() { echo "all_reduce #$n 'ddp bucket $1 of step 3' \\(1000 f32 elements, 4.0 KB, avg\\)"; }
run extra standard "$issued all_reduce #$n 'metrics' \\(1 f32 element, 4 B, sum\\) where rank 0 issued $(bucket 0)" "$@"
run extra detail "$issued all_reduce #$n 'metrics' \\(1 f32 element, 4 B, sum\\) where rank 0 issued $(bucket 0)" "$@"
run skip standard "$issued $(bucket 2) where rank 0 issued $(bucket 1)" "$@"
run size standard "$issued all_reduce #$n 'ddp bucket 1 of step 3' \\(1001 f32 elements, 4.0 KB, avg\\) where rank 0 issued $(bucket 1)" "$@"
run dtype standard "$issued all_reduce #$n 'ddp bucket 1 of step 3' \\(1000 f64 elements, 8.0 KB, avg\\) where rank 0 issued $(bucket 1)" "$@"
run broadcast standard "$issued broadcast #$n 'ddp bucket 1 of step 3' \\(1000 f32 elements, 4.0 KB, root 0\\) where rank 0 issued $(bucket 1)" "$@"
run label off "ranks issued different collectives before the optimizer step of step 3: rank 1 issued all_reduce #$n 'metrics' \\(1000 f32 elements, 4.0 KB, avg\\) where rank 0 issued $(bucket 1)" "$@"
exit $failed
