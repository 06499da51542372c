#!/usr/bin/env bash
# Side-by-side NBD benchmark on ONE backing file in ONE run:
#   jbdev serve  vs  nbdkit file  vs  qemu-nbd -e 4 (cache=none, aio=native)
# Each server is measured with nbd-loadgen (4 KiB random writes with FUA at
# QD32 -- fio's nbd engine cannot send FUA -- and 4 KiB random reads at QD32)
# and with fio's nbd engine (4 KiB random reads at QD32); with nbdcopy (half
# the export in with --flush, out, and in with 16 MiB requests: seconds);
# with `qemu-img bench -w -t none -c 200000 -d 32 -s 4k` (seconds); server
# CPU time per operation of the FUA and qemu-img runs (from /proc); and the
# server's resident memory and threads when idle after all of it. nbdkit and qemu-nbd
# serve the file raw first; then the same file is formatted as a jbdev
# volume and served by jbdev. Every server gets the same prefill (random
# data over the whole export, so no read is answered from a hole).
# With --rounds N the three servers are measured N times, the order
# reversed every other round (this machine is noisy: a server measured
# always last meets whatever slowed the machine down), and the table shows
# each figure's median over the rounds. The page cache is dropped (when
# writable, as root) before each server starts.
#
# Usage: scripts/bench-nbd.sh [--seconds N] [--size 1G] [--qd 32] [--rounds N] [--dir DIR]
# Environment: CARGO_TARGET_DIR (where release binaries are built);
# JBDEV_SERVE_ARGS (extra `jbdev serve` flags, e.g. "--buffered").
set -euo pipefail

secs=10
size=1G
qd=32
rounds=1
dir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) secs=$2; shift 2 ;;
        --size) size=$2; shift 2 ;;
        --qd) qd=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --dir) dir=$2; shift 2 ;;
        *) echo "usage: $0 [--seconds N] [--size 1G] [--qd 32] [--rounds N] [--dir DIR]" >&2; exit 2 ;;
    esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
for tool in nbdkit qemu-nbd fio nbdcopy python3; do
    command -v "$tool" >/dev/null || { echo "bench-nbd: $tool is missing (apt-get install nbdkit qemu-utils fio libnbd-bin)" >&2; exit 1; }
done
echo "== building release binaries" >&2
(cd "$root" && cargo build --release -q -p jbdev -p jbdev-nbd)
target=${CARGO_TARGET_DIR:-$root/target}/release
jbdev=$target/jbdev
loadgen=$target/nbd-loadgen

# The backing file lives on the disk (not tmpfs) unless --dir says otherwise.
[ -n "$dir" ] || dir=$(mktemp -d "${TMPDIR:-/var/tmp}/jbdev-bench-nbd.XXXXXX")
mkdir -p "$dir"
img=$dir/backing.img
prefill=$dir/prefill.raw
results=$dir/results.jsonl
: > "$results"
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    # Keep the results, not the gigabytes.
    rm -f "$img" "$prefill" "$dir/half.raw" "$dir/out.raw"
}
trap cleanup EXIT INT TERM

port=10820
wait_port() {
    for _ in $(seq 1 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "bench-nbd: server on port $port did not start" >&2
    exit 1
}
stop_server() {
    kill -TERM "$server_pid"
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
}

bytes=$(python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1].upper()] if s[-1].upper() in m else int(s))" "$size")
head -c "$bytes" /dev/urandom > "$prefill"

half=$((bytes / 2))
head -c "$half" "$prefill" > "$dir/half.raw" 2>/dev/null || true

cpu_ticks() { # pid -> utime+stime in clock ticks
    awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"
}
now() { date +%s.%N; }
round=1
record_time() { # label mode start end
    python3 -c "import json; print(json.dumps({'label': '$1', 'mode': '$2', 'round': $round, 'seconds': $4 - $3}))" >> "$results"
}
record_cpu() { # label mode ticks ops
    python3 -c "import json, os; t = os.sysconf('SC_CLK_TCK'); print(json.dumps({'label': '$1', 'mode': '$2', 'round': $round, 'cpu_us_per_op': $3 * 1e6 / t / max($4, 1)}))" >> "$results"
}

measure() { # label uri
    local label=$1 uri=$2 t0 t1 c0 c1
    echo "== $label (round $round): prefill" >&2
    nbdcopy --flush "$prefill" "$uri"
    echo "== $label: nbdcopy in (--flush), out, in with 16 MiB requests" >&2
    t0=$(now); nbdcopy --flush "$dir/half.raw" "$uri"; t1=$(now)
    record_time "$label" nbdcopy-in "$t0" "$t1"
    t0=$(now); nbdcopy "$uri" "$dir/out.raw"; t1=$(now)
    record_time "$label" nbdcopy-out "$t0" "$t1"
    rm -f "$dir/out.raw"
    t0=$(now); nbdcopy --flush --request-size=16777216 "$dir/half.raw" "$uri"; t1=$(now)
    record_time "$label" nbdcopy-in-16m "$t0" "$t1"
    echo "== $label: qemu-img bench -w -t none -c 200000 -d 32 -s 4k" >&2
    c0=$(cpu_ticks "$server_pid"); t0=$(now)
    qemu-img bench -f raw -w -t none -c 200000 -d 32 -s 4k "$uri" >/dev/null
    t1=$(now); c1=$(cpu_ticks "$server_pid")
    record_time "$label" qemu-img-bench "$t0" "$t1"
    record_cpu "$label" cpu-qemu-img-bench "$((c1 - c0))" 200000
    echo "== $label: 4 KiB random writes with FUA, QD$qd (nbd-loadgen)" >&2
    c0=$(cpu_ticks "$server_pid")
    "$loadgen" --addr "127.0.0.1:$port" --mode randwrite-fua --qd "$qd" --seconds "$secs" --label "$label" --json | tee -a "$results" > "$dir/fua-$label.json"
    c1=$(cpu_ticks "$server_pid")
    record_cpu "$label" cpu-fua "$((c1 - c0))" "$(python3 -c "import json; r = json.load(open('$dir/fua-$label.json')); print(int(r['iops'] * $secs))")"
    echo "== $label: 4 KiB random reads, QD$qd (nbd-loadgen)" >&2
    "$loadgen" --addr "127.0.0.1:$port" --mode randread --qd "$qd" --seconds "$secs" --label "$label" --json >> "$results"
    echo "== $label: 4 KiB random reads, QD$qd (fio nbd engine)" >&2
    # fio's nbd engine prints a line to stdout before the JSON: use --output.
    fio --name=randread --ioengine=nbd --uri="$uri" --rw=randread --bs=4k --iodepth="$qd" \
        --size="$bytes" --runtime="$secs" --time_based --output-format=json \
        --output="$dir/fio-$label.json" >/dev/null
    python3 -c "
import json, sys
j = json.load(open('$dir/fio-$label.json'))['jobs'][0]['read']
p = j['clat_ns']['percentile']
print(json.dumps({'label': '$label', 'mode': 'fio-randread', 'round': $round, 'iops': j['iops'],
    'lat_us': {'mean': j['clat_ns']['mean'] / 1000, 'p50': p['50.000000'] / 1000,
               'p99': p['99.000000'] / 1000}}))" >> "$results"
    # Resident memory and threads once the server is idle after all of it.
    sleep 3
    python3 -c "
import json, os
st = open('/proc/$server_pid/status').read().split(chr(10))
rss = [l for l in st if l.startswith('VmRSS:')][0].split()[1]
print(json.dumps({'label': '$label', 'mode': 'idle-rss', 'round': $round, 'rss_mib': int(rss) / 1024,
    'threads': len(os.listdir('/proc/$server_pid/task'))}))" >> "$results"
}

# nbdkit file: raw file, page cache; FUA and FLUSH map to fdatasync.
run_nbdkit() {
    rm -f "$img"; truncate -s "$bytes" "$img"
    nbdkit -f -i 127.0.0.1 -p "$port" file "$img" &
    server_pid=$!
    wait_port
    measure "nbdkit-file" "nbd://127.0.0.1:$port"
    stop_server
}
# qemu-nbd, 4 shared clients, O_DIRECT with Linux AIO (flush honoured).
run_qemu() {
    rm -f "$img"; truncate -s "$bytes" "$img"
    qemu-nbd -e 4 -t -f raw --cache=none --aio=native -b 127.0.0.1 -p "$port" "$img" &
    server_pid=$!
    wait_port
    measure "qemu-nbd" "nbd://127.0.0.1:$port"
    stop_server
}
# jbdev on the same file, formatted as a volume of the same size.
run_jbdev() {
    rm -f "$img"
    "$jbdev" format "$img" --size "$size" >/dev/null
    # shellcheck disable=SC2086 # JBDEV_SERVE_ARGS is a list of flags
    "$jbdev" serve "$img" --listen "127.0.0.1:$port" ${JBDEV_SERVE_ARGS:-} 2>"$dir/jbdev-serve.log" &
    server_pid=$!
    wait_port
    measure "jbdev" "nbd://127.0.0.1:$port"
    stop_server
}

for round in $(seq 1 "$rounds"); do
    if [ $((round % 2)) = 1 ]; then order="run_nbdkit run_qemu run_jbdev"; else order="run_jbdev run_qemu run_nbdkit"; fi
    for run in $order; do
        port=$((port + 1))
        # Every server starts from the same page cache: the one before it
        # left gigabytes of cached and dirty image pages whose reclaim
        # slowed the next server's copies by up to a quarter.
        sync
        if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; fi
        # ...and with the copies' source files cached, as every run had them
        # before (nbdcopy reading them from the disk would be the test).
        cat "$prefill" "$dir/half.raw" > /dev/null
        $run
    done
done

python3 - "$results" "$secs" "$qd" <<'PY'
import json, sys
from statistics import median
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
secs, qd = sys.argv[2], sys.argv[3]
servers = ["jbdev", "nbdkit-file", "qemu-nbd"]
rounds = max(r.get("round", 1) for r in rows)
# One row per (server, mode): the median of every numeric figure over the rounds.
by = {}
for r in rows:
    by.setdefault((r["label"], r["mode"]), []).append(r)
def med(rs):
    out = dict(rs[0])
    for k, v in rs[0].items():
        if isinstance(v, (int, float)) and k != "round":
            out[k] = median(x[k] for x in rs)
        elif isinstance(v, dict):
            out[k] = {kk: median(x[k][kk] for x in rs) for kk in v}
    return out
get = {k: med(v) for k, v in by.items()}
modes = [("randwrite-fua", "4k randwrite FUA (loadgen)"),
         ("randread", "4k randread (loadgen)"),
         ("fio-randread", "4k randread (fio nbd)")]
print(f"\nNBD servers on loopback, QD{qd}, {secs}s per run, same backing file"
      + (f", median of {rounds} rounds (order reversed every other round)" if rounds > 1 else "") + "\n")
hdr = f"{'workload':28} " + " ".join(f"{s:>22}" for s in servers) + f" {'jbdev/best peer':>16}"
print(hdr)
print("-" * len(hdr))
for mode, name in modes:
    cells, iops = [], {}
    for s in servers:
        r = get.get((s, mode))
        if r is None:
            cells.append(f"{'-':>22}")
            continue
        iops[s] = r["iops"]
        lat = r["lat_us"]
        cells.append(f"{r['iops']:>9.0f} IOPS p99 {lat['p99']:>5.0f}us")
    peers = [iops[s] for s in servers[1:] if s in iops]
    ratio = f"{iops['jbdev'] / max(peers):>15.2f}x" if peers and "jbdev" in iops and max(peers) > 0 else f"{'-':>16}"
    print(f"{name:28} " + " ".join(cells) + f" {ratio}")
print()
timed = [("nbdcopy-in", "nbdcopy in --flush (s)"), ("nbdcopy-out", "nbdcopy out (s)"),
         ("nbdcopy-in-16m", "nbdcopy in, 16 MiB req (s)"), ("qemu-img-bench", "qemu-img bench 4k QD32 (s)")]
cpu = [("cpu-fua", "CPU/op, FUA loadgen (us)"), ("cpu-qemu-img-bench", "CPU/op, qemu-img bench (us)")]
for rows_, key in ((timed, "seconds"), (cpu, "cpu_us_per_op")):
    for mode, name in rows_:
        vals = {s: get[(s, mode)][key] for s in servers if (s, mode) in get}
        cells = [f"{vals[s]:>22.3f}" if s in vals else f"{'-':>22}" for s in servers]
        peers = [vals[s] for s in servers[1:] if s in vals]
        ratio = f"{vals['jbdev'] / min(peers):>15.2f}x" if peers and "jbdev" in vals and min(peers) > 0 else f"{'-':>16}"
        print(f"{name:28} " + " ".join(cells) + f" {ratio}")
big, small = get.get(("jbdev", "nbdcopy-in-16m")), get.get(("jbdev", "nbdcopy-in"))
if big and small:
    print(f"jbdev: nbdcopy in with 16 MiB requests / default request size: {big['seconds'] / small['seconds']:.2f}x")
for s in servers:
    r = get.get((s, "idle-rss"))
    if r:
        print(f"idle after load: {s}: RSS {r['rss_mib']:.1f} MiB, {r['threads']} threads")
print(f"\nraw results: {sys.argv[1]}")
PY
