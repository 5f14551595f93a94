#!/usr/bin/env bash
# scripts/soak.sh [--network] SECONDS [SEED]: the chaos soak (docs/src/operators/faults.md). A
# cluster of real processes, 2 servers x 4 workers, with a fault proxy in front of every node
# and a chaos schedule (delay, throttle, blackhole, partition, cut, reset, garbage on every
# node's port, and every 8 s a kill -9 of a worker or a server, started again in its place)
# while the workers push, pull and push-pull and check every sum exactly, with PS_RESEND on.
# Half the time over TCP, half with co-located nodes over shared memory. Exits 1 if any
# update was lost or counted twice, or a node failed.
#
# With --network (root, iproute2, nftables): the cluster on three network-namespace hosts and
# the faults the kernel's, on the links between them: loss of 1, 5 and 20 %, partitions both
# ways and one way shorter than the heartbeat timeout, a kill -9 every 20 s, and every 45 s a
# host cut off beyond the timeout, whose nodes are replaced on the other cut-able host (so
# that later cuts meet them again, replaced twice and more) and must be fenced when it heals.
#
# It runs the binary of the test build (`cargo test --workspace --all-features`), so after
# the tests it starts at once; the test command runs it for 60 s, without --network.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

network=0
if [ "${1:-}" = "--network" ]; then
    network=1
    shift
fi
usage="usage: scripts/soak.sh [--network] SECONDS [SEED]"
seconds="${1:-60}"
seed="${2:-1}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 2 ]; then
    echo "$usage  (SECONDS: a whole number, at least 2)" >&2
    exit 2
fi
if ! [[ "$seed" =~ ^[0-9]+$ ]]; then
    echo "$usage  (SEED: a whole number)" >&2
    exit 2
fi
if [ "$network" = 1 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "scripts/soak.sh --network: network namespaces and nftables need root" >&2
        exit 2
    fi
    for tool in ip nft; do
        if ! command -v "$tool" >/dev/null 2>&1; then
            echo "scripts/soak.sh --network: '$tool' is missing (Debian: apt-get install iproute2 nftables)" >&2
            exit 2
        fi
    done
fi
cargo test --workspace --all-features --no-run -q 2>/dev/null \
    || cargo test --workspace --all-features --no-run
bin="$PWD/target/debug/vans-soak"
if [ "$network" = 1 ]; then
    echo "== network soak between namespace hosts, ${seconds}s (seed $seed)"
    exec "$bin" --network --seconds "$seconds" --seed "$seed" --kill-every 20 --long-every 45 \
        --replace-across
fi
half=$(( seconds / 2 ))
echo "== soak over TCP, ${half}s (seed $seed)"
"$bin" --seconds "$half" --van tcp --seed "$seed" --kill-every 8
echo "== soak over shared memory, $(( seconds - half ))s (seed $(( seed + 1 )))"
"$bin" --seconds "$(( seconds - half ))" --van ipc --seed "$(( seed + 1 ))" --kill-every 8
