# The vans image: the programs (ps-bench, vans-launch, vans-master, …) built with
# shared memory, io_uring, RDMA and the Kubernetes backend, and the `vans` Python package,
# on Debian bookworm.
#
#   docker build -t vans:latest .
#   docker run --rm vans:latest ps-bench --mode check     # a local cluster inside the container
#   docker run --rm vans:latest vans-doctor               # what this host offers (RDMA, io_uring, …)
#   docker run --rm -p 8470:8470 -e VANS_MASTER_TOKEN=$(openssl rand -hex 32) \
#       vans:latest vans-master --host 0.0.0.0        # beyond loopback only with a token
#
# Any program of the image runs as the command (there is no ENTRYPOINT); the default one
# prints ps-bench's help. deploy/kubernetes/ runs it as TFJob, MXJob and plain Job pods
# (deploy/README.md).
#
# Base images: both stages must be the same Debian release, since the Python wheel built in
# the first is for that release's python3. A site without access to a registry can build
# them locally and point the build at them, e.g. a Debian made with debootstrap and
# imported with `docker import` (plus a Rust toolchain installed into a copy of it for the
# builder):
#
#   sudo debootstrap bookworm rootfs http://deb.debian.org/debian
#   sudo tar -C rootfs -c . | docker import - local/debian:bookworm
#   docker build --build-arg BASE_IMAGE=local/debian:bookworm \
#       --build-arg RUST_IMAGE=local/rust:bookworm -t vans:latest .
#
# The builder still fetches crates (crates.io) and maturin (PyPI); without them, point
# cargo and pip at a local mirror.
#
# Ports: vans-master listens on 8470 (pass `--host 0.0.0.0` and a VANS_MASTER_TOKEN in a
# container). A cluster's
# scheduler listens on DMLC_PS_ROOT_PORT and its other nodes on DMLC_PORT (0: ephemeral):
# deploy/kubernetes/jobs.yaml uses 9000 for both (the scheduler port of its headless
# Service); the TFJob's scheduler listens on the operator's 2222, the MXJob's on 9091.
#
# Shared memory between nodes in different containers: the IPC van passes memfd segments
# over an abstract Unix socket, which works between containers that share a network
# namespace and host name (docker `--network=host`; the containers of one Kubernetes pod
# always do) and needs no /dev/shm. Containers that share only /dev/shm (docker
# `--ipc=host` or `--ipc=container:NAME`, with one `--hostname`) meet through files there
# instead (VANS_IPC_NAMED=1); those segments count against /dev/shm's size (docker
# `--shm-size`; on Kubernetes an emptyDir with `medium: Memory` and a `sizeLimit` mounted
# at /dev/shm). Nodes inside one container need nothing. The RDMA van needs the devices and
# a memlock limit for its registered memory:
# `--device=/dev/infiniband --ulimit memlock=-1`.

ARG RUST_IMAGE=rust:1-bookworm
ARG BASE_IMAGE=debian:bookworm-slim

# ---------------------------------------------------------------------------------------
# builder: the Rust toolchain, the system packages the build needs (cmake and libclang for
# ibverbs-sys's bindgen, libibverbs-dev to link the RDMA van, python3 with its headers,
# venv and pip for the wheel), the sources, and what they compile to: the release binaries
# of the `examples` and `jobs` crates in /out/bin and the `vans` wheel in /wheels.
# ---------------------------------------------------------------------------------------
FROM ${RUST_IMAGE} AS builder
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        cmake make clang libclang-dev libibverbs-dev pkg-config \
        python3 python3-dev python3-venv python3-pip \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# Every program of examples/src/bin and jobs/src/bin; ps-ipc-bench needs `ipc`, `ps-bench
# --van uring` needs `uring`, DMLC_ENABLE_RDMA=1 and vans-doctor's device checks need `rdma`
# (vans-doctor reports the vans of its own build), vans-master's Kubernetes backend and
# `vans-submit --dry-run` need `kubernetes`.
RUN cargo build --release --locked -p examples -p jobs \
        --features examples/ipc,examples/uring,examples/rdma,jobs/ipc,jobs/uring,jobs/rdma,jobs/kubernetes
# The Python package (bindings/python: PyO3, maturin, shared memory on as pyproject.toml
# says), built for the system python3 that the runtime stage has too.
RUN python3 -m venv /opt/maturin \
    && /opt/maturin/bin/pip install --no-cache-dir 'maturin>=1.7,<2' \
    && /opt/maturin/bin/maturin build --release --locked \
        -m bindings/python/Cargo.toml -i /usr/bin/python3 -o /wheels
RUN mkdir -p /out/bin \
    && for bin in ps-bench ps-ipc-bench vans-launch vans-doctor van-bench \
        rendezvous-exchange allreduce-bench vans-master vans-submit vans-soak; do \
        install -m 0755 "target/release/$bin" /out/bin/ || exit 1; \
    done

# ---------------------------------------------------------------------------------------
# runtime: Debian with only what the programs load (libibverbs and the RDMA providers,
# python3 and numpy for the `vans` package), the binaries in /usr/local/bin, the `vans`
# package in the virtual environment /opt/vans (which sees Debian's numpy; its python3 is
# first on PATH), and the unprivileged user `vans` (uid and gid 10001) that everything
# runs as.
# ---------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS runtime
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        libibverbs1 ibverbs-providers python3 python3-numpy python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=builder /out/bin/ /usr/local/bin/
COPY --from=builder /wheels/ /tmp/wheels/
# --no-index: nothing is downloaded; numpy is Debian's (python3-numpy), seen through
# --system-site-packages.
RUN python3 -m venv --system-site-packages /opt/vans \
    && /opt/vans/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels vans \
    && rm -rf /tmp/wheels
ENV PATH=/opt/vans/bin:$PATH
RUN groupadd --gid 10001 vans \
    && useradd --uid 10001 --gid 10001 --create-home --shell /bin/bash vans
# Numeric, so Kubernetes' runAsNonRoot can verify it (the manifests set it).
USER 10001:10001
WORKDIR /home/vans
# vans-master's HTTP service. The scheduler port of deploy/kubernetes/jobs.yaml, 9000
# (DMLC_PS_ROOT_PORT, and DMLC_PORT for the other nodes), is set by the environment and
# published through the manifest's headless Service, so it is not exposed here.
EXPOSE 8470
CMD ["ps-bench", "--help"]
