//! Whether remote peers use RDMA ([`RdmaMode`]), what to do when it cannot be used
//! ([`RdmaFallback`]), and the RDMA van's own settings ([`RdmaSettings`]).

/// Whether remote peers are reached over RDMA (`DMLC_ENABLE_RDMA`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RdmaMode {
    /// Remote peers use the stream van (`DMLC_ENABLE_RDMA=0`, `false` or unset).
    #[default]
    Off,
    /// Remote peers use the RDMA verbs van (`DMLC_ENABLE_RDMA=1`, `true` or `ibverbs`).
    Ibverbs,
}

impl RdmaMode {
    /// Whether RDMA is requested.
    pub fn is_enabled(self) -> bool {
        self == RdmaMode::Ibverbs
    }
}

/// What to do when RDMA is asked for and cannot be used (`VANS_RDMA_FALLBACK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RdmaFallback {
    /// Fail with an error naming the cause (`none`, the default).
    #[default]
    None,
    /// Warn and use the stream van (`tcp`).
    Stream,
}

/// Default receive buffers per RDMA connection (`VANS_RDMA_RX_DEPTH`).
pub const DEFAULT_RDMA_RX_DEPTH: u32 = 128;
/// Default large messages in flight per RDMA connection (`VANS_RDMA_START_DEPTH`).
pub const DEFAULT_RDMA_START_DEPTH: u32 = 16;
/// Default registered memory an RDMA van keeps for reuse (`VANS_RDMA_POOL_BYTES`).
pub const DEFAULT_RDMA_POOL_BYTES: usize = 256 << 20;
/// Default accepted RDMA handshakes that may hold a queue pair and rings at once
/// (`VANS_RDMA_MAX_HANDSHAKES`): with the default depths each holds 2 MiB of registered rings,
/// so a burst of connections locks at most 32 MiB before any of them is established.
pub const DEFAULT_RDMA_MAX_HANDSHAKES: usize = 16;

/// Settings of the RDMA van (`VANS_RDMA_*`, and BytePS's `BYTEPS_RDMA_*` names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaSettings {
    /// `VANS_RDMA_FALLBACK`: what to do when RDMA cannot be used.
    pub fallback: RdmaFallback,
    /// `VANS_RDMA_DEVICE`: the device to open; `None`: the first with an active port.
    pub device: Option<String>,
    /// `VANS_RDMA_GID_INDEX`: the GID index; `None`: chosen automatically.
    pub gid_index: Option<u32>,
    /// `VANS_RDMA_RX_DEPTH` / `BYTEPS_RDMA_RX_DEPTH`: receive buffers per connection.
    pub rx_depth: u32,
    /// `VANS_RDMA_START_DEPTH` / `BYTEPS_RDMA_START_DEPTH`: large messages in flight per
    /// connection.
    pub start_depth: u32,
    /// `VANS_RDMA_POOL_BYTES`: registered memory kept for reuse.
    pub pool_bytes: usize,
    /// `VANS_RDMA_MAX_HANDSHAKES`: accepted connections whose queue pair and rings may exist
    /// at once before their handshake completes; more wait for a turn.
    pub max_handshakes: usize,
}

impl Default for RdmaSettings {
    fn default() -> RdmaSettings {
        RdmaSettings {
            fallback: RdmaFallback::None,
            device: None,
            gid_index: None,
            rx_depth: DEFAULT_RDMA_RX_DEPTH,
            start_depth: DEFAULT_RDMA_START_DEPTH,
            pool_bytes: DEFAULT_RDMA_POOL_BYTES,
            max_handshakes: DEFAULT_RDMA_MAX_HANDSHAKES,
        }
    }
}
