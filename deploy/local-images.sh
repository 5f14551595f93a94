#!/usr/bin/env bash
# deploy/local-images.sh: the two base images the Dockerfile starts from, made on this machine
# for one that cannot pull from a registry (Docker Hub unreachable, only a Debian mirror):
#   vans/debian:bookworm-slim  a minimal Debian bookworm (debootstrap --variant=minbase)
#   vans/rust:local            that, with gcc and this machine's Rust toolchain (rustup's default)
#                              and the extra CA certificates this machine trusts
#                              (/usr/local/share/ca-certificates: a TLS-inspecting proxy between
#                              the build and crates.io or PyPI is then trusted inside too)
# Then:
#   docker build --network host --build-arg BASE_IMAGE=vans/debian:bookworm-slim \
#       --build-arg RUST_IMAGE=vans/rust:local -t vans:local .
# Needs root, a running Docker engine (Debian's docker.io; where the engine may not touch the
# firewall or bridges: dockerd --iptables=false --bridge=none, hence --network host above),
# debootstrap and rustup. MIRROR overrides the Debian mirror.
set -euo pipefail

mirror="${MIRROR:-http://deb.debian.org/debian}"
for tool in docker debootstrap rustup; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "local-images: $tool not found (Debian: docker.io, debootstrap; rustup from rustup.rs)" >&2
        exit 1
    fi
done
if ! docker info >/dev/null 2>&1; then
    echo "local-images: no Docker engine answers (start one: dockerd --iptables=false --bridge=none)" >&2
    exit 1
fi
toolchain="$(rustup toolchain list | awk '/default/ {print $1; exit}')"
toolchain_dir="$(rustup toolchain list -v | awk -v t="$toolchain" '$1 == t {print $NF; exit}')"
if [ -z "$toolchain" ] || [ ! -x "$toolchain_dir/bin/cargo" ]; then
    echo "local-images: cannot find rustup's default toolchain (got '$toolchain' at '$toolchain_dir')" >&2
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "== local-images: debootstrap bookworm from $mirror"
debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
tar -C "$work/rootfs" -c . | docker import - vans/debian:bookworm-slim
rm -rf "$work/rootfs"

echo "== local-images: vans/rust:local with toolchain $toolchain"
mkdir -p "$work/rust/ca"
cp -a "$toolchain_dir" "$work/rust/toolchain"
rm -rf "$work/rust/toolchain/share/doc"
find /usr/local/share/ca-certificates -name '*.crt' -exec cp {} "$work/rust/ca/" \; 2>/dev/null || true
cat >"$work/rust/Dockerfile" <<'EOF'
FROM vans/debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev ca-certificates pkg-config \
    && rm -rf /var/lib/apt/lists/*
COPY toolchain /usr/local/rust
ENV PATH=/usr/local/rust/bin:$PATH
COPY ca/ /usr/local/share/ca-certificates/
RUN update-ca-certificates
EOF
docker build --network host -t vans/rust:local "$work/rust"
echo "== local-images: done (vans/debian:bookworm-slim, vans/rust:local)"
