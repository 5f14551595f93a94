#!/usr/bin/env bash
# The project's test command (README "Quick start"; CI runs exactly this):
# formatting, lints, every test of every crate with every feature, then a short fuzz run.
#   FUZZ_SECONDS=N  seconds per fuzz target (default 10; 0 skips fuzzing)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/setup.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy (all targets, all features, -D warnings)"
cargo clippy --workspace --all-targets --all-features -- -D warnings
echo "== cargo test (workspace, all features)"
cargo test --workspace --all-features
fuzz_seconds="${FUZZ_SECONDS:-10}"
if [ "$fuzz_seconds" != 0 ]; then
    echo "== fuzz smoke run, ${fuzz_seconds}s per target"
    ./fuzz/run.sh "$fuzz_seconds"
fi
echo "== all checks passed"
