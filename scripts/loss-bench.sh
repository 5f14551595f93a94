#!/usr/bin/env bash
# scripts/loss-bench.sh [PERCENT...]: ps-bench between two network-namespace hosts, with the
# server's link losing PERCENT % of its packets each way (nftables), beside the same run with
# no loss, in one go: how much of its throughput the parameter server keeps under loss.
# Default: 0 1 5 20. Needs root, iproute2 and nftables; uses the release ps-bench (built
# first). Host A holds the scheduler and the worker, host B the server; TCP between them.
# With RTO_MIN=MS in the environment, the route between the hosts gets `rto_min MSms` (the
# kernel's floor under TCP's retransmission timeout is 200 ms, which a lost packet on a
# link of 50 us round trips otherwise costs). Everything it makes is deleted on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

losses=("$@")
[ ${#losses[@]} -eq 0 ] && losses=(0 1 5 20)
for p in "${losses[@]}"; do
    if ! [[ "$p" =~ ^[0-9]+(\.[0-9])?$ ]] || [ "$(echo "$p > 100" | bc)" = 1 ]; then
        echo "usage: scripts/loss-bench.sh [PERCENT...]  (each 0 to 100, one decimal at most)" >&2
        exit 2
    fi
done
if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/loss-bench.sh: network namespaces and nftables need root" >&2
    exit 2
fi
for tool in ip nft bc python3; do
    command -v "$tool" >/dev/null 2>&1 || {
        echo "scripts/loss-bench.sh: '$tool' is missing (Debian: apt-get install iproute2 nftables bc python3)" >&2
        exit 2
    }
done
cargo build --release -q -p examples --bin ps-bench
bench="$PWD/target/release/ps-bench"

a="vansloss$$a"
b="vansloss$$b"
cleanup() { ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$a"
ip netns add "$b"
ip -n "$a" link add eth0 type veth peer name eth0 netns "$b"
ip -n "$a" addr add 10.215.0.1/24 dev eth0
ip -n "$b" addr add 10.215.0.2/24 dev eth0
for ns in "$a" "$b"; do
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    if [ -n "${RTO_MIN:-}" ]; then
        ip -n "$ns" route change 10.215.0.0/24 dev eth0 rto_min "${RTO_MIN}ms"
    fi
done

summary=$(cat <<'PY'
import json, sys
report = json.load(sys.stdin)
for c in report["cases"]:
    print("{size} B x{window}: {ops_per_s:.0f} ops/s, {gb_per_s:.3f} GB/s, p50 {p50_us} us, "
          "p99 {p99_us} us".format(**c))
PY
)

# One run: ops/s, GB/s, p50 and p99 of each case.
run() {
    local env=(DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=1 DMLC_PS_ROOT_URI=10.215.0.1 DMLC_PS_ROOT_PORT=9500
        DMLC_INTERFACE=eth0 DMLC_ENABLE_RDMA=0 VANS_CLUSTER_SECRET=loss-bench-secret-0123456789)
    local args=(--mode push --sizes 1024,1048576 --windows 1,64 --seconds 3 --no-raw --json)
    ip netns exec "$a" env "${env[@]}" DMLC_ROLE=scheduler "$bench" "${args[@]}" >/dev/null 2>&1 &
    local s=$!
    ip netns exec "$b" env "${env[@]}" DMLC_ROLE=server "$bench" "${args[@]}" >/dev/null 2>&1 &
    local v=$!
    ip netns exec "$a" env "${env[@]}" DMLC_ROLE=worker "$bench" "${args[@]}" 2>/dev/null \
        | python3 -c "$summary"
    wait "$s" "$v"
}

for p in "${losses[@]}"; do
    per_mille=$(echo "$p * 10 / 1" | bc)
    if [ "$per_mille" -gt 0 ]; then
        ip netns exec "$b" nft -f - <<EOF
add table inet loss
add chain inet loss in { type filter hook input priority 0; }
add chain inet loss out { type filter hook output priority 0; }
add rule inet loss in iifname "eth0" numgen random mod 1000 < $per_mille drop
add rule inet loss out oifname "eth0" numgen random mod 1000 < $per_mille drop
EOF
    fi
    echo "== ${p} % loss each way on the server's link"
    run
    [ "$per_mille" -gt 0 ] && ip netns exec "$b" nft delete table inet loss
done
