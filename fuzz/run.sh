#!/usr/bin/env bash
# Runs every fuzz target for a bounded time: ./fuzz/run.sh [seconds-per-target]  (default 60)
# Works from any directory. Needs cargo-fuzz (`cargo install cargo-fuzz --locked`); on a stable
# toolchain RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its sanitizer flags.
set -euo pipefail

seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -eq 0 ]; then
    echo "usage: $0 [seconds-per-target]  (a positive whole number, default 60)" >&2
    exit 2
fi

cd "$(dirname "${BASH_SOURCE[0]}")"
export RUSTC_BOOTSTRAP="${RUSTC_BOOTSTRAP:-1}"

cargo fuzz build
for target in $(cargo fuzz list); do
    echo "== $target: ${seconds}s"
    cargo fuzz run "$target" -- -max_total_time="$seconds"
done
