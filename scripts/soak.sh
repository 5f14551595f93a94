#!/usr/bin/env bash
# scripts/soak.sh SECONDS [SEED]: the chaos soak (docs/src/operators/faults.md). A cluster of real
# processes, 2 servers x 4 workers, with a fault proxy in front of every node and a chaos
# schedule (delay, throttle, blackhole, partition, cut, reset, garbage on every node's port,
# and every 8 s a kill -9 of a worker or a server, started again in its place) while the
# workers push, pull and push-pull and check every sum exactly, with PS_RESEND on.
# Half the time over TCP, half with co-located nodes over shared memory. Exits 1 if any
# update was lost or counted twice, or a node failed.
#
# It runs the binary of the test build (`cargo test --workspace --all-features`), so after
# the tests it starts at once; the test command runs it for 60 s.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds="${1:-60}"
seed="${2:-1}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 2 ]; then
    echo "usage: scripts/soak.sh SECONDS [SEED]  (SECONDS: a whole number, at least 2)" >&2
    exit 2
fi
if ! [[ "$seed" =~ ^[0-9]+$ ]]; then
    echo "usage: scripts/soak.sh SECONDS [SEED]  (SEED: a whole number)" >&2
    exit 2
fi
cargo test --workspace --all-features --no-run -q 2>/dev/null \
    || cargo test --workspace --all-features --no-run
bin="$PWD/target/debug/vans-soak"
half=$(( seconds / 2 ))
echo "== soak over TCP, ${half}s (seed $seed)"
"$bin" --seconds "$half" --van tcp --seed "$seed" --kill-every 8
echo "== soak over shared memory, $(( seconds - half ))s (seed $(( seed + 1 )))"
"$bin" --seconds "$(( seconds - half ))" --van ipc --seed "$(( seed + 1 ))" --kill-every 8
