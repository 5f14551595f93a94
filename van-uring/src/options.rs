//! [`UringOptions`]: the tuning of an [`IoUringVan`](crate::IoUringVan).

use std::time::Duration;

use van_core::wire::Limits;
use van_core::Config;

/// I/O threads when the configuration names none: one ring serves the few peers of a
/// typical parameter-server node, and more threads on a shared host mostly add wake-ups.
pub const DEFAULT_THREADS: usize = 1;
/// Most I/O threads one van starts.
pub const MAX_THREADS: usize = 256;
/// Default smallest batch sent with `SENDMSG_ZC` to a peer that is not on loopback.
pub const DEFAULT_ZC_THRESHOLD: usize = van_core::config::DEFAULT_URING_ZC_BYTES;

/// Tuning of an [`IoUringVan`](crate::IoUringVan). `Default` suits most jobs;
/// [`UringOptions::from_config`] takes what a [`Config`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UringOptions {
    /// Frame size limits, checked on send and on receive.
    pub limits: Limits,
    /// How long `connect` may take.
    pub connect_timeout: Duration,
    /// Frames queued per peer before `send` waits (back-pressure).
    pub send_queue_depth: usize,
    /// How long `stop` waits for queued frames to be written.
    pub flush_timeout: Duration,
    /// I/O threads, each with its own ring and its own connections (`VANS_URING_THREADS`).
    pub threads: usize,
    /// Pin I/O thread `i` to the `i`-th core of the process's CPU set (`VANS_PIN_CORES`).
    /// Implies [`dedicated_threads`](Self::dedicated_threads).
    pub pin_cores: bool,
    /// Drive each ring from a thread of its own instead of from the application's runtime.
    /// By default (`false`) a van created inside a tokio runtime runs each ring's event loop
    /// as a task of that runtime, so that sends, completions and deliveries stay on the
    /// runtime's threads with no hand-off to another thread per message; outside a runtime,
    /// and with [`pin_cores`](Self::pin_cores) or [`busy_polling`](Self::busy_polling), the
    /// rings get threads.
    pub dedicated_threads: bool,
    /// Poll instead of sleeping (`VANS_BUSY_POLLING`): an SQPOLL kernel thread submits, and the
    /// I/O thread spins on its completion queue for a while before it blocks. Without the
    /// privilege SQPOLL needs, the van logs that and runs without it. Implies
    /// [`dedicated_threads`](Self::dedicated_threads).
    pub busy_polling: bool,
    /// Smallest send batch, in bytes, sent with `SENDMSG_ZC` (`VANS_URING_ZC_BYTES`); `None`:
    /// never. Applies to peers that are not on loopback unless [`zc_loopback`](Self::zc_loopback).
    pub zc_threshold: Option<usize>,
    /// Use `SENDMSG_ZC` for loopback peers too, and keep using it when the kernel reports
    /// that it copied (for tests and measurements: on loopback the kernel always copies, and
    /// zero-copy is slower than a plain send).
    pub zc_loopback: bool,
    /// Bytes of each provided receive buffer.
    pub recv_buffer_bytes: usize,
    /// Provided receive buffers per I/O thread (a power of two, at most 32768).
    pub recv_buffers: u16,
    /// Submission-queue entries per ring (the completion queue is four times larger).
    pub ring_entries: u32,
    /// Bytes of large frames (64 KiB and up) one peer's queue may hold before `send` waits
    /// (0: no limit); small frames never wait for it. See [`van_core::budget::ByteBudget`].
    pub peer_budget_bytes: usize,
    /// Idle bytes of large-frame buffers kept for reuse across the van's connections (0:
    /// every large frame gets fresh memory); see [`van_core::FramePool`].
    pub frame_pool_bytes: usize,
    /// Authentication of every connection (the cluster secret); none by default.
    pub auth: van_core::auth::AuthOptions,
    /// Make ring setup fail as if io_uring were unavailable (for tests of the fallback path
    /// that cannot install a seccomp filter).
    pub simulate_unavailable: bool,
}

impl Default for UringOptions {
    fn default() -> UringOptions {
        UringOptions {
            limits: Limits::default(),
            connect_timeout: Duration::from_secs(10),
            send_queue_depth: 4096,
            flush_timeout: Duration::from_secs(10),
            threads: DEFAULT_THREADS,
            pin_cores: false,
            dedicated_threads: false,
            busy_polling: false,
            zc_threshold: Some(DEFAULT_ZC_THRESHOLD),
            zc_loopback: false,
            recv_buffer_bytes: 64 << 10,
            recv_buffers: 64,
            ring_entries: 512,
            peer_budget_bytes: van_core::budget::DEFAULT_BUDGET_BYTES,
            frame_pool_bytes: van_core::pool::DEFAULT_POOL_BYTES,
            auth: van_core::auth::AuthOptions::default(),
            simulate_unavailable: false,
        }
    }
}

impl UringOptions {
    /// Options from `config`: limits, connect timeout, I/O threads, pinning, busy polling,
    /// the zero-copy threshold and authentication.
    pub fn from_config(config: &Config) -> UringOptions {
        UringOptions {
            limits: config.limits,
            connect_timeout: config.connect_timeout,
            threads: config.io_threads.map_or(DEFAULT_THREADS, |n| {
                usize::try_from(n).unwrap_or(MAX_THREADS)
            }),
            pin_cores: config.pin_io_threads,
            busy_polling: config.busy_polling,
            zc_threshold: config.uring_zc_bytes,
            peer_budget_bytes: config.peer_budget_bytes,
            frame_pool_bytes: config.frame_pool_bytes,
            auth: van_core::auth::AuthOptions::from_config(config),
            ..UringOptions::default()
        }
    }

    /// The number of threads actually started (1..=[`MAX_THREADS`]).
    pub(crate) fn thread_count(&self) -> usize {
        self.threads.clamp(1, MAX_THREADS)
    }

    /// Provided buffers per thread, rounded to a power of two within the kernel's bounds.
    pub(crate) fn ring_buffers(&self) -> u16 {
        self.recv_buffers.clamp(8, 1 << 15).next_power_of_two()
    }

    /// Bytes per provided buffer, kept to whole 4 KiB pages within sane bounds.
    pub(crate) fn buffer_bytes(&self) -> usize {
        self.recv_buffer_bytes
            .clamp(4096, 16 << 20)
            .next_multiple_of(4096)
    }
}
