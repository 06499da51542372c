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
# The server's TLS-PSK support links OpenSSL: its headers and pkg-config
# must be there to build.
if ! pkg-config --exists openssl 2>/dev/null; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libssl-dev pkg-config
    else
        echo "demo.sh: building jbdev needs OpenSSL's headers: apt-get install libssl-dev pkg-config" >&2
        exit 1
    fi
fi
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
    print(f"{'threads':>7}  {'jbdev writes/s':>14}  {'kernel writes/s':>15}  {'jbdev/kernel':>12}  {'CPU us/write':>15}  verdict")
    for t in sorted({r["threads"] for r in runs}):
        j = next((r for r in runs if r["engine"] == "jbdev" and r["threads"] == t), None)
        k = next((r for r in runs if r["engine"] == "kernel" and r["threads"] == t), None)
        if not j or not k or not j["ops_per_sec"] or not k["ops_per_sec"]:
            continue
        ratio = j["ops_per_sec"] / k["ops_per_sec"]
        verdict = f"jbdev {ratio:.2f}x faster" if ratio >= 1 else f"kernel {1 / ratio:.2f}x faster"
        jc, kc = j.get("machine_cpu_us_per_op"), k.get("machine_cpu_us_per_op")
        cpu = f"{jc:.1f} / {kc:.1f}" if jc and kc else "-"
        print(f"{t:>7}  {j['ops_per_sec']:>14,.0f}  {k['ops_per_sec']:>15,.0f}  {ratio:>11.2f}x  {cpu:>15}  {verdict}")
    for p in sc.get("plots", []):
        if p.endswith(".png"):
            print(f"plot: {p}  (same name .svg beside it)")
PY
else
    echo "(python3 not installed: see the table above and $out/sync-writers.json)"
fi
cat <<'TXT'
What was measured: each thread writes 4 KiB at a time and waits until the
write is durable (jbdev: a FUA write; kernel: pwrite on an O_DIRECT|O_SYNC
descriptor of the same scratch file), for 3 seconds per thread count.
CPU us/write: busy time of the whole machine's CPUs per write (jbdev /
kernel), kernel threads included (/proc/stat over the same interval).
Why jbdev can lose here: a lone writer's commit is one FUA write of three
blocks (descriptor, data, commit block) where the kernel writes one, and
every block is written twice (to the journal now, home at checkpoint). With
many threads the kernel sends every thread's write and flush to the device
in parallel; jbdev commits one transaction at a time by default (the next
waits until the previous is durable; --pipeline-depth 2 overlaps them).
Group commit lets all waiting writers share one flush, which wins when a
flush is slow compared with a write and loses on a device with cheap
flushes. Figures and analysis for other devices: docs/BENCHMARKS.md.
TXT
echo "demo: volume $img is ready; serve it with: $jbdev serve $img"
