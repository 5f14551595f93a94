//! What every part of a connection shares: its flags, what a handshake establishes, and the
//! small helpers the handshake and the van both use.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixStream;
use van_core::link;
use van_core::{VanError, VanKind};

use crate::arena::{PeerArena, RefTable};
use crate::named::Liveness;
use crate::ring::{Consumer, Producer};
use crate::Doorbell;

/// How long a waiting thread or task sleeps before it re-checks whether the connection or
/// the van ended.
pub(super) const WAIT_SLICE: Duration = Duration::from_millis(100);

/// One connection's shared flags.
#[derive(Debug)]
pub(super) struct ConnectionIo {
    /// Set when the connection ends for any reason; threads exit when they see it.
    pub(super) closed: AtomicBool,
    /// Why the liveness watcher ended the connection, when it did (named mode: "no
    /// heartbeat for …"); reported instead of the reader's generic reason.
    pub(super) lost_reason: Mutex<Option<String>>,
}

impl ConnectionIo {
    pub(super) fn new() -> Arc<ConnectionIo> {
        Arc::new(ConnectionIo {
            closed: AtomicBool::new(false),
            lost_reason: Mutex::new(None),
        })
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// The reason the liveness watcher gave, else `reason`.
    pub(super) fn end_reason(&self, reason: &str) -> String {
        self.lost_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| reason.to_owned())
    }
}

impl link::Connection for ConnectionIo {
    /// The writer thread flushes and ends once its queue closes; nothing more to do.
    fn abort(&self) {
        self.close();
    }

    fn is_closed(&self) -> bool {
        ConnectionIo::is_closed(self)
    }
}

/// The arenas of one connection: ours with the peer's reference table, and the peer's.
#[derive(Debug, Default)]
pub(super) struct Arenas {
    pub(super) ours: Option<Arc<RefTable>>,
    pub(super) theirs: Option<PeerArena>,
}

/// How a connection notices that its peer is gone.
#[derive(Debug)]
pub(super) enum Watch {
    /// The handshake socket's end of file (the kernel closes it when the peer dies).
    Socket(UnixStream),
    /// Heartbeats in a named segment (no socket is shared).
    Heartbeat(Liveness),
}

/// A connection a handshake set up, ready to start.
#[derive(Debug)]
pub(super) struct Established {
    pub(super) watch: Watch,
    /// Our end of the outgoing ring (it rings the peer's doorbell, when the peer has one).
    pub(super) producer: Producer,
    /// Our end of the incoming ring.
    pub(super) consumer: Consumer,
    /// What wakes our reader on the runtime: `None` in named mode, where no descriptor can
    /// be passed and a reader thread sleeps on the ring's futex instead.
    pub(super) doorbell: Option<Doorbell>,
    pub(super) arenas: Arenas,
}

/// A fresh name for a ring or a listening socket: purpose, pid, and random bits so that
/// names cannot be guessed by other local users (the segment module adds the `vans-` prefix
/// to rings).
pub(super) fn unique_name(what: &str) -> Result<String, crate::IpcError> {
    let random = crate::named::random_u64()?;
    Ok(format!("{what}-{}-{random:016x}", std::process::id()))
}

/// An I/O error of this van, with its context.
pub(super) fn io_error(context: &str, error: impl std::fmt::Display) -> VanError {
    VanError::Io {
        kind: VanKind::Ipc,
        source: std::io::Error::other(format!("{context}: {error}")),
    }
}
