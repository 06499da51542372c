#!/usr/bin/env bash
# Issue 2's speed check: N threads × 4 KiB FUA writes through jbdev against
# O_DIRECT|O_SYNC pwrite on the same loop device with direct I/O over a file
# on disk. Needs root.
#
#   scripts/bench-sync-writers.sh                   # 1 and 32 threads, disk
#   scripts/bench-sync-writers.sh --threads 1,8,32 --backing ram,disk
set -euo pipefail
cd "$(dirname "$0")/.."
out=${BENCH_OUT:-bench-results}
mkdir -p "$out"

cargo run --release -q -p jbdev -- bench sync-writers --backing disk --baseline kernel \
    --json "$out/sync-writers.json" --plot-dir "$out" "$@"
