//! The error type of the shared-memory layer (segments, rings, wake-ups).

/// What can go wrong with a shared-memory segment or ring. Every variant says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    /// `/dev/shm` (the tmpfs behind named segments) has less free space than a named
    /// segment needs. Enlarge it — `docker run --shm-size=<bytes>`; in Kubernetes an
    /// `emptyDir` with `medium: Memory` and a `sizeLimit` of at least `needed` mounted at
    /// `/dev/shm`; on a host `mount -o remount,size=<bytes> /dev/shm` — remove stale segments
    /// (`vans-shm clean`), or use smaller rings.
    #[error(
        "{path} has {available} bytes free but this shared-memory segment needs {needed} bytes: \
         enlarge it (docker: --shm-size; Kubernetes: an emptyDir with medium: Memory and \
         sizeLimit >= {needed} mounted at /dev/shm; host: mount -o remount,size=<bytes> \
         /dev/shm), remove stale segments with `vans-shm clean`, or use smaller rings"
    )]
    ShmTooSmall {
        /// Bytes the segment needs (its length rounded up to whole pages).
        needed: u64,
        /// Bytes free for unprivileged users when the check ran.
        available: u64,
        /// The shared-memory file system that is too small (`/dev/shm`).
        path: std::path::PathBuf,
    },
    /// A named segment's name (or a `shm:` address) does not have the form
    /// `vans-<uid>-<pid>-<pid namespace>-<16 hex digits>`. Nothing was opened; check the
    /// address the peer announced.
    #[error("not a vans shared-memory segment name: {name:?}: {reason}")]
    BadName {
        /// The offending name, as received (possibly truncated for display).
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A named-segment rendezvous did not complete: the listener is closed, refused the
    /// connection segment, or did not accept within the timeout (it may have exited; `vans-shm
    /// list` shows whether its owner still runs). Retry, or check the listener's log.
    #[error("no shared-memory connection to {address}: {reason}")]
    Rendezvous {
        /// The listener's address (`shm:vans-…`).
        address: String,
        /// What happened.
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
    /// The van's shared arena has no free run of blocks for a buffer: peers still hold
    /// earlier buffers (drop received `Bytes` sooner), or the arena is too small (raise
    /// `IpcOptions::arena_bytes` / `VANS_IPC_ARENA_BYTES`). Ordinary memory still works.
    #[error(
        "shared arena full: {needed} bytes wanted, {free} of {capacity} free; release received \
         buffers sooner or raise VANS_IPC_ARENA_BYTES"
    )]
    ArenaFull {
        /// Bytes asked for.
        needed: usize,
        /// Bytes free in the arena.
        free: usize,
        /// The arena's size.
        capacity: usize,
    },
}

impl IpcError {
    /// An [`IpcError::Os`] from the error number a failed call returned.
    #[cfg(target_os = "linux")]
    pub(crate) fn os(call: &'static str, errno: rustix::io::Errno) -> IpcError {
        IpcError::Os {
            call,
            source: errno.into(),
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
