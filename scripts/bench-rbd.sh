#!/usr/bin/env bash
# Issue 14's measurements on the throwaway single-node Ceph cluster, side by
# side in one run:
#   1. jbdev bench sync-writers --target rbd:... (plain librbd write+flush per
#      write vs jbdev with a local journal and with its journal on RBD),
#      local journal on the disk (/var/tmp) and on tmpfs (/dev/shm);
#   2. NBD: `jbdev serve rbd:...` (journal internal, i.e. on RBD) with
#      nbd-loadgen 4 KiB FUA writes at QD32, and nbdcopy of 512 MiB in
#      (--flush), and the same against `qemu-nbd -f raw rbd:...` when the
#      installed qemu has its rbd block driver (qemu-block-extra).
#
# Usage: scripts/bench-rbd.sh [--seconds N]
# Uses $CEPH_CONF if set, else starts scripts/ceph-test-cluster.sh in a
# fresh directory and stops it at the end.
set -euo pipefail
secs=5
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) secs=$2; shift 2 ;;
        *) echo "usage: $0 [--seconds N]" >&2; exit 2 ;;
    esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
(cd "$root" && cargo build --release -q -p jbdev --features rbd && cargo build --release -q -p jbdev-nbd --bin nbd-loadgen)
target=${CARGO_TARGET_DIR:-$root/target}/release
jbdev=$target/jbdev
loadgen=$target/nbd-loadgen

own_cluster=""
server_pid=""
work=$(mktemp -d /var/tmp/jbdev-bench-rbd.XXXXXX)
cleanup() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    rm -rf "$work"
    if [ -n "$own_cluster" ]; then "$root/scripts/ceph-test-cluster.sh" stop "$own_cluster"; fi
}
trap cleanup EXIT INT TERM
if [ -z "${CEPH_CONF:-}" ]; then
    own_cluster=$(mktemp -d /tmp/jbdev-ceph-XXXXXX)
    CEPH_CONF=$("$root/scripts/ceph-test-cluster.sh" start "$own_cluster")
fi
export CEPH_CONF
run_id=$$

echo "== sync-writers, local journal in /var/tmp (disk)"
"$jbdev" bench sync-writers --target "rbd:rbd/sw-disk-$run_id" --threads 1,32 \
    --duration "$secs" --backing-size 1G --backing-dir /var/tmp 2>/dev/null
echo
echo "== sync-writers, local journal in /dev/shm (tmpfs: not power-safe; a stand-in for a fast local NVMe)"
"$jbdev" bench sync-writers --target "rbd:rbd/sw-shm-$run_id" --threads 1,32 \
    --duration "$secs" --backing-size 1G --backing-dir /dev/shm 2>/dev/null
echo

port=10850
wait_port() {
    for _ in $(seq 1 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "bench-rbd: server on port $port did not start" >&2
    exit 1
}
head -c $((512 << 20)) /dev/urandom >"$work/src.raw"
nbd_measure() { # label
    local t0 t1
    "$loadgen" --addr "127.0.0.1:$port" --mode randwrite-fua --qd 32 --seconds "$secs" --span $((512 << 20)) --label "$1" --json
    t0=$(date +%s.%N)
    nbdcopy --flush "$work/src.raw" "nbd://127.0.0.1:$port"
    t1=$(date +%s.%N)
    python3 -c "print('{\"label\": \"$1\", \"mode\": \"nbdcopy-512M-in\", \"seconds\": %.2f}' % ($t1 - $t0))"
    kill -TERM "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""
}
echo "== NBD: jbdev serve rbd:rbd/nbd-$run_id (internal journal, on RBD)"
"$jbdev" format "rbd:rbd/nbd-$run_id" --size 1G >/dev/null 2>&1
"$jbdev" serve "rbd:rbd/nbd-$run_id" --listen "127.0.0.1:$port" 2>"$work/serve.log" &
server_pid=$!
wait_port
nbd_measure jbdev-serve-rbd
port=$((port + 1))
if qemu-img --help 2>/dev/null | grep -q "Supported formats:.* rbd" && \
   qemu-img info "rbd:rbd/nbd-$run_id" >/dev/null 2>&1; then
    echo "== NBD: qemu-nbd -f raw rbd:rbd/qnbd-$run_id"
    rbd create "rbd/qnbd-$run_id" --size 1G
    qemu-nbd -t -f raw --cache=none -b 127.0.0.1 -p "$port" "rbd:rbd/qnbd-$run_id" &
    server_pid=$!
    wait_port
    nbd_measure qemu-nbd-rbd
else
    echo "qemu-nbd: the installed qemu ($(qemu-img --version | head -1)) has no rbd block driver (qemu-block-extra of the same version is not installable here): not measured"
fi
