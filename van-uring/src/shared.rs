//! [`Shared`]: what the van and its I/O threads both hold — the options, the link table, the
//! threads' command queues and the counters ([`Stats`]) — and how a new connection is
//! prepared for a thread.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use tokio::sync::oneshot;
use van_core::link::{stream, Connection, FrameQueue, Links};
use van_core::{NodeId, VanKind};

use crate::command_queue::{Command, CommandQueue, NewConnection};
use crate::options::UringOptions;

/// A connection as the link table sees it: its I/O thread ends it when the van stops the
/// threads (so `abort` has nothing to do), or when its peer is declared dead.
struct ConnectionIo {
    id: u64,
    /// The command queue of the thread that serves it.
    thread: std::sync::Weak<CommandQueue>,
}

impl Connection for ConnectionIo {
    fn abort(&self) {}

    /// Asks the connection's thread to close it abortively (the kernel drops what is unsent)
    /// and drop its queue, so that the stop's flush does not wait for a dead peer.
    fn drop_dead(&self) {
        if let Some(queue) = self.thread.upgrade() {
            // A loop that has ended has closed it already.
            let _ = queue.post(Command::Abort(self.id));
        }
    }
}

/// Counters the I/O threads keep, for diagnostics and the buffer-ownership tests.
#[derive(Debug)]
pub(crate) struct Stats {
    pub(crate) connections: AtomicUsize,
    pub(crate) send_ops: AtomicUsize,
    pub(crate) recv_ops: AtomicUsize,
    pub(crate) zc_sends: AtomicU64,
    pub(crate) zc_copied: AtomicU64,
    pub(crate) large_copied: AtomicU64,
    pub(crate) largest_batch: AtomicUsize,
    pub(crate) ring_lent: Vec<AtomicUsize>,
}

impl Stats {
    /// All zero, with a lent-buffer counter for each of `threads` threads.
    fn new(threads: usize) -> Stats {
        Stats {
            connections: AtomicUsize::new(0),
            send_ops: AtomicUsize::new(0),
            recv_ops: AtomicUsize::new(0),
            zc_sends: AtomicU64::new(0),
            zc_copied: AtomicU64::new(0),
            large_copied: AtomicU64::new(0),
            largest_batch: AtomicUsize::new(0),
            ring_lent: (0..threads).map(|_| AtomicUsize::new(0)).collect(),
        }
    }
}

/// The state the van and every I/O thread share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) options: UringOptions,
    /// Buffers of large received frames, shared by every connection of every I/O thread.
    pub(crate) pool: van_core::FramePool,
    pub(crate) links: Links<FrameQueue>,
    /// The address the listener is bound to, once bound.
    pub(crate) local: OnceLock<SocketAddr>,
    /// Authenticates every new connection (see [`van_core::auth`]).
    pub(crate) gate: van_core::auth::Gate,
    /// One per I/O thread: fires when the thread has exited.
    pub(crate) exited: Mutex<Vec<oneshot::Receiver<()>>>,
    next_thread: AtomicUsize,
    /// One per I/O thread, in thread order.
    pub(crate) command_queues: Vec<Arc<CommandQueue>>,
    pub(crate) stats: Stats,
}

impl Shared {
    /// The shared state of a van whose threads read `command_queues` (one each, in order).
    pub(crate) fn new(options: UringOptions, command_queues: Vec<Arc<CommandQueue>>) -> Shared {
        Shared {
            stats: Stats::new(command_queues.len()),
            pool: van_core::FramePool::new(options.frame_pool_bytes),
            gate: van_core::auth::Gate::new(options.auth.clone()),
            options,
            links: Links::new(VanKind::Uring),
            local: OnceLock::new(),
            exited: Mutex::new(Vec::new()),
            next_thread: AtomicUsize::new(0),
            command_queues,
        }
    }

    /// The thread the next connection goes to (round robin).
    pub(crate) fn pick_thread(&self) -> usize {
        self.next_thread.fetch_add(1, Ordering::Relaxed) % self.command_queues.len().max(1)
    }

    /// Prepares a connection for an I/O thread: socket options, its queue, and its entry in
    /// the link table (a route when `peer` is the node dialed). `None` (closing the socket)
    /// when the van has stopped.
    pub(crate) fn new_connection(
        &self,
        stream: std::net::TcpStream,
        remote: SocketAddr,
        peer: Option<NodeId>,
        thread: usize,
    ) -> Option<NewConnection> {
        stream::tune(&stream, &remote);
        let id = self.links.next_id();
        if peer.is_none() {
            // Accepted: within the connection limits, or closed at once (dropped).
            self.links.admit(id, remote.ip(), &self.gate).ok()?;
        }
        let (link, queue) = FrameQueue::new(
            self.options.send_queue_depth,
            self.options.peer_budget_bytes,
        );
        let io = ConnectionIo {
            id,
            thread: self
                .command_queues
                .get(thread)
                .map_or_else(std::sync::Weak::new, Arc::downgrade),
        };
        self.links.add(id, peer, link, Arc::new(io), None).ok()?;
        Some(NewConnection {
            id,
            stream,
            remote,
            peer,
            queue,
        })
    }

    /// Registers a connection (dialed: `peer`; accepted: `None`) and hands it to the ring
    /// of the next I/O thread; that thread's index, or `None` once stopped.
    pub(crate) fn adopt(
        &self,
        stream: std::net::TcpStream,
        remote: SocketAddr,
        peer: Option<NodeId>,
    ) -> Option<usize> {
        let thread = self.pick_thread();
        let new = self.new_connection(stream, remote, peer, thread)?;
        let id = new.id;
        let posted = match self.command_queues.get(thread) {
            Some(queue) => queue.post(Command::Adopt(new)).is_ok(),
            None => false,
        };
        if !posted {
            // The loop has ended (its runtime is gone): the socket closes as the command
            // drops, and the table forgets the connection.
            self.links.closed(id, "the io_uring loop has ended");
            return None;
        }
        Some(thread)
    }

    /// Tells every I/O thread to stop (see [`Command::Stop`]).
    pub(crate) fn stop_threads(&self, flush: bool, deadline: Instant) {
        for command_queue in &self.command_queues {
            // A loop that has ended has nothing left to stop.
            let _ = command_queue.post(Command::Stop { flush, deadline });
        }
    }
}
