//! Named shared-memory segments in `/dev/shm`, for two processes that share `/dev/shm` but
//! cannot share a Unix socket.
//!
//! # When this mode is used
//!
//! The default transport passes anonymous memfd segments over an abstract Unix socket
//! ([`crate::segment`]): nothing to name, nothing to guess, nothing left after a crash. But
//! abstract sockets live in a *network* namespace, so two containers with separate network
//! namespaces that share an IPC namespace or a `/dev/shm` mount (`docker run --ipc=container:…`,
//! a host `/dev/shm` mounted into both) cannot meet that way. Here they meet through files in
//! `/dev/shm` instead:
//!
//! - [`NamedListener::bind`] creates an **accept queue** segment; its name is the address
//!   (`shm:vans-…`), announced however the ps layer announces endpoints.
//! - [`connect`] creates a **connection** segment holding both rings, posts its name in a
//!   free slot of the accept queue and wakes the listener through a futex in the queue;
//!   [`NamedListener::accept`] opens it, validates it, and both sides **unlink the name as
//!   soon as both have mapped it**, so a connection leaves nothing behind once its handshake
//!   is done. The accept queue lives as long as the listener.
//! - **Liveness** cannot use a socket's end-of-file, and a peer's pid means nothing across
//!   pid namespaces, so each side bumps a heartbeat word in the connection segment
//!   ([`Liveness::beat`], every [`HEARTBEAT_INTERVAL`]) and polls the other's
//!   ([`Liveness::status`]): no change for [`HEARTBEAT_TIMEOUT`] means the peer is dead.
//! - What a crash can leave — an accept queue whose listener died, a connection segment whose
//!   dialer died before the handshake — is found by [`list_segments`] and removed by
//!   [`clean_stale`] (and the `vans-shm list|clean` command), which every named-mode
//!   [`IpcVan`](crate::IpcVan) runs when it binds, when it learns of a peer's death and
//!   when it stops (a dialer checks the listener's lock instead of waiting it out). The
//!   creator of a segment holds an exclusive `flock` on it until it dies (the kernel drops
//!   it however the process ends), so a free lock on an initialized segment means a dead
//!   creator, in any pid namespace ([`layout::OWNER_LOCK_VERSION`]).
//!
//! # Names and permissions
//!
//! A segment is `/dev/shm/vans-<uid>-<pid>-<pid namespace>-<16 hex digits>` ([`SegmentName`]):
//! the creator's effective uid, its pid and the inode of its pid namespace (so that a
//! cleaner in another pid namespace knows it cannot judge the pid), and 64 bits from
//! `getrandom`, so other local users cannot guess a name. Files are created with
//! `O_CREAT | O_EXCL` and mode 0600, and the memory is reserved up front (as
//! `posix_fallocate` does), after a `statvfs` check of `/dev/shm`: a full `/dev/shm` is an
//! [`IpcError::ShmTooSmall`](crate::IpcError::ShmTooSmall) naming the bytes needed, never a
//! `SIGBUS` later. An opener refuses symlinks (`O_NOFOLLOW`), files that are not regular,
//! files owned by another uid and files with any group or other permission bit.
//! `/dev/shm` is sticky, so once a name is seen to belong to our uid no other user can
//! replace it.
//!
//! **Trust.** Unlike a memfd, a named file cannot be sealed, so a process of the *same* uid
//! could truncate it under our mapping and make us fault. Such a process can already
//! `ptrace` us; named segments only ever connect processes of one uid, and every value read
//! from a shared segment is validated, so a buggy peer produces typed errors, not panics.
//!
//! # One descriptor, checked and mapped
//!
//! [`NamedSegment`] opens, sizes, reserves, checks and maps a segment itself with rustix,
//! through one descriptor, because each step is part of this mode's safety:
//!
//! - **Send + Sync:** the mapping is a small owned type (unmapped in its `Drop`, exactly
//!   once) whose `Send + Sync` proof is its own, so a segment can move between threads and be
//!   shared by the van's tasks.
//! - **Reservation:** `ftruncate` alone makes a sparse file whose pages are allocated on first
//!   touch, so a full `/dev/shm` would kill us with `SIGBUS` mid-run. The file is reserved as
//!   `posix_fallocate` does (`fallocate(2)`, else a byte written into every page) before it is
//!   mapped; `ENOSPC` is an [`IpcError::ShmTooSmall`](crate::IpcError::ShmTooSmall).
//! - **Owner checks:** a name in `/dev/shm` can be planted by anyone. The opener opens with
//!   `O_NOFOLLOW | O_NONBLOCK` (no symlink followed, no FIFO to hang on), validates owner,
//!   mode, type and size with `fstat` and maps *that* descriptor, so the file checked is the
//!   file mapped; a size that changes while it is being mapped is refused.
//! - **Timely unlinking:** a name left in `/dev/shm` is memory nobody frees. The creator
//!   removes the name itself as soon as both peers have mapped a connection segment
//!   ([`NamedSegment::unlink`]), on any error during creation, and otherwise when its
//!   handle drops.

mod accept_queue;
mod connection;
mod listener;
mod name;
pub(crate) use name::random_u64;
mod shm;
mod stale;

pub use connection::{
    connect, Liveness, NamedConnection, PeerStatus, Side, DEFAULT_CONNECT_TIMEOUT,
    HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT,
};
pub use listener::NamedListener;
pub use name::{pid_namespace, SegmentName};
pub use shm::{shm_free_bytes, NamedSegment};
pub use stale::{clean_stale, list_segments, stale_segments, CleanReport, OwnerStatus, ShmEntry};

pub(crate) use name::effective_uid;
pub(crate) use shm::is_not_found;

/// Where named segments live: the tmpfs that `shm_open` uses.
pub const SHM_DIR: &str = "/dev/shm";
/// Every name vans gives shared memory starts with this: named segments
/// ([`SegmentName`]: `vans-<uid>-…`) and memfds ([`crate::segment`]), so that `/dev/shm`,
/// `/proc/<pid>/fd` and `/proc/<pid>/maps` show which are ours.
pub const NAME_PREFIX: &str = "vans-";
/// The prefix of a listener's address: `shm:vans-…`.
pub const ADDRESS_PREFIX: &str = "shm:";
/// Longest valid segment name (`vans-` and four maximal fields).
pub const MAX_NAME_BYTES: usize = 64;

/// Byte layouts of the two kinds of named segment. Every integer is in the host's byte order
/// (both sides run on one host) and is read and written only through atomics.
pub mod layout {
    /// From this version on (of either format), the creator holds an exclusive `flock` on the
    /// file from before it writes the magic until it exits
    /// ([`NamedSegment::create`](super::NamedSegment::create)), and the kernel releases it
    /// however the creator dies.
    /// So a file with its magic and such a version whose lock another process can take
    /// belongs to a dead creator, in whatever pid namespace it ran. Files of version 1 hold
    /// no lock: their owners are judged by pid.
    pub const OWNER_LOCK_VERSION: u32 = 2;

    /// The listener's accept queue: a header page, then
    /// [`SLOT_COUNT`](accept_queue::SLOT_COUNT) slots of
    /// [`SLOT_BYTES`](accept_queue::SLOT_BYTES). Dialers post the names of their connection
    /// segments in the slots; the listener takes them.
    ///
    /// | offset | size | field |
    /// | --- | --- | --- |
    /// | 0 | 8 | magic `b"VANSMBOX"` (see [`MAGIC`](accept_queue::MAGIC)), written last with `Release` |
    /// | 8 | 4 | version |
    /// | 12 | 4 | slot count |
    /// | 16 | 4 | bytes per slot |
    /// | 64 | 4 | futex word: the listener sleeps on it, dialers wake it |
    /// | 128 | 4 | `closed`: 1 once the listener is gone |
    /// | 4096 + 128·i | 128 | slot `i`: state word, name length, name (120 bytes) |
    ///
    /// A slot's state word holds the state in its low 8 bits ([`EMPTY`](accept_queue::EMPTY),
    /// [`CLAIMED`](accept_queue::CLAIMED), [`POSTED`](accept_queue::POSTED)) and a generation
    /// in the rest, bumped by every claim so that a stale compare-and-swap cannot hit a
    /// reused slot.
    pub mod accept_queue {
        /// `b"VANSMBOX"` read as a little-endian u64: every version of the format carries it,
        /// so files of any build validate.
        pub const MAGIC: u64 = u64::from_le_bytes(*b"VANSMBOX");
        /// The accept-queue format this build speaks (2: the creator holds the owner lock,
        /// [`OWNER_LOCK_VERSION`](super::OWNER_LOCK_VERSION); the bytes are those of 1).
        pub const VERSION: u32 = 2;
        /// Offset of the magic (u64).
        pub const MAGIC_OFFSET: usize = 0;
        /// Offset of the version (u32).
        pub const VERSION_OFFSET: usize = 8;
        /// Offset of the slot count (u32).
        pub const SLOT_COUNT_OFFSET: usize = 12;
        /// Offset of the slot size (u32).
        pub const SLOT_BYTES_OFFSET: usize = 16;
        /// Offset of the listener's futex word (u32).
        pub const LISTENER_WAITING_OFFSET: usize = 64;
        /// Offset of the `closed` word (u32).
        pub const CLOSED_OFFSET: usize = 128;
        /// Offset of slot 0.
        pub const SLOTS_OFFSET: usize = 4096;
        /// Slots per accept queue: dialers posting at the same moment beyond this wait for one.
        pub const SLOT_COUNT: usize = 64;
        /// Bytes per slot.
        pub const SLOT_BYTES: usize = 128;
        /// Offset of the state word (u32) in a slot.
        pub const SLOT_STATE_OFFSET: usize = 0;
        /// Offset of the name length (u32) in a slot.
        pub const SLOT_NAME_LEN_OFFSET: usize = 4;
        /// Offset of the name bytes in a slot (read and written as u64 words).
        pub const SLOT_NAME_OFFSET: usize = 8;
        /// Room for the name in a slot.
        pub const SLOT_NAME_BYTES: usize = SLOT_BYTES - SLOT_NAME_OFFSET;
        /// Total bytes of an accept-queue segment.
        pub const BYTES: usize = SLOTS_OFFSET + SLOT_COUNT * SLOT_BYTES;
        /// Slot state: free.
        pub const EMPTY: u32 = 0;
        /// Slot state: a dialer is writing a name into it.
        pub const CLAIMED: u32 = 1;
        /// Slot state: a name is ready for the listener.
        pub const POSTED: u32 = 2;
        /// Bits of the state word that hold the state (the rest is the generation).
        pub const STATE_MASK: u32 = 0xff;
    }

    /// A connection: a header page, the ring from dialer to listener, then the ring from
    /// listener to dialer (each a [`crate::ring`] of the same capacity, header included).
    ///
    /// | offset | size | field | written by |
    /// | --- | --- | --- | --- |
    /// | 0 | 8 | magic `b"VANSCONN"`, last, with `Release` | dialer |
    /// | 8 | 4 | version | dialer |
    /// | 16 | 8 | ring capacity in data bytes (power of two) | dialer |
    /// | 64 | 4 | handshake state | both (compare-and-swap) |
    /// | 128 | 4 | futex word: the dialer sleeps on it during the handshake | both |
    /// | 192 | 8 | dialer heartbeat counter | dialer |
    /// | 256 | 8 | listener heartbeat counter | listener |
    /// | 4096 | ring header + capacity | ring dialer → listener | |
    /// | 4096 + ring header + capacity | ring header + capacity | ring listener → dialer | |
    pub mod connection {
        /// `b"VANSCONN"` read as a little-endian u64.
        pub const MAGIC: u64 = u64::from_le_bytes(*b"VANSCONN");
        /// The connection format this build speaks (2: the creator holds the owner lock,
        /// [`OWNER_LOCK_VERSION`](super::OWNER_LOCK_VERSION); the bytes are those of 1).
        pub const VERSION: u32 = 2;
        /// Offset of the magic (u64).
        pub const MAGIC_OFFSET: usize = 0;
        /// Offset of the version (u32).
        pub const VERSION_OFFSET: usize = 8;
        /// Offset of the ring capacity (u64).
        pub const CAPACITY_OFFSET: usize = 16;
        /// Offset of the handshake state (u32).
        pub const STATE_OFFSET: usize = 64;
        /// Offset of the dialer's futex word (u32).
        pub const DIALER_WAITING_OFFSET: usize = 128;
        /// Offset of the dialer's heartbeat counter (u64).
        pub const DIALER_BEAT_OFFSET: usize = 192;
        /// Offset of the listener's heartbeat counter (u64).
        pub const LISTENER_BEAT_OFFSET: usize = 256;
        /// Bytes before the first ring.
        pub const HEADER_BYTES: usize = 4096;
        /// Handshake state: posted by the dialer, not yet taken.
        pub const POSTED: u32 = 1;
        /// Handshake state: the listener mapped it and attached the rings.
        pub const ACCEPTED: u32 = 2;
        /// Handshake state: the dialer gave up (timeout, listener closed) and removed it.
        pub const ABANDONED: u32 = 3;
        /// Handshake state: the listener found it invalid and removed it.
        pub const REFUSED: u32 = 4;
    }
}
