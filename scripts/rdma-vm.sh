#!/usr/bin/env bash
# Cargo runner that runs a test binary inside a throwaway QEMU guest with a Soft-RoCE device
# (scripts/rdma-vm/guest.sh, which says what the guest is and what it installs on first use),
# so the RDMA van is tested against real verbs:
#
#   CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=scripts/rdma-vm.sh \
#       cargo test -p van-rdma --features rdma --test verbs
#
# or by hand: scripts/rdma-vm.sh TEST-BINARY [ARGS...]
#
# The guest gets VANS_RDMA_REQUIRE_DEVICE=1 (a missing device fails the tests instead of
# skipping them), RUST_BACKTRACE=1, the VANS_* and DMLC_* variables set here, and, when they
# were built beside the test binary, the `ps-bench` and `vans-launch` (and `vans-doctor`)
# binaries that cluster tests start. Environment:
#   RDMA_VM_TIMEOUT  seconds for the whole guest run (default 900)
#   RDMA_VM_MEM      guest MiB (default here 2048: the 64 MiB conformance messages need room)
#   RDMA_VM_CACHE    where the guest's kernel and base image are kept
#                    (default ${XDG_CACHE_HOME:-$HOME/.cache}/vans-rdma-vm)
# and the other RDMA_VM_* settings of scripts/rdma-vm/guest.sh.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ $# -ge 1 ] || { echo "usage: rdma-vm.sh TEST-BINARY [ARGS...]" >&2; exit 125; }
binary=$1; shift
export RDMA_VM_MEM=${RDMA_VM_MEM:-2048}

options=(-t "${RDMA_VM_TIMEOUT:-900}")
while read -r name; do
    [ -z "$name" ] || options+=(-e "$name=${!name}")
done < <(compgen -e | grep -E '^(VANS|DMLC)_' || true)
options+=(-e VANS_RDMA_REQUIRE_DEVICE=1 -e RUST_BACKTRACE=1)
for bin in ps-bench vans-launch vans-doctor; do
    path=$(dirname "$binary")/../$bin
    [ -x "$path" ] && options+=(-c "$(realpath "$path")")
done
exec "$here/rdma-vm/guest.sh" "${options[@]}" "$binary" "$@"
