#!/usr/bin/env bash
# The main job on a default file-backed volume:
#   1. build jbdev (release),
#   2. format a 1 GiB image file (default ./demo.img; its content is replaced),
#   3. run the sync-writers benchmark on it — N threads of 4 KiB FUA writes
#      through jbdev, side by side with the kernel's O_DIRECT|O_SYNC pwrite on
#      the same file (table on stdout, JSON and plots in demo-results/),
#   4. check the volume (superblocks, journal) and print its state.
#
#   scripts/demo.sh [IMAGE]
set -euo pipefail
cd "$(dirname "$0")/.."
img="${1:-demo.img}"
out=demo-results
cargo build --release -p jbdev
jbdev="${CARGO_TARGET_DIR:-target}/release/jbdev"
mkdir -p "$out"
rm -f "$img"
"$jbdev" format "$img" --size 1G
"$jbdev" info "$img"
"$jbdev" bench sync-writers --device "$img" --threads 1,8,32 --duration 3 \
    --json "$out/sync-writers.json" --plot-dir "$out"
"$jbdev" check "$img"
"$jbdev" info "$img"
echo "demo: volume $img is ready; serve it with: $jbdev serve $img"
