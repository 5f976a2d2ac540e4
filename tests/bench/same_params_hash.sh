#!/usr/bin/env bash
# Runs a `train_step --deterministic` command line twice and checks that both runs print the same
# parameters hash (bitwise-identical final parameters). SECOND_RUN_ARGS (space-separated) are
# added to the second run only: a setting that must not change the results (--channels-last on
# the CPU).
# Usage: [SECOND_RUN_ARGS="..."] same_params_hash.sh COMMAND [ARGS...]
set -uo pipefail
hashes=()
read -r -a second_run_args <<<"${SECOND_RUN_ARGS:-}"
for run in 1 2; do
  extra=()
  if [ "$run" = 2 ]; then extra=("${second_run_args[@]}"); fi
  output="$("$@" "${extra[@]}" 2>&1)" || { echo "run $run failed:"; echo "$output"; exit 1; }
  hash="$(grep -o 'parameters hash [0-9a-f]*' <<<"$output" | head -1 | awk '{print $3}')"
  [ -n "$hash" ] || { echo "run $run printed no parameters hash:"; echo "$output"; exit 1; }
  echo "run $run: parameters hash $hash"
  hashes+=("$hash")
done
if [ "${hashes[0]}" != "${hashes[1]}" ]; then
  echo "the runs differ: ${hashes[0]} vs ${hashes[1]}"
  exit 1
fi
echo "same parameters hash ${hashes[0]}"
