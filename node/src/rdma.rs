//! The RDMA van of a node (feature `rdma`), made when `DMLC_ENABLE_RDMA` asks for it.
//!
//! Servers and workers open the RDMA device at start, so that no device, no driver, no
//! kernel support or too low a memlock limit is an error before the node joins, naming the
//! cause; `VANS_RDMA_FALLBACK=tcp` turns that error into a warning, and the node then
//! announces no RDMA endpoint, so every peer reaches it over the stream van. The scheduler
//! needs no RDMA van: its links stay on the stream van.

use std::sync::Arc;

use tracing::warn;
use van_core::config::RdmaFallback;
use van_core::{Config, Role, Van};

use crate::error::Result;

/// The RDMA van this node should run, if any; an error when RDMA is asked for, cannot be
/// used, and no fallback is allowed.
pub(crate) fn rdma_van(config: &Config) -> Result<Option<Arc<dyn Van>>> {
    if !config.enable_rdma.is_enabled() || config.role == Some(Role::Scheduler) {
        return Ok(None);
    }
    let fallback = config.rdma.fallback == RdmaFallback::Stream;
    #[cfg(feature = "rdma")]
    match van_rdma::RdmaVan::new(van_rdma::RdmaOptions::from_config(config)) {
        Ok(van) => Ok(Some(Arc::new(van))),
        Err(e) if fallback => {
            warn!(
                "DMLC_ENABLE_RDMA is set but RDMA cannot be used: {e}; VANS_RDMA_FALLBACK=tcp: \
                 every peer is reached over the {} van",
                config.stream_van
            );
            Ok(None)
        }
        Err(e) => Err(van_core::VanError::Unsupported {
            kind: van_core::VanKind::Rdma,
            reason: format!("DMLC_ENABLE_RDMA is set but {e}"),
        }
        .into()),
    }
    #[cfg(not(feature = "rdma"))]
    {
        if fallback {
            warn!(
                "DMLC_ENABLE_RDMA is set but this build has no RDMA van (Cargo feature \
                 `rdma`); VANS_RDMA_FALLBACK=tcp: every peer is reached over the {} van",
                config.stream_van
            );
        }
        Ok(None)
    }
}
