//! # van-rdma: an RDMA verbs van
//!
//! [`RdmaVan`] (Cargo feature `rdma`) implements [`van_core::Van`] over reliable-connected
//! (RC) queue pairs, built on the `ibverbs` crate (device list, GID table) and its raw
//! `ibverbs-sys` bindings behind a small owning wrapper ([`verbs`]) for what the safe API
//! lacks (RDMA WRITE_WITH_IMM, chosen PSNs, our own registrations). It passes the van-core
//! conformance suite, in-process and across processes, inside a Soft-RoCE guest.
//!
//! - **Connection setup without rdma_cm:** each van listens on a TCP side channel (its
//!   endpoint `host:port`); a dialer and the listener exchange queue-pair attributes (QPN,
//!   random PSN, LID, GID, MTU, receive depth and buffer size, see [`protocol`]), move their
//!   queue pairs to RTR/RTS and confirm with one byte. The side channel stays open: its end
//!   is how a side learns that its peer stopped or died. The GID is chosen automatically
//!   (RoCE v2 with an IPv4 address, else the first RoCE v2, else 0) unless
//!   `VANS_RDMA_GID_INDEX` says otherwise; the device is the first with an active port
//!   unless `VANS_RDMA_DEVICE` names one.
//! - **Small frames** (up to the 8 KiB receive buffer, less a 16-byte header) go by SEND:
//!   copied into a registered send slot, sent into a receive buffer the peer posted, and
//!   copied out of it (so the buffer can be posted again at once). Each
//!   posted buffer is a credit; credits come back piggybacked on every header, or in a
//!   credit-only message once half the ring is owed (one credit is kept back for those, so
//!   credit return never deadlocks). `VANS_RDMA_RX_DEPTH` (BytePS: `BYTEPS_RDMA_RX_DEPTH`)
//!   sets the ring depth.
//! - **Large frames** use the rendezvous of BytePS's RDMA van: a `START` announces the
//!   length, the receiver takes a registered buffer from its pool and `REPLY`s with address
//!   and key, and the sender writes the frame there with RDMA WRITE_WITH_IMM; the receiver
//!   decodes it in place, so the message's data segments are slices of registered memory (no
//!   copy on receive). Later frames keep flowing meanwhile; the receiver delivers in order.
//!   At most `VANS_RDMA_START_DEPTH` (BytePS: `BYTEPS_RDMA_START_DEPTH`) are in flight.
//! - **Registration cache** ([`pool`]): registered buffers return to a size-class free list
//!   when their last `Bytes` is dropped and are reused, so repeated pushes of one key
//!   register nothing after the first; `VANS_RDMA_POOL_BYTES` bounds what is kept.
//!   [`van_core::Van::alloc`] hands out pool buffers: segments in them are written to the
//!   peer straight from where they are (zero-copy send); other segments of a large frame are
//!   copied once into a pooled staging buffer.
//! - **Start-up checks:** no device, no driver (provider), no `ib_uverbs`, no kernel support,
//!   a port that is down, a bad GID index, queue depths above the device's `max_qp_wr`,
//!   `max_cqe` or `max_mr_size` (`ibv_query_device`), or a memlock limit below what the van
//!   registers ([`memlock`]) are [`RdmaError`]s naming the cause and the fix, at start.
//! - **Bounded handshakes:** an accepted side channel gets a queue pair and rings only once
//!   it has sent the dialer's attributes and has a turn among `VANS_RDMA_MAX_HANDSHAKES`
//!   handshakes in progress; more wait (a bounded number, within the connect timeout), so a
//!   burst of connections cannot pin memory up to the memlock limit.
//! - **Threads:** one per connection, sleeping in `poll(2)` on its completion channel, an
//!   eventfd rung by `send`, and the side channel. Every wait is bounded.
//! - **Connections** are kept in van-core's link table ([`van_core::link`]), as in every
//!   van: one route per peer, one dial per peer, a spare kept open when two nodes dial each
//!   other at once, lost peers reported. A peer's send queue holds at most 1024 frames, and
//!   at most `VANS_PEER_BUDGET_BYTES` of large ones.
//!
//! - **The protocol without I/O** ([`machine`]): credits, send slots, ordering, the
//!   large-frame rendezvous and the flush are a state machine that the connection's thread
//!   feeds with events (frames, work completions, the peer's end) and whose actions it turns
//!   into verbs calls. It is tested without hardware: unit tests, a property test running two
//!   machines over a simulated queue-pair pair, and a fuzz target (`fuzz/`, `rdma_machine`).
//!
//! Without the `rdma` feature the crate is only [`RdmaError`], the sysfs diagnosis
//! ([`sysfs`]), the memlock check, the protocol codec and its state machine: a default build
//! needs no RDMA packages.
//!
//! ## What was verified, and what was not
//!
//! Verified: everything above on Soft-RoCE (`rdma_rxe`, RoCE v2) inside a QEMU guest, by the
//! conformance suite, the cross-process suite, the large-message and registration-cache
//! tests, and a scheduler + servers + workers cluster with exact sums. Not verified without
//! real hardware: InfiniBand link layers (LID routing, subnet manager), NICs whose
//! `max_sge`, MTU or message size limits differ from rxe's, on-NIC performance (Soft-RoCE in
//! an emulated guest runs at a few hundred Mbit/s), GPUDirect, multiple ports (port 1 is
//! always used), and behaviour under real packet loss and congestion control.
//!
//! Trust model: peers are members of one cluster. A peer that keeps a remote key it was
//! given could write into that buffer later; as with van-ipc's shared memory, vans does not
//! defend against a malicious peer.

// Errors of the van and its start-up checks.
mod error;
// The locked-memory limit check.
pub mod memlock;
// What two vans exchange: QP attributes, message headers.
pub mod protocol;
// The protocol of a connection as a state machine without I/O: credits, ordering, the
// large-frame rendezvous, the flush.
pub mod machine;
// RDMA devices, ports and GIDs as sysfs shows them (no libibverbs needed).
pub mod sysfs;

// Device selection and opening (the `ibverbs` crate's device list and GID table).
#[cfg(feature = "rdma")]
pub mod device;
// The raw verbs behind an owning wrapper.
#[cfg(feature = "rdma")]
pub mod verbs;
// Registered buffers for large messages, reused (the registration cache).
#[cfg(feature = "rdma")]
pub mod pool;
// One connection's queue and ring sizes, checked against the device's limits at start.
#[cfg(feature = "rdma")]
mod sizing;
// The bound on accepted handshakes holding a queue pair and rings at once.
#[cfg(feature = "rdma")]
mod handshakes;
// What a work request's id encodes: the kind of request and its slot or frame.
#[cfg(feature = "rdma")]
mod wr_id;
// One connection's resources (queue pair, rings) and the flags the van shares with it.
#[cfg(feature = "rdma")]
mod connection;
// The thread of a connection: verbs and memory around the state machine.
#[cfg(feature = "rdma")]
mod engine;
// The van.
#[cfg(feature = "rdma")]
mod van;

pub use error::RdmaError;
#[cfg(feature = "rdma")]
pub use pool::PoolStats;
#[cfg(feature = "rdma")]
pub use van::{RdmaOptions, RdmaVan, DEFAULT_SLOT_BYTES};

/// The van kind this crate provides.
pub const KIND: van_core::VanKind = van_core::VanKind::Rdma;

/// Whether this build has the RDMA van (the `rdma` feature).
pub const COMPILED: bool = cfg!(feature = "rdma");

/// Opens the device `settings` select, as the van would, checks the queue depths against it,
/// and describes it in one line; or the error the van would fail with (no device, port down,
/// bad GID, a depth above the device's limits, not compiled in).
pub fn probe(settings: &van_core::config::RdmaSettings) -> Result<String, RdmaError> {
    #[cfg(feature = "rdma")]
    {
        let device = device::open(settings)?;
        let options = RdmaOptions {
            settings: settings.clone(),
            ..RdmaOptions::default()
        };
        options
            .sizes()
            .check(device.context.name(), &device.attributes)?;
        Ok(device.describe())
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = settings;
        Err(RdmaError::NotCompiled)
    }
}
