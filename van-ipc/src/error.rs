//! The error type of the shared-memory layer (segments, rings, wake-ups).

/// What can go wrong with a shared-memory segment or ring. Every variant says what to do.
#[derive(Debug, thiserror::Error)]
pub enum IpcError {
    /// An OS call failed; `call` names it (`memfd_create`, `mmap`, `fallocate`, …). When the
    /// call reserves memory the source's message names how many bytes were needed: free
    /// memory or raise the limit of the cgroup the process runs in.
    #[error("{call} failed: {source}")]
    Os {
        /// The system call or libc function that failed.
        call: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A segment received from a peer is unusable: too small, not sealed against shrinking
    /// (the peer could truncate it and crash us with `SIGBUS`), or its ring header has a bad
    /// magic, version or capacity. Do not use the segment; drop the connection that sent it.
    #[error("unusable shared-memory segment: {reason}")]
    BadSegment {
        /// What is wrong with it.
        reason: String,
    },
    /// The peer wrote something inconsistent into a ring (a cursor out of bounds, a record
    /// longer than the ring, unknown record flags, fragments out of order). Nothing out of
    /// bounds was touched; drop the connection.
    #[error("shared-memory ring corrupted by the peer: {reason}")]
    Corrupt {
        /// What was found.
        reason: String,
    },
    /// A single record larger than the ring accepts: split the message into records of at
    /// most `max` bytes (see `Producer::try_push_message`) or use a larger ring.
    #[error(
        "record of {len} bytes exceeds the ring's limit of {max} bytes per record; fragment it"
    )]
    TooLarge {
        /// The record's payload length.
        len: usize,
        /// The largest payload one record may carry.
        max: usize,
    },
}

impl IpcError {
    /// An [`IpcError::Os`] from `errno` right after a failed call.
    #[cfg(target_os = "linux")]
    pub(crate) fn last_os(call: &'static str) -> IpcError {
        IpcError::Os {
            call,
            source: std::io::Error::last_os_error(),
        }
    }

    /// An [`IpcError::Corrupt`] with the given reason.
    #[cfg(target_os = "linux")]
    pub(crate) fn corrupt(reason: impl Into<String>) -> IpcError {
        IpcError::Corrupt {
            reason: reason.into(),
        }
    }

    /// An [`IpcError::BadSegment`] with the given reason.
    #[cfg(target_os = "linux")]
    pub(crate) fn bad_segment(reason: impl Into<String>) -> IpcError {
        IpcError::BadSegment {
            reason: reason.into(),
        }
    }
}
