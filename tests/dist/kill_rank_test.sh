#!/usr/bin/env bash
# Breaks one rank of a two-rank job in the middle of its all-reduce loop (tests/dist/fault_worker.cpp)
# and checks that the job ends within 60 s, with a non-zero status and output that names the failure:
#   kill: rank 1 is SIGKILLed; Open MPI's mpirun notices and tears the job down.
#   hang: rank 1 stops communicating; mpirun sees nothing wrong, tandem's timeout (10 s here) raises on
#         rank 0, which exits non-zero, and mpirun then ends the job.
# Usage: kill_rank_test.sh MPIEXEC NUMPROC_FLAG WORKER [MPIEXEC_PREFLAGS...]
set -u
mpiexec=$1
numproc_flag=$2
worker=$3
shift 3
log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=0

run() {  # run MODE TIMEOUT_SECONDS PATTERN [MPIEXEC_PREFLAGS...]
  local mode=$1 timeout_s=$2 pattern=$3
  shift 3
  local start status elapsed_ms
  start=$(date +%s%N)
  TANDEM_DIST_TIMEOUT=$timeout_s timeout -s KILL 120 "$mpiexec" "$numproc_flag" 2 "$@" "$worker" "$mode" >"$log" 2>&1
  status=$?
  elapsed_ms=$((($(date +%s%N) - start) / 1000000))
  echo "---- $mode ----"
  cat "$log"
  echo "kill_rank_test ($mode): the job ended with status $status after $((elapsed_ms / 1000)).$(printf %03d \
$((elapsed_ms % 1000))) s"
  local problem=""
  if [ "$status" -eq 0 ]; then
    problem="the job exited 0 although rank 1 failed"
  elif [ "$elapsed_ms" -gt 60000 ]; then
    problem="the job took longer than 60 s to end (it is killed after 120 s)"
  elif ! grep -q "rank 1: .* at step 5" "$log"; then
    problem="rank 1 never reached the step where it fails"
  elif ! grep -Eq "$pattern" "$log"; then
    problem="the output does not name the failure (expected /$pattern/)"
  fi
  if [ -n "$problem" ]; then
    echo "kill_rank_test ($mode): FAILED: $problem"
    failed=1
  else
    echo "kill_rank_test ($mode): passed"
  fi
}

run kill 20 "signal 9|Killed|rank 0: .*(timed out|failed)" "$@"
run hang 10 "rank 0: (mpi|nccl) all_reduce of [0-9]+ bytes .*timed out after" "$@"
exit $failed
