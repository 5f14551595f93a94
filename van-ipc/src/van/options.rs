//! [`IpcOptions`]: the tuning of an [`IpcVan`](super::IpcVan).

use std::time::Duration;

use van_core::wire::Limits;
use van_core::Config;

use crate::ring::DEFAULT_RING_BYTES;

/// Spins per wait with busy polling (then the wait re-checks the connection).
pub(super) const BUSY_SPINS: u32 = 1 << 22;
/// Spins before sleeping, in adaptive mode.
const DEFAULT_SPINS: u32 = 2_000;

/// Tuning of an [`IpcVan`](super::IpcVan).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcOptions {
    /// Frame size limits.
    pub limits: Limits,
    /// Bytes of each ring (per direction, per connection); a power of two.
    pub ring_bytes: usize,
    /// Spin forever instead of sleeping on a futex (`VANS_BUSY_POLLING` and the StarServer
    /// names): lowest latency, one core per waiting thread.
    pub busy_polling: bool,
    /// Spins before sleeping in adaptive mode.
    pub spins: u32,
    /// How long `stop` waits for queued frames to be written.
    pub flush_timeout: Duration,
    /// Bytes of the shared arena that [`Van::alloc`](van_core::Van::alloc) carves zero-copy buffers from (see
    /// [`crate::arena`]); 0 disables zero-copy sends. Reserved when the van binds.
    pub arena_bytes: usize,
    /// Listen through an accept queue in `/dev/shm` instead of an abstract Unix socket
    /// (`VANS_IPC_NAMED`): for peers that share `/dev/shm` but not a network namespace (see
    /// [`crate::named`]). Dialers follow the address they are given either way. Zero-copy
    /// buffers need the socket (they travel as memfds), so named connections copy.
    pub named: bool,
    /// Authentication of every socket-mode connection (the cluster secret); none by default.
    /// Named-mode connections rely on file permissions instead (see the crate docs).
    pub auth: van_core::auth::AuthOptions,
}

impl Default for IpcOptions {
    fn default() -> IpcOptions {
        IpcOptions {
            limits: Limits::default(),
            ring_bytes: DEFAULT_RING_BYTES,
            busy_polling: false,
            spins: DEFAULT_SPINS,
            flush_timeout: Duration::from_secs(10),
            arena_bytes: van_core::config::DEFAULT_IPC_ARENA_BYTES,
            named: false,
            auth: van_core::auth::AuthOptions::default(),
        }
    }
}

impl IpcOptions {
    /// Options with the limits, polling switch, arena, mode and authentication of `config`.
    pub fn from_config(config: &Config) -> IpcOptions {
        IpcOptions {
            limits: config.limits,
            busy_polling: config.busy_polling,
            arena_bytes: config.ipc_arena_bytes,
            named: config.ipc_named,
            auth: van_core::auth::AuthOptions::from_config(config),
            ..IpcOptions::default()
        }
    }

    /// Spins before a reader or writer thread sleeps on the futex.
    pub(super) fn spins(&self) -> u32 {
        if self.busy_polling {
            // Long enough to never sleep under load, short enough to notice a stop.
            BUSY_SPINS
        } else {
            self.spins
        }
    }
}
