#!/usr/bin/env bash
# Sets up, builds and tests tandem on a fresh Debian/Ubuntu machine, in one command:
#   1. installs the system packages (scripts/install-deps.sh),
#   2. configures and builds with every core (scripts/build.sh; CUDA targets when nvcc is found),
#   3. runs the test suite through ctest,
#   4. installs into a temporary prefix and builds and runs examples/consumer against it,
#      proving that find_package(tandem) works for other projects.
# Safe to run again: it reuses the build folder and only rebuilds what changed.
#
# Usage: scripts/test.sh [extra cmake configure arguments...]
#   TANDEM_BUILD_DIR   build folder (default: build/ in the repository root)
#   TANDEM_JOBS        parallel build and test jobs (default: the number of cores)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export TANDEM_BUILD_DIR="${TANDEM_BUILD_DIR:-$repo/build}"
case "$TANDEM_BUILD_DIR" in /*) ;; *) TANDEM_BUILD_DIR="$PWD/$TANDEM_BUILD_DIR" ;; esac
jobs="${TANDEM_JOBS:-$(nproc)}"
start=$SECONDS

step() { echo; echo "==> test: $* ($((SECONDS - start)) s)"; }

step "installing system packages"
"$repo/scripts/install-deps.sh"

step "configuring and building in $TANDEM_BUILD_DIR"
"$repo/scripts/build.sh" "$@"

step "running the tests"
ctest --test-dir "$TANDEM_BUILD_DIR" --output-on-failure -j"$jobs"

step "installing into a temporary prefix and building examples/consumer against it"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/tandem-consumer.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
cmake --install "$TANDEM_BUILD_DIR" --prefix "$scratch/prefix" >/dev/null
cmake -S "$repo/examples/consumer" -B "$scratch/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$scratch/prefix"
cmake --build "$scratch/build" --parallel "$jobs"
"$scratch/build/consumer"

step "all done: built, tested, installed and consumed"
