#!/usr/bin/env bash
# Runs every test of jbdev on a fresh Debian 12 machine (as root): installs
# the tools the tests drive (fio, qemu-utils, libnbd tools, e2fsprogs, …),
# then the workspace tests, then a short fuzz run of every decoder.
#   scripts/test.sh                 # everything (15-25 minutes on 2 cores)
#   FUZZ_SECONDS=0 scripts/test.sh  # skip the fuzz smoke run
#   JBDEV_RBD_TESTS=0 scripts/test.sh  # skip the Ceph RBD tests (issue 14)
set -euo pipefail
cd "$(dirname "$0")/.."

# libssl-dev and pkg-config build the server's TLS-PSK support (the openssl
# crate); openssl makes the TLS tests' certificates, gnutls-bin has psktool.
# nbdfuse mounts an nbdkit store as a file on FUSE (crates/device/tests/fuse_dsync.rs).
PACKAGES=(fio qemu-utils libnbd-bin python3-libnbd nbdkit nbdfuse e2fsprogs gcc g++ pkg-config libssl-dev openssl gnutls-bin valgrind util-linux curl)
# The RBD backend's tests run a throwaway single-node Ceph cluster
# (scripts/ceph-test-cluster.sh; Debian 12: Ceph 16.2, ~30 s to install).
RBD=${JBDEV_RBD_TESTS:-1}
if [ "$RBD" = 1 ]; then
    PACKAGES+=(ceph-mon ceph-osd ceph-mgr ceph-common librbd-dev librados-dev)
fi
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "test.sh: missing packages ${missing[*]}; run as root (or install them) first" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo doc (broken or private intra-doc links fail)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
echo "== dependencies: unused (cargo-machete), licenses and duplicate versions (deny.toml)"
# Installing cargo-machete on a fresh machine takes ~1.5 minutes; cargo-deny
# ~5 minutes (a quarter of this script's budget), so cargo-deny runs when it
# is installed (or JBDEV_INSTALL_CARGO_DENY=1 installs it) and otherwise
# scripts/check-deps.py checks the same deny.toml rules with cargo alone.
# Advisories need the RustSec database, which is not fetched: they are
# checked only when a copy is in ~/.cargo/advisory-dbs.
command -v cargo-machete >/dev/null || cargo install --locked cargo-machete
cargo machete
if [ "${JBDEV_INSTALL_CARGO_DENY:-0}" = 1 ] && ! command -v cargo-deny >/dev/null; then
    cargo install --locked cargo-deny
fi
if command -v cargo-deny >/dev/null; then
    deny_checks=(licenses bans sources)
    if [ -d "$HOME/.cargo/advisory-dbs" ]; then deny_checks+=(advisories); fi
    cargo deny --offline check "${deny_checks[@]}"
else
    python3 scripts/check-deps.py
fi
echo "== cargo test"
cargo test --workspace --no-fail-fast
if [ "$RBD" = 1 ]; then
    echo "== cargo clippy and tests with --features rbd (throwaway Ceph cluster)"
    rbd_crates=(-p jbdev-device -p jbdev-volume -p jbdev-bench -p jbdev)
    cargo clippy "${rbd_crates[@]}" --features rbd --all-targets -- -D warnings
    export JBDEV_CEPH_DIR="${JBDEV_CEPH_DIR:-$(mktemp -d /tmp/jbdev-ceph-XXXXXX)}"
    # (the test fixture serializes starts with the lock file DIR.lock)
    trap 'scripts/ceph-test-cluster.sh stop "$JBDEV_CEPH_DIR"; rm -f "$JBDEV_CEPH_DIR.lock"' EXIT
    scripts/ceph-test-cluster.sh start "$JBDEV_CEPH_DIR"
    # A cluster that cannot start fails here, never passes as a skip.
    export JBDEV_REQUIRE_CEPH=1
    cargo test --no-fail-fast --features rbd -p jbdev-device --test rbd
    cargo test --no-fail-fast --features rbd -p jbdev-device --lib rbd
    cargo test --no-fail-fast --features rbd -p jbdev-volume --test model rbd
    cargo test --no-fail-fast --features rbd -p jbdev-volume --test rbd_open
    cargo test --no-fail-fast --features rbd -p jbdev-bench --test rbd
    cargo test --no-fail-fast --features rbd -p jbdev-bench --lib rbd
    cargo test --no-fail-fast --features rbd -p jbdev --test nbd_crash --test nbd_interop --test cli_admin rbd
    scripts/ceph-test-cluster.sh stop "$JBDEV_CEPH_DIR"
    rm -f "$JBDEV_CEPH_DIR.lock"
    trap - EXIT
fi
if [ "${FUZZ_SECONDS:-5}" != "0" ]; then
    echo "== fuzz smoke (${FUZZ_SECONDS:-5}s per target)"
    FUZZ_SECONDS="${FUZZ_SECONDS:-5}" scripts/fuzz-smoke.sh
fi
echo "== all tests passed"
