//! [`RdmaError`]: why the RDMA van cannot start or a connection cannot be set up. Every
//! message names the cause and the fix.

use van_core::{VanError, VanKind};

/// What can go wrong in the RDMA van.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RdmaError {
    /// This build has no RDMA van: rebuild with the Cargo feature `rdma`.
    #[error("the rdma van is not compiled in; rebuild with the Cargo feature `rdma`")]
    NotCompiled,
    /// No usable RDMA device: no kernel support, no device, no user-space access or no
    /// provider library. The cause says which, and what to do.
    #[error("no RDMA device: {cause}")]
    NoDevice {
        /// Which of the above, with the fix.
        cause: String,
    },
    /// `VANS_RDMA_DEVICE` names a device that does not exist.
    #[error("RDMA device `{wanted}` (VANS_RDMA_DEVICE) not found; devices here: {available}")]
    DeviceNotFound {
        /// The name asked for.
        wanted: String,
        /// The devices libibverbs lists.
        available: String,
    },
    /// The device's port 1 is not up.
    #[error(
        "RDMA device {device} port 1 is not ACTIVE ({detail}); check the link (`ibv_devinfo`, \
         `rdma link`) or pick another device with VANS_RDMA_DEVICE"
    )]
    PortDown {
        /// The device.
        device: String,
        /// What the port reported.
        detail: String,
    },
    /// `VANS_RDMA_GID_INDEX` is not a valid GID of the port.
    #[error(
        "RDMA device {device} has no usable GID at index {index} (VANS_RDMA_GID_INDEX); valid \
         indices: {valid}"
    )]
    BadGidIndex {
        /// The device.
        device: String,
        /// The index asked for.
        index: u32,
        /// The indices with a GID.
        valid: String,
    },
    /// The locked-memory limit is too small for the memory the van registers.
    #[error(
        "memlock limit {limit} is below the {needed} the RDMA van registers \
         (VANS_RDMA_POOL_BYTES plus the rings of one connection); raise it: `ulimit -l \
         unlimited` in the launching shell, `LimitMEMLOCK=infinity` for a systemd unit, \
         `--ulimit memlock=-1` for docker, or lower VANS_RDMA_POOL_BYTES / VANS_RDMA_RX_DEPTH"
    )]
    MemlockTooLow {
        /// The soft limit, readable.
        limit: String,
        /// What the van needs, readable.
        needed: String,
    },
    /// A queue depth asks more of the device than it allows (`ibv_query_device`): checked
    /// when the van starts, so a depth that every connection would fail with is an error
    /// there. Lower the variable named, to at most `largest`.
    #[error(
        "{variable}={value} is more than RDMA device {device} allows: each connection would \
         need {needs}, and the device's {attribute} is {limit}; {}",
        depth_fix(variable, largest)
    )]
    DepthAboveDeviceLimit {
        /// The variable to lower (`VANS_RDMA_RX_DEPTH` or `VANS_RDMA_START_DEPTH`, or their
        /// BytePS names).
        variable: &'static str,
        /// Its value.
        value: u64,
        /// What each connection would ask of the device, in words.
        needs: String,
        /// The device.
        device: String,
        /// The device attribute exceeded (`max_qp_wr`, `max_cqe`, `max_mr_size`).
        attribute: &'static str,
        /// That attribute's value.
        limit: u64,
        /// The largest value of `variable` the device holds with the other settings
        /// unchanged; `None` when none does (lower `VANS_RDMA_START_DEPTH` too).
        largest: Option<u64>,
    },
    /// An accepted side channel was closed before any queue pair or ring was created for it:
    /// `max` handshakes were in progress (`VANS_RDMA_MAX_HANDSHAKES`) and `waiting` more
    /// connections were waiting for their turn already. A burst this large is a flood, or a
    /// cluster whose nodes connect at once and that needs a larger `VANS_RDMA_MAX_HANDSHAKES`.
    #[error(
        "closed the RDMA side channel from {peer} before creating a queue pair: {max} \
         handshakes in progress (VANS_RDMA_MAX_HANDSHAKES) and {waiting} connections waiting \
         for a turn already; if these are cluster nodes, raise VANS_RDMA_MAX_HANDSHAKES"
    )]
    TooManyHandshakes {
        /// The peer's address.
        peer: String,
        /// Handshakes allowed at once.
        max: usize,
        /// Connections that were waiting.
        waiting: usize,
    },
    /// An accepted side channel did not send its queue-pair attributes, or did not get a turn
    /// among the `VANS_RDMA_MAX_HANDSHAKES` handshakes in progress, within the connect
    /// timeout; it was closed before any queue pair or ring was created for it.
    #[error(
        "closed the RDMA side channel from {peer} before creating a queue pair: {what} within \
         {waited:?} (VANS_CONNECT_TIMEOUT_MS; {max} handshakes at once, VANS_RDMA_MAX_HANDSHAKES)"
    )]
    HandshakeNotStarted {
        /// The peer's address.
        peer: String,
        /// What did not happen in time.
        what: &'static str,
        /// How long it was given.
        waited: std::time::Duration,
        /// Handshakes allowed at once.
        max: usize,
    },
    /// A verbs call failed.
    #[error("{call} failed on {device}: {source}")]
    Verbs {
        /// The verb.
        call: &'static str,
        /// The device.
        device: String,
        /// The error it returned.
        #[source]
        source: std::io::Error,
    },
    /// Exchanging queue-pair attributes with a peer failed.
    #[error("RDMA connection setup with {peer}: {reason}")]
    Handshake {
        /// The peer's address.
        peer: String,
        /// What went wrong.
        reason: String,
    },
}

/// What to do about a [`RdmaError::DepthAboveDeviceLimit`].
fn depth_fix(variable: &str, largest: &Option<u64>) -> String {
    match largest {
        Some(largest) => format!("set {variable} to at most {largest}"),
        None => format!(
            "no {variable} fits with the other settings: lower VANS_RDMA_START_DEPTH and \
             VANS_RDMA_RX_DEPTH"
        ),
    }
}

impl From<RdmaError> for VanError {
    fn from(error: RdmaError) -> VanError {
        match error {
            RdmaError::NotCompiled => VanError::NotCompiled {
                kind: VanKind::Rdma,
            },
            RdmaError::Verbs { .. }
            | RdmaError::Handshake { .. }
            | RdmaError::TooManyHandshakes { .. }
            | RdmaError::HandshakeNotStarted { .. } => VanError::Io {
                kind: VanKind::Rdma,
                source: std::io::Error::other(error.to_string()),
            },
            other => VanError::Unsupported {
                kind: VanKind::Rdma,
                reason: other.to_string(),
            },
        }
    }
}

impl From<RdmaError> for van_core::Error {
    fn from(error: RdmaError) -> van_core::Error {
        VanError::from(error).into()
    }
}
