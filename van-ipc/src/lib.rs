//! # van-ipc: a shared-memory van for co-located nodes
//!
//! [`IpcVan`] implements [`van_core::Van`] between processes on one host and passes the
//! van-core conformance suite (`tests/conformance.rs`) plus a two-process echo and crash
//! test (`tests/two_processes.rs`).
//!
//! - **Segments:** each connection has two single-producer single-consumer rings
//!   ([`ring`]), one per direction, in sealed memfd segments ([`segment`], mode 0600,
//!   reserved up front, sealed against shrinking so a peer cannot make us fault). The dialing
//!   side creates them and passes both descriptors over a Unix socket in the abstract
//!   namespace (`SCM_RIGHTS`). **Why memfd:** a memfd has no name in any file system, so it
//!   disappears with the last process that maps it — a crash leaves nothing in `/dev/shm`,
//!   and no cleaner is needed.
//! - **Named mode** ([`named`]): abstract Unix sockets belong to a network namespace, so two
//!   containers that share `/dev/shm` but not a network namespace (`docker run
//!   --ipc=container:…`, a host `/dev/shm` mounted into both) cannot pass memfds. There the
//!   listener creates an *accept queue* file in `/dev/shm` whose name is its address
//!   (`shm:vans-<uid>-<pid>-<pid namespace>-<random>`); a dialer creates a connection
//!   segment holding both rings, posts its name in a slot of the queue and wakes the
//!   listener with a futex; both unlink the name as soon as both mapped it. Liveness is a
//!   heartbeat word per side in the segment (pids mean nothing across pid namespaces). Files
//!   are 0600, created exclusively under unguessable names, and reserved up front after a
//!   `statvfs` check (a small `/dev/shm` is an [`IpcError::ShmTooSmall`] naming the bytes
//!   needed). What a crash leaves — a dead listener's accept queue, a segment never taken —
//!   is judged by an owner lock (an `flock` the creator holds until it dies, which works
//!   across pid namespaces), removed by every live named-mode van when it binds and every
//!   second while it listens, and listed and removed by
//!   [`named::list_segments`]/[`named::clean_stale`] and the `vans-shm list|clean` command.
//!   `shm_open`, the reservation, the owner checks, the mapping and the timely unlinking
//!   are the module's own, on rustix: see the module docs. memfd stays the default
//!   because it needs none of this. `IpcOptions::named`
//!   (`VANS_IPC_NAMED=1`) makes a van listen this way; dialers follow the address.
//! - **Frames:** van-core's wire format, copied once into the ring straight from the encoded
//!   parts (fragmented into records of at most a quarter of the ring), and once out when
//!   reassembled. A frame a peer corrupts is rejected like a bad socket frame and the
//!   connection is dropped.
//! - **Zero copy** ([`arena`]): each van maps one more memfd, its *arena*, and hands it to
//!   every peer at the handshake. [`van_core::Van::alloc`] carves buffers out of it; data
//!   segments that lie in the arena travel as references (block, offset, length) and the
//!   receiver's `Bytes` point into the sender's arena, so a push of such a buffer moves no
//!   payload bytes. The receiver maps the sender's arena read-only. Per-connection counters in shared memory say when the receiver dropped
//!   them; a dead receiver's references are released with it.
//! - **Threads and wake-ups:** one writer and one reader thread per connection; waits spin
//!   briefly then sleep on a futex in the shared segment (`VANS_BUSY_POLLING` and the
//!   StarServer names make them spin instead). A full ring makes the writer wait: memory is
//!   bounded by the ring and the per-peer queue.
//! - **Liveness:** after the handshake the Unix socket carries nothing; when a process dies
//!   the kernel closes it and the other side reports the peer as lost (named mode:
//!   heartbeats).
//!
//! The shared-memory code is Linux-only (memfd, futex); on other systems the crate compiles
//! to just [`KIND`] and [`IpcError`].

// Zero-copy send buffers in a shared arena.
#[cfg(target_os = "linux")]
pub mod arena;
// The crate's error type.
mod error;
#[cfg(target_os = "linux")]
mod fdpass;
// A file mapped shared and read-write, unmapped on drop (memfd and named segments).
#[cfg(target_os = "linux")]
mod mapping;
// Named /dev/shm segments for processes without a shared Unix socket: an accept queue for
// the rendezvous, heartbeats, and the stale-segment lister and cleaner.
#[cfg(target_os = "linux")]
pub mod named;
// Futex wake-ups and the spin-then-sleep wait.
#[cfg(target_os = "linux")]
mod notify;
// SPSC rings of records in a segment: the layout, the producer and the consumer.
#[cfg(target_os = "linux")]
pub mod ring;
// Sealed memfd segments mapped shared: create, receive from a peer, map.
#[cfg(target_os = "linux")]
pub mod segment;
#[cfg(target_os = "linux")]
mod van;

pub use error::IpcError;
#[cfg(target_os = "linux")]
pub use notify::{Doorbell, WaitResult};
#[cfg(target_os = "linux")]
pub use ring::{create_ring, Consumer, Producer};
#[cfg(target_os = "linux")]
pub use segment::Segment;
#[cfg(target_os = "linux")]
pub use van::{IpcOptions, IpcVan};

/// The van kind this crate will provide.
pub const KIND: van_core::VanKind = van_core::VanKind::Ipc;
