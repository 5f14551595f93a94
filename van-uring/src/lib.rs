//! # van-uring: the io_uring stream van
//!
//! [`IoUringVan`] implements [`van_core::Van`] over TCP sockets driven by io_uring (Linux
//! 6.0 or later). It is a drop-in alternative to `van-tcp`, selected with
//! `VANS_STREAM_VAN=uring` (feature `uring` of `ps`), and speaks the same wire format, so a
//! uring node and a TCP node talk to each other.
//!
//! ## Design
//!
//! - **Ring per thread, share-nothing** (as in Seastar). The van starts
//!   [`UringOptions::threads`] I/O threads (`VANS_URING_THREADS`, or the seed deployments'
//!   `SEASTAR_CORE_NUMBER`, `NETWORK_PS_CORE_NUMBER`, `NETWORK_WORKER_CORE_NUMBER`); each
//!   owns one ring, one provided-buffer ring and the connections assigned to it (round
//!   robin), and nothing else touches them. Threads are optionally pinned to cores
//!   (`VANS_PIN_CORES`, or StarServer's `PS_DISABLE_PIN_CORES` / `WORKER_DISABLE_PIN_CORES`
//!   set to 0). With busy polling (`VANS_BUSY_POLLING`) a ring gets an SQPOLL kernel thread
//!   and the I/O thread spins on its completion queue before it sleeps; where SQPOLL is not
//!   permitted the van logs that and runs without it.
//! - **Receiving**: one multishot receive per connection into the thread's provided-buffer
//!   ring. A chunk of at least 32 KiB that starts at a frame boundary becomes the storage of
//!   the frames in it (`Bytes` slices, no copy after the kernel's); smaller chunks are copied
//!   into the connection's pending buffer and the provided buffer goes straight back to the
//!   ring. A frame over 32 KiB is received straight into a buffer of its own: the van
//!   cancels the multishot receive, waits for its last completion (so the two never race for
//!   bytes), then issues plain receives into the frame's buffer — one copy, by the kernel —
//!   and, when the frame is complete, receives one provided buffer at a time while a large
//!   frame may follow, else re-arms the multishot receive. The frames decoded in a round of
//!   completions go to the inbox as one batch of at most about [`MAX_BATCH_EVENTS`].
//! - **Sending**: `send` encodes on the caller's task (errors are returned there) into
//!   `Bytes` parts that reference the payload, and puts them on the peer's bounded queue.
//!   The queue's waker marks the connection ready and wakes the thread through an eventfd
//!   only if the thread is asleep. The thread takes everything queued (up to 256 frames) and
//!   submits one `SENDMSG` of up to 1024 iovecs; one send per connection is in flight at a
//!   time, so frames keep their order, and what queues meanwhile goes in the next one.
//! - **The bridge** to async callers is one channel hop per batch each way: frames through
//!   the peer queue (many per wake-up), events into the inbox (one `Vec` per round). A full
//!   inbox leaves the batch pending and the thread stops receiving until it drains, so
//!   memory stays bounded and TCP flow control pushes back on the senders.
//!
//! ## The SEND_ZC rule
//!
//! A batch of at least [`UringOptions::zc_threshold`] bytes (`VANS_URING_ZC_BYTES`, 64 KiB
//! by default) to a peer that is **not on loopback** goes out as `SENDMSG_ZC`, and the
//! connection drops back to plain sends for good as soon as a notification reports that the
//! kernel copied anyway (`IORING_NOTIF_USAGE_ZC_COPIED`: loopback, or a device without
//! scatter-gather). Loopback peers never use it unless [`UringOptions::zc_loopback`] asks.
//! Why: on loopback the kernel copies the payload whatever the API, and zero-copy adds
//! page pinning and a second completion. Measured on this project's machine (Linux 6.18,
//! loopback, one van pair, `cargo run --release -p van-uring --example send_zc`), forced
//! zero-copy ran at 0.35x of plain sends at 4 KiB, 0.55x at 64 KiB, 0.51x at 1 MiB and 0.70x
//! at 4 MiB. Over a NIC, zero-copy pays once the copy costs more than pinning and the
//! notification, which published measurements put around 10–64 KiB per send; 64 KiB is the
//! conservative end, and the copied report makes a wrong guess cost one notification.
//!
//! ## Buffer ownership
//!
//! No buffer is freed or reused while the kernel may read or write it: each operation's
//! memory is owned by the thread's tables until the operation's last completion (for
//! `SENDMSG_ZC`, its notification too), a connection is dropped only when none of its
//! operations is in flight, provided buffers return to the ring only from completions, and
//! at stop the thread cancels everything and keeps reaping until the kernel has answered.
//! [`IoUringVan::stats`] shows what the kernel holds; the tests cancel mid-send, stop with
//! sends in flight and close peers mid-receive and check that every byte outlived its
//! operation.
//!
//! ## When io_uring is unavailable
//!
//! [`IoUringVan::new`] fails with [`UringError::Unavailable`] — naming the cause
//! (`io_uring_disabled`, a seccomp filter, an old kernel) and the fallback
//! (`VANS_STREAM_VAN=tcp`) — rather than falling back silently.

#[cfg(target_os = "linux")]
mod bufring;
#[cfg(target_os = "linux")]
mod command_queue;
#[cfg(target_os = "linux")]
mod error;
#[cfg(target_os = "linux")]
mod options;
#[cfg(target_os = "linux")]
mod reassembly;
#[cfg(target_os = "linux")]
mod shared;
#[cfg(target_os = "linux")]
mod van;
#[cfg(target_os = "linux")]
mod worker;

/// Events a ring loop gathers for the inbox before it hands them over (more arrive with the
/// last completions it takes: one completion can hold a buffer full of small messages).
pub const MAX_BATCH_EVENTS: usize = 4096;

#[cfg(target_os = "linux")]
pub use error::{UringError, FALLBACK_SETTING, MIN_KERNEL};
#[cfg(target_os = "linux")]
pub use options::{UringOptions, DEFAULT_THREADS, DEFAULT_ZC_THRESHOLD, MAX_THREADS};
#[cfg(target_os = "linux")]
pub use van::{IoUringVan, StatsHandle, UringStats};

/// The van kind this crate provides.
pub const KIND: van_core::VanKind = van_core::VanKind::Uring;
