#!/usr/bin/env bash
# The main job, on files this script creates itself:
#   1. build jbdev (release);
#   2. make sure IMAGE (default ./demo.img) holds a jbdev volume: format a
#      1 GiB one if IMAGE does not exist; use it as it is if it already is a
#      jbdev volume; refuse anything else (it may hold someone's data);
#   3. benchmark on a SEPARATE scratch file (demo-results/bench-scratch.img,
#      deleted afterwards): N threads of 4 KiB synchronous writes through
#      jbdev, side by side with the kernel's O_DIRECT|O_SYNC pwrite on the
#      same scratch file. The volume in IMAGE is never benchmarked on;
#   4. check the volume and print its state;
#   5. print a short summary table (jbdev vs the kernel, ratio) and name the
#      plot file.
#
#   scripts/demo.sh [IMAGE]
set -euo pipefail
cd "$(dirname "$0")/.."
img="${1:-demo.img}"
out=demo-results
scratch="$out/bench-scratch.img"
cargo build --release -p jbdev
jbdev="${CARGO_TARGET_DIR:-target}/release/jbdev"
mkdir -p "$out"

if [ -e "$img" ]; then
    if ! "$jbdev" info "$img" >/dev/null; then
        echo "demo: $img exists and is not a jbdev volume; refusing to touch it (it may hold data)." >&2
        echo "demo: give a path that does not exist yet: scripts/demo.sh /var/tmp/my-demo.img" >&2
        exit 1
    fi
    echo "demo: $img already holds a jbdev volume; using it as it is (not reformatted)"
else
    "$jbdev" format "$img" --size 1G
fi
"$jbdev" info "$img"

# The benchmark destroys what is on its device, so it gets its own file.
trap 'rm -f "$scratch"' EXIT
rm -f "$scratch"
fallocate -l 1G "$scratch" 2>/dev/null || truncate -s 1G "$scratch"
"$jbdev" bench sync-writers --device "$scratch" --threads 1,8,32 --duration 3 \
    --json "$out/sync-writers.json" --plot-dir "$out"
rm -f "$scratch"

"$jbdev" check "$img"
"$jbdev" info "$img"

echo
echo "== demo summary: 4 KiB synchronous writes on a 1 GiB scratch file (${out}/sync-writers.json)"
if command -v python3 >/dev/null; then
    python3 - "$out/sync-writers.json" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
for sc in rep.get("scenarios", []):
    runs = sc.get("runs", [])
    print(f"{'threads':>7}  {'jbdev writes/s':>14}  {'kernel writes/s':>15}  {'jbdev / kernel':>14}")
    for t in sorted({r["threads"] for r in runs}):
        j = next((r for r in runs if r["engine"] == "jbdev" and r["threads"] == t), None)
        k = next((r for r in runs if r["engine"] == "kernel" and r["threads"] == t), None)
        if not j or not k:
            continue
        ratio = j["ops_per_sec"] / k["ops_per_sec"] if k["ops_per_sec"] else float("nan")
        print(f"{t:>7}  {j['ops_per_sec']:>14,.0f}  {k['ops_per_sec']:>15,.0f}  {ratio:>13.2f}x")
    for p in sc.get("plots", []):
        if p.endswith(".png") or p.endswith(".svg"):
            print(f"plot: {p}")
PY
else
    echo "(python3 not installed: see the table above and $out/sync-writers.json)"
fi
cat <<'TXT'
How to read it: each writer thread issues 4 KiB writes that must be durable
before they return. "kernel" is O_DIRECT|O_SYNC pwrite on the same file, so
each write costs one data write plus one device flush. jbdev journals each
write (a journal block and a commit record, then a flush) and later copies it
home, so a lone writer is expected to be at or below the kernel (ratio < 1).
With many threads jbdev's group commit shares one flush among every writer
waiting, which is where it is meant to win (ratio > 1). A regular file on a
host file system adds the file system's own flush costs to both sides.
TXT
echo "demo: volume $img is ready; serve it with: $jbdev serve $img"
