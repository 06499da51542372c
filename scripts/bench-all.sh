#!/usr/bin/env bash
# Runs the whole jbdev benchmark suite (docs/BENCHMARKS.md) on the ram and
# disk backings, side by side with the kernel, and keeps the table, the JSON
# and the plots in bench-results/. Needs root (loop devices, mkfs, mount).
#
#   scripts/bench-all.sh            # full run (about 8 minutes here)
#   scripts/bench-all.sh --quick    # under 3 minutes
#   scripts/bench-all.sh --backing disk --duration 5
set -euo pipefail
cd "$(dirname "$0")/.."
out=${BENCH_OUT:-bench-results}
mkdir -p "$out"
if ! command -v fs_mark >/dev/null; then
    echo "note: fs_mark not installed (apt-get install fsmark): no ext4/jbd2 reference in fsync-batch" >&2
fi

cargo run --release -q -p jbdev -- bench all --json "$out/bench.json" --plot-dir "$out" "$@" | tee "$out/bench.txt"
