#!/usr/bin/env bash
# Cargo runner that runs a test binary inside a throwaway QEMU guest with a Soft-RoCE device
# (../shared/tools/rdma-vm/run-in-vm.sh), so the RDMA van is tested against real verbs:
#
#   CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=scripts/rdma-vm.sh \
#       cargo test -p van-rdma --features rdma --test verbs
#
# The guest gets VANS_RDMA_REQUIRE_DEVICE=1 (a missing device fails the tests instead of
# skipping them) and, when they were built beside the test binary, the `ps-bench` and
# `vans-launch` (and `vans-doctor`) binaries that cluster tests start. Environment:
#   RDMA_VM_TOOL     path of run-in-vm.sh (default: ../shared/tools/rdma-vm/run-in-vm.sh)
#   RDMA_VM_TIMEOUT  seconds for the whole guest run (default 900)
#   RDMA_VM_MEM      guest MiB (default here 2048: the 64 MiB conformance messages need room)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tool=${RDMA_VM_TOOL:-$root/../shared/tools/rdma-vm/run-in-vm.sh}
[ -x "$tool" ] || { echo "rdma-vm.sh: $tool not found; set RDMA_VM_TOOL" >&2; exit 125; }
[ $# -ge 1 ] || { echo "usage: rdma-vm.sh TEST-BINARY [ARGS...]" >&2; exit 125; }
binary=$1; shift
export RDMA_VM_MEM=${RDMA_VM_MEM:-2048}
copies=()
for bin in ps-bench vans-launch vans-doctor; do
    path=$(dirname "$binary")/../$bin
    [ -x "$path" ] && copies+=(-c "$(realpath "$path")")
done
start=$(date +%s)
rc=0
"$tool" -t "${RDMA_VM_TIMEOUT:-900}" -e VANS_RDMA_REQUIRE_DEVICE=1 -e RUST_BACKTRACE=1 \
    "${copies[@]}" "$binary" "$@" || rc=$?
echo "rdma-vm.sh: $(basename "$binary") ran in the Soft-RoCE guest in $(( $(date +%s) - start ))s (exit $rc)" >&2
exit $rc
