#!/usr/bin/env bash
# Builds every cargo-fuzz target of the repository and runs each one briefly.
#
# Fuzz projects: fuzz/ at the repository root and any crates/*/fuzz/. Each is
# its own Cargo workspace, built with the nightly toolchain (libFuzzer needs
# -Zsanitizer). Installs what is missing: the nightly toolchain (minimal
# profile) and cargo-fuzz.
#
# Environment:
#   FUZZ_SECONDS  seconds to run each target (default 10)
#   FUZZ_TARGETS  space-separated target names to run (default: all)
#
# Exit status is non-zero if any build fails or any target finds a crash;
# the crashing input is left in <fuzz dir>/artifacts/<target>/.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${FUZZ_SECONDS:-10}"

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz-smoke: installing the nightly toolchain (minimal profile)"
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz-smoke: installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

fuzz_dirs=()
for dir in "$root/fuzz" "$root"/crates/*/fuzz; do
    [[ -f "$dir/Cargo.toml" ]] && fuzz_dirs+=("$dir")
done
if [[ ${#fuzz_dirs[@]} -eq 0 ]]; then
    echo "fuzz-smoke: no fuzz projects found" >&2
    exit 1
fi

ran=0
failed=0
for dir in "${fuzz_dirs[@]}"; do
    # cargo fuzz looks for ./fuzz under the directory it runs in.
    project="$(dirname "$dir")"
    echo "fuzz-smoke: building ${dir#"$root"/}"
    (cd "$project" && cargo +nightly fuzz build)
    mapfile -t targets < <(cd "$project" && cargo +nightly fuzz list)
    for target in "${targets[@]}"; do
        if [[ -n "${FUZZ_TARGETS:-}" && " $FUZZ_TARGETS " != *" $target "* ]]; then
            continue
        fi
        echo "fuzz-smoke: running ${dir#"$root"/}:$target for ${seconds}s"
        if (cd "$project" && cargo +nightly fuzz run "$target" -- \
                -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1); then
            ran=$((ran + 1))
        else
            echo "fuzz-smoke: $target FAILED (see ${dir#"$root"/}/artifacts/$target/)" >&2
            failed=$((failed + 1))
        fi
    done
done

echo "fuzz-smoke: $ran passed, $failed failed"
[[ $failed -eq 0 ]]
