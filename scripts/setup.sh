#!/usr/bin/env bash
# Installs what the test command needs and is missing: cargo tools (from crates.io) and, once a
# feature needs them, Debian packages. Safe to run again; does nothing when all is present.
set -euo pipefail

# Debian packages the all-features build needs: the RDMA van's `ibverbs-sys` runs cmake and
# bindgen (libclang) over rdma-core's headers and links the system libibverbs. The Soft-RoCE
# guest that runs the RDMA tests installs its own packages (qemu, busybox, ibverbs-providers,
# …) on first use; see scripts/rdma-vm/guest.sh.
# examples/tests/engines.rs starts a cluster with Open MPI's mpirun (and
# examples/tests/collective.rs compiles allreduce-bench's Open MPI side with mpicc), and
# jobs/tests/slurm.rs runs jobs under a single-node Slurm of its own (roles from the engine);
# examples/tests/netns.rs makes its hosts as network namespaces with iproute2's `ip`, and
# examples/tests/network_faults.rs drops packets between them with nftables' `nft`.
APT_PACKAGES=(cmake libclang-dev libibverbs-dev openmpi-bin libopenmpi-dev slurm-wlm munge iproute2 nftables)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
# The C and C++ binding tests compile programs with the system `cc` and `c++`; the Python
# stage needs python3 with venv and pip (the wheel's build tools come from PyPI).
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    missing+=(python3 python3-venv python3-pip)
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}"
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        echo "setup: the Rust component '$component' is missing; install it with: rustup component add $component" >&2
        exit 1
    fi
done

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "setup: installing cargo-fuzz from crates.io"
    cargo install cargo-fuzz --locked --quiet
fi

# The book (docs/, `mdbook build docs` in scripts/test.sh) and its link checker, pinned:
# mdbook-linkcheck 0.7 reads mdbook 0.4's renderer context (mdbook 0.5 changed it), so mdbook
# stays on 0.4. mdbook is built without its `serve`/`watch` features (the test command only
# builds). About 2 and 5 minutes of compiling on 2 cores, once per machine.
MDBOOK_VERSION=0.4.52
MDBOOK_LINKCHECK_VERSION=0.7.7
if [ "$(mdbook --version 2>/dev/null)" != "mdbook v$MDBOOK_VERSION" ]; then
    echo "setup: installing mdbook $MDBOOK_VERSION from crates.io"
    cargo install mdbook --version "$MDBOOK_VERSION" --locked --no-default-features \
        --features search --quiet
fi
if [ "$(mdbook-linkcheck --version 2>/dev/null)" != "mdbook-linkcheck $MDBOOK_LINKCHECK_VERSION" ]; then
    echo "setup: installing mdbook-linkcheck $MDBOOK_LINKCHECK_VERSION from crates.io"
    cargo install mdbook-linkcheck --version "$MDBOOK_LINKCHECK_VERSION" --locked --quiet
fi
