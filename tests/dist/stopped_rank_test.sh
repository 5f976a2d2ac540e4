#!/usr/bin/env bash
# A rank stopped with SIGSTOP in the middle of training (tests/dist/fault_worker.cpp "stop"): the
# other rank times out (5 s here), its flight recorder goes to the dump directory, and
# scripts/dist_analyze.py, reading the dumps, names rank 1 and the collective it never joined.
# Usage: stopped_rank_test.sh PYTHON ANALYZER MPIEXEC NUMPROC_FLAG WORKER [MPIEXEC_PREFLAGS...]
set -u
python=$1
analyzer=$2
mpiexec=$3
numproc_flag=$4
worker=$5
shift 5
# With TANDEM_FAULT_ON_GPU=1 the worker all-reduces a GPU tensor, so NCCL's group times out.
backend=mpi
if [ "${TANDEM_FAULT_ON_GPU:-0}" = 1 ]; then
  backend=nccl
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [ "$gpus" -lt 2 ]; then
    echo "stopped_rank_test: skipped: the NCCL case needs 2 GPUs, this machine has $gpus"
    exit 77
  fi
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

start=$(date +%s)
TANDEM_DIST_TIMEOUT=5 TANDEM_DIST_DUMP_DIR="$dir/dumps" timeout -s KILL 120 \
  "$mpiexec" "$numproc_flag" 2 "$@" "$worker" stop >"$dir/log" 2>&1
status=$?
echo "---- the job (status $status after $(($(date +%s) - start)) s) ----"
cat "$dir/log"
echo "---- dumps ----"
ls "$dir/dumps"
echo "---- dist_analyze.py ----"
"$python" "$analyzer" "$dir/dumps" >"$dir/analysis" 2>&1
analyzer_status=$?
cat "$dir/analysis"

problem=""
if [ "$status" -eq 0 ]; then
  problem="the job exited 0 although rank 1 was stopped"
elif ! grep -Eq "rank 0: $backend all_reduce of [0-9]+ bytes .*\(#6 'gradients of step 5'\)( on cuda:[0-9]+)? timed out after" "$dir/log"; then
  problem="the timeout message does not name the collective's sequence number and label"
elif [ ! -f "$dir/dumps/rank0-$backend.json" ]; then
  problem="rank 0 wrote no flight recorder"
elif [ "$analyzer_status" -ne 0 ]; then
  problem="dist_analyze.py failed"
elif ! grep -Eq "rank 1 .*all_reduce #6 'gradients of step 5'" "$dir/analysis"; then
  problem="the analysis does not name rank 1 at all_reduce #6 'gradients of step 5'"
fi
if [ -n "$problem" ]; then
  echo "stopped_rank_test: FAILED: $problem"
  exit 1
fi
echo "stopped_rank_test: passed"
