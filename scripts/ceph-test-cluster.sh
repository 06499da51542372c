#!/usr/bin/env bash
# A throwaway single-node Ceph cluster for jbdev's RBD tests and benchmarks.
#
#   scripts/ceph-test-cluster.sh start [DIR]   # start (idempotent); prints the conf path
#   scripts/ceph-test-cluster.sh env   [DIR]   # prints CEPH_CONF=... for `eval`
#   scripts/ceph-test-cluster.sh stop  [DIR]   # stop by the recorded PIDs, remove DIR
#
# One mon, one mgr and one memstore OSD (no file at all), all on 127.0.0.1,
# auth none, pool `rbd` of size 1. Everything lives under DIR (default
# $JBDEV_CEPH_DIR or /tmp/jbdev-ceph); the daemons' PIDs are recorded in
# DIR/pids and only those processes are ever stopped.
#
# Needs ceph-mon ceph-osd ceph-mgr ceph-common (Debian 12: Ceph 16.2).
# JBDEV_CEPH_NO_MGR=1 skips the mgr (the cluster then warns, but RBD works).
set -euo pipefail

cmd=${1:-}
dir=${2:-${JBDEV_CEPH_DIR:-/tmp/jbdev-ceph}}
conf="$dir/ceph.conf"

die() {
    echo "ceph-test-cluster: $*" >&2
    [ "${starting:-0}" = 1 ] && [ -f "$dir/log/mkfs.out" ] && tail -5 "$dir/log/mkfs.out" >&2
    [ "${starting:-0}" = 1 ] && stop
    exit 1
}

pid_alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# True if every recorded daemon is alive and the cluster answers.
running() {
    [ -f "$dir/pids" ] || return 1
    local name pid
    while read -r name pid; do
        pid_alive "$pid" || return 1
    done <"$dir/pids"
    timeout 10 ceph -c "$conf" --connect-timeout 5 health >/dev/null 2>&1
}

stop() {
    if [ -f "$dir/pids" ]; then
        local name pid
        while read -r name pid; do
            if pid_alive "$pid"; then kill "$pid" 2>/dev/null || true; fi
        done <"$dir/pids"
        # Bounded wait, then SIGKILL the same PIDs only.
        for _ in $(seq 50); do
            local alive=0
            while read -r name pid; do pid_alive "$pid" && alive=1; done <"$dir/pids"
            [ $alive = 0 ] && break
            sleep 0.1
        done
        while read -r name pid; do
            if pid_alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
        done <"$dir/pids"
    fi
    case "$dir" in
        /tmp/*|/var/tmp/*|/dev/shm/*) rm -rf "$dir" ;;
        *) [ -f "$dir/.jbdev-ceph" ] && rm -rf "$dir" ;;
    esac
}

# Starts a daemon in the foreground mode (-f) in the background and records its PID.
spawn() {
    local name=$1; shift
    "$@" -f -c "$conf" </dev/null >>"$dir/log/$name.out" 2>&1 &
    echo "$name $!" >>"$dir/pids"
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local secs=$1 what=$2; shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || die "timed out after ${secs}s waiting for $what (logs in $dir/log)"
        sleep 0.2
    done
}

start() {
    command -v ceph-mon >/dev/null || die "ceph-mon not installed (apt-get install ceph-mon ceph-osd ceph-mgr ceph-common)"
    command -v ceph-osd >/dev/null || die "ceph-osd not installed"
    if running; then echo "$conf"; return 0; fi
    starting=1
    # A half-started or dead cluster: clear it first.
    if [ -e "$dir" ]; then stop; fi
    # Whatever fails from here on stops what was started.
    trap 'die "a step failed (line $LINENO)"' ERR
    mkdir -p "$dir/log" "$dir/run" "$dir/mon" "$dir/osd" "$dir/mgr"
    touch "$dir/.jbdev-ceph"
    local port=${JBDEV_CEPH_MON_PORT:-$((20000 + RANDOM % 20000))}
    local fsid
    fsid=$(cat /proc/sys/kernel/random/uuid)
    cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$port
public network = 127.0.0.1/32
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
paxos propose interval = 0.1
mon osd reporter subtree level = osd
# Tests freeze the one OSD (SIGSTOP) for up to about 25 s. Its placement
# groups' read leases last heartbeat grace x 0.8 (16 s by default); past
# that they turned "laggy" and, with no peer to renew them, stayed so: ops
# hung for minutes after the OSD resumed and later RBD tests failed with
# ETIMEDOUT (session 23, twice in full runs). 60 s outlasts every freeze.
osd heartbeat grace = 60
osd pool default pg autoscale mode = off
mon data avail warn = 5
mon data avail crit = 1
run dir = $dir/run
log file = $dir/log/\$name.log
pid file = $dir/run/\$name.pid
ms bind ipv4 = true
ms bind ipv6 = false
[mon]
admin socket = $dir/run/\$name.asok
mon data = $dir/mon/\$name
mon initial members = a
[mgr]
admin socket = $dir/run/\$name.asok
mgr data = $dir/mgr/\$name
mgr initial modules =
[osd]
admin socket = $dir/run/\$name.asok
osd data = $dir/osd/\$name
osd objectstore = memstore
memstore device bytes = ${JBDEV_CEPH_OSD_BYTES:-8589934592}
osd max object name len = 256
osd max object namespace len = 64
[client]
admin socket =
rbd cache = false
EOF
    monmaptool --create --clobber --fsid "$fsid" --addv a "[v2:127.0.0.1:$port]" "$dir/monmap" >/dev/null
    ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" >>"$dir/log/mkfs.out" 2>&1 \
        || die "ceph-mon --mkfs failed (see $dir/log)"
    : >"$dir/pids"
    spawn mon ceph-mon -i a
    wait_for 30 "the monitor" ceph -c "$conf" --connect-timeout 3 mon stat
    if [ "${JBDEV_CEPH_NO_MGR:-0}" != 1 ]; then
        mkdir -p "$dir/mgr/mgr.x"
        spawn mgr ceph-mgr -i x
    fi
    local id
    id=$(ceph -c "$conf" osd create)
    mkdir -p "$dir/osd/osd.$id"
    ceph-osd -c "$conf" -i "$id" --mkfs >>"$dir/log/mkfs.out" 2>&1 || die "ceph-osd --mkfs failed (see $dir/log)"
    spawn osd ceph-osd -i "$id"
    wait_for 30 "the OSD to come up" sh -c "ceph -c '$conf' osd stat -f json | grep -q '\"num_up_osds\":1'"
    ceph -c "$conf" osd pool create rbd 8 >/dev/null 2>&1
    ceph -c "$conf" osd pool set rbd size 1 --yes-i-really-mean-it >/dev/null 2>&1 || true
    timeout 60 rbd -c "$conf" pool init rbd || die "rbd pool init failed"
    wait_for 30 "the pool's placement groups" sh -c "timeout 5 rbd -c '$conf' ls rbd"
    trap - ERR
    echo "$conf"
}

case "$cmd" in
    start) start ;;
    stop) stop ;;
    env) [ -f "$conf" ] || die "no cluster in $dir (run: $0 start $dir)"; echo "CEPH_CONF=$conf" ;;
    *) die "usage: $0 start|stop|env [DIR]" ;;
esac
