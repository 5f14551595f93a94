//! The vans a node has (its stream van, shared memory for co-located peers, RDMA when asked
//! for), what it tells peers about the host it shares memory with, and the scheduler a node
//! may host besides its own role.

use std::sync::Arc;

use van_core::{Config, Van, VanKind};

use crate::error::{NodeError, Result};

/// The identity of what this node can share memory with: boot id and host name, and in the
/// default shared-memory mode the network namespace too. That mode meets its peers on
/// abstract Unix sockets, which belong to a network namespace: two containers (or two test
/// "hosts") on one machine with separate network namespaces cannot reach each other there,
/// so they are different hosts and talk TCP. Named mode (`VANS_IPC_NAMED`) meets through
/// files in `/dev/shm`, which such containers may share, so it leaves the namespace out.
pub(super) fn host_identity(config: &Config) -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut identity = format!("{}/{}", boot.trim(), name.trim());
    if !config.ipc_named {
        if let Ok(net) = std::fs::read_link("/proc/self/ns/net") {
            identity.push('/');
            identity.push_str(&net.to_string_lossy());
        }
    }
    identity
}

/// The vans besides the stream van that this build and configuration provide: shared memory
/// for co-located peers (feature `ipc`, unless `DMLC_ENABLE_IPC=0`). The scheduler needs none:
/// its links stay on the stream van.
pub(super) fn extra_vans(config: &Config) -> Vec<Arc<dyn Van>> {
    #[cfg(all(feature = "ipc", target_os = "linux"))]
    if config.enable_ipc && config.role != Some(van_core::Role::Scheduler) {
        let ipc = van_ipc::IpcVan::new(van_ipc::IpcOptions::from_config(config));
        return vec![Arc::new(ipc)];
    }
    let _ = config;
    Vec::new()
}

/// Creates the stream van the configuration asks for.
pub(super) fn stream_van(config: &Config) -> Result<Arc<dyn Van>> {
    if config.enable_rdma.is_enabled()
        && !cfg!(feature = "rdma")
        && config.rdma.fallback == van_core::config::RdmaFallback::None
    {
        // No silent fallback: the user asked for RDMA (ps-lite/BytePS `DMLC_ENABLE_RDMA`).
        return Err(van_core::VanError::NotCompiled {
            kind: VanKind::Rdma,
        }
        .into());
    }
    match config.stream_van {
        #[cfg(feature = "tcp")]
        VanKind::Tcp => Ok(Arc::new(van_tcp::TcpVan::new(
            van_tcp::TcpOptions::from_config(config),
        ))),
        #[cfg(all(feature = "uring", target_os = "linux"))]
        VanKind::Uring => Ok(Arc::new(
            van_uring::IoUringVan::new(van_uring::UringOptions::from_config(config))
                .map_err(van_core::VanError::from)?,
        )),
        VanKind::InProcess => Err(NodeError::InvalidArgument(
            "VANS_STREAM_VAN=inproc needs a shared hub: run the cluster in one process with \
             node::local::LocalCluster"
                .into(),
        )),
        kind => Err(van_core::VanError::NotCompiled { kind }.into()),
    }
}

pub(super) fn endpoint_port(endpoint: &van_core::Endpoint) -> u16 {
    endpoint
        .address
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}
