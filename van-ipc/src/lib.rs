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
//!   and no cleaner is needed. The `shared_memory` crate's named segments (unmaintained
//!   since 2022, not `Send`, stale after a crash) would only be needed where two processes
//!   cannot share a Unix socket; that mode is not built yet.
//! - **Frames:** van-core's wire format, copied once into the ring straight from the encoded
//!   parts (fragmented into records of at most a quarter of the ring), and once out when
//!   reassembled. A frame a peer corrupts is rejected like a bad socket frame and the
//!   connection is dropped.
//! - **Threads and wake-ups:** one writer and one reader thread per connection; waits spin
//!   briefly then sleep on a futex in the shared segment (`VANS_BUSY_POLLING` and the
//!   StarServer names make them spin instead). A full ring makes the writer wait: memory is
//!   bounded by the ring and the per-peer queue.
//! - **Liveness:** after the handshake the Unix socket carries nothing; when a process dies
//!   the kernel closes it and the other side reports the peer as lost.
//!
//! Not built yet: buffers a sender allocates directly in shared memory (a push that moves no
//! payload bytes), the named-segment mode and its stale-segment cleaner, and ps-ipc-bench.
//!
//! The shared-memory code is Linux-only (memfd, futex); on other systems the crate compiles
//! to just [`KIND`] and [`IpcError`].

// The crate's error type.
mod error;
#[cfg(target_os = "linux")]
mod fdpass;
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
pub use notify::WaitResult;
#[cfg(target_os = "linux")]
pub use ring::{create_ring, Consumer, Producer};
#[cfg(target_os = "linux")]
pub use segment::Segment;
#[cfg(target_os = "linux")]
pub use van::{IpcOptions, IpcVan};

/// The van kind this crate will provide.
pub const KIND: van_core::VanKind = van_core::VanKind::Ipc;
