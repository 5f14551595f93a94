#!/usr/bin/env bash
# The project's test command (README "Quick start"; CI runs exactly this):
# formatting, the source tree's structure, the book (docs/, with its links checked), lints,
# the API docs (rustdoc, warnings denied),
# every test of every crate with every feature (the C and C++ programs of bindings/c among
# them), a 60 s chaos soak, the Python package built as a wheel and its pytest suite, a
# TensorFlow job on Slurm, the parameter-server cluster over io_uring, the RDMA
# tests again inside a Soft-RoCE guest, then a short fuzz run.
#   FUZZ_SECONDS=N  seconds per fuzz target (default 10; 0 skips fuzzing)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/setup.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== source structure (no import cycle between files, Rust or Python; no file over 800 lines of code)"
python3 scripts/check-structure.py --self-test >/dev/null
python3 scripts/check-structure.py
echo "== the book: mdbook build docs (fails on a link to a chapter or file that does not exist)"
# docs/book.toml's linkcheck backend checks every link between chapters and into the
# repository, offline; the configuration chapter's table is checked by van-core's
# tests/docs_variables.rs in the cargo test step below.
mdbook build docs
echo "== cargo clippy (all targets, all features, -D warnings)"
cargo clippy --workspace --all-targets --all-features -- -D warnings
echo "== cargo doc (workspace, all features, warnings denied: no broken intra-doc link)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --quiet
echo "== cargo test (workspace, all features)"
cargo test --workspace --all-features
echo "== chaos soak, 60 s (scripts/soak.sh: exact sums under faults, PS_RESEND on)"
./scripts/soak.sh 60
echo "== Python bindings: the wheel in a virtual environment, then pytest"
./scripts/python-tests.sh
echo "== a TensorFlow job on Slurm, grpc+vans against grpc (needs the Python environment above)"
# The same test binary as in the cargo test step, whose run skipped this half without it.
venv=${VANS_PY_VENV:-target/py-venv}
case $venv in /*) ;; *) venv=$PWD/$venv ;; esac
VANS_TEST_PYTHON="$venv/bin/python" \
    cargo test --workspace --all-features --test slurm -- tensorflow
echo "== parameter-server cluster tests again with the io_uring stream van"
# The same test binary (no rebuild): every cluster test, with VANS_STREAM_VAN=uring inherited
# by the nodes it launches.
VANS_STREAM_VAN=uring cargo test --workspace --all-features --test cluster
echo "== RDMA tests inside a Soft-RoCE guest (van-rdma conformance, cluster over RDMA)"
# The same test binaries, run by scripts/rdma-vm.sh inside a QEMU guest with an rxe device
# (on this host they only checked the "no RDMA device" error). About 2 minutes under TCG.
# `--workspace --all-features` as above, so nothing is rebuilt: van-rdma's tests/verbs.rs and
# examples' tests/rdma.rs, one guest boot each.
rdma_start=$(date +%s)
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/scripts/rdma-vm.sh" \
    cargo test --workspace --all-features --test verbs --test rdma
echo "== RDMA guest tests took $(( $(date +%s) - rdma_start ))s"
fuzz_seconds="${FUZZ_SECONDS:-10}"
if [ "$fuzz_seconds" != 0 ]; then
    echo "== fuzz smoke run, ${fuzz_seconds}s per target"
    ./fuzz/run.sh "$fuzz_seconds"
fi
echo "== all checks passed"
