//! What one I/O thread owns: the [`Worker`] with its tables of connections ([`Conn`]) and
//! of the sends in the kernel ([`SendOp`]), and the encoding of a completion's user data.
//!
//! The event loop (`worker.rs`) and its sending and receiving halves (`send.rs`, `recv.rs`)
//! all work on these; keeping them here lets each of those files import them without
//! importing the others.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::{SocketAddr, TcpStream};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Waker;
use std::time::Instant;

use bytes::Bytes;
use io_uring::{squeue, types, IoUring};
use tokio::sync::mpsc;
use van_core::link::stream::Closed;
use van_core::link::Frame;
use van_core::van::InboxClosed;
use van_core::{Event, InboxSender, NodeId};

use crate::bufring::BufRing;
use crate::command_queue::{Command, CommandQueue};
use crate::reassembly::Reassembly;
use crate::shared::Shared;

// What a completion is for: the low 8 bits of its user data. Bits 8..24 hold a send slot,
// bits 24.. the connection id.
pub(super) const K_EVENTFD: u64 = 1;
pub(super) const K_RECV_MULTI: u64 = 3;
pub(super) const K_RECV_DIRECT: u64 = 4;
pub(super) const K_SEND: u64 = 5;
pub(super) const K_CANCEL: u64 = 6;

/// The user data of an operation of `kind` on `connection` (and send `slot`).
pub(super) fn user_data(kind: u64, connection: u64, slot: usize) -> u64 {
    (connection << 24) | ((slot as u64 & 0xffff) << 8) | kind
}

/// A send the kernel may still read: everything its SQE points to.
pub(super) struct SendOp {
    pub(super) parts: Vec<Bytes>,
    /// Pointed to by `msg`; points into `parts`.
    #[allow(dead_code)]
    pub(super) iov: Vec<libc::iovec>,
    /// Pointed to by the SQE.
    #[allow(dead_code)]
    pub(super) msg: Box<libc::msghdr>,
    pub(super) zc: bool,
    pub(super) completed: bool,
    pub(super) notification_pending: bool,
}

/// A connection an I/O thread serves.
pub(super) struct Conn {
    pub(super) id: u64,
    /// The socket; closed (taken) once only zero-copy notifications are outstanding, since
    /// an abortive close is what makes the kernel release the pages those wait for.
    pub(super) stream: Option<TcpStream>,
    /// Its descriptor, valid while `stream` is `Some` (operations are only submitted then).
    pub(super) raw_fd: i32,
    pub(super) remote: SocketAddr,
    pub(super) peer: Option<NodeId>,
    pub(super) queue: Option<mpsc::Receiver<Frame>>,
    pub(super) queue_done: bool,
    pub(super) waker: Waker,
    pub(super) reassembly: Reassembly,
    /// A receive into provided buffers is in the kernel (no final completion yet):
    /// multishot, or a single one while [`single_shot`](Self::single_shot) is set.
    pub(super) multishot: bool,
    /// Frames of many buffers arrive here: receive one provided buffer at a time, so the next
    /// large frame's header is seen before more of its body lands in provided buffers (a
    /// multishot receive would copy up to 32 buffers of it before a cancel takes effect);
    /// the body then goes straight into the frame's own buffer. Cleared when a receive
    /// brings only small frames.
    pub(super) single_shot: bool,
    /// A direct receive (into the large frame's buffer) is in the kernel.
    pub(super) direct: bool,
    /// A cancel of the multishot receive was submitted and its target has not ended.
    pub(super) cancel_sent: bool,
    /// Parts not yet submitted, in order.
    pub(super) out: VecDeque<Bytes>,
    pub(super) sends: Vec<Option<SendOp>>,
    /// A send (not a notification) is outstanding: the next waits, to keep the order.
    pub(super) sending: bool,
    pub(super) zc: bool,
    pub(super) closing: bool,
    /// A send failed with this error number: nothing more is written, and the receive ends
    /// the connection once it has taken what the peer sent before the break.
    pub(super) write_error: Option<i32>,
    /// The peer had ended the stream when a receive was armed: single receives from then on
    /// (see `Worker::next_recv`).
    pub(super) peer_done: bool,
}

impl Conn {
    /// No operation of this connection is in the kernel: its memory may be freed.
    pub(super) fn idle(&self) -> bool {
        !self.multishot && !self.direct && self.sends.iter().all(Option::is_none)
    }

    /// Only zero-copy notifications (if anything) are outstanding: the socket may close.
    pub(super) fn only_notifications(&self) -> bool {
        !self.multishot
            && !self.direct
            && self
                .sends
                .iter()
                .all(|op| op.as_ref().is_none_or(|op| op.completed))
    }

    pub(super) fn fd(&self) -> types::Fd {
        types::Fd(self.raw_fd)
    }

    /// Why the connection ends when its receive ends with `closed`: the failed write's error
    /// rather than the end of the stream it caused.
    pub(super) fn ended(&self, closed: Closed) -> Closed {
        match (closed, self.write_error) {
            (Closed::Eof, Some(errno)) => Closed::Io(std::io::Error::from_raw_os_error(errno)),
            (closed, _) => closed,
        }
    }

    /// Everything queued was written (the queue is closed and drained).
    pub(super) fn flushed(&self) -> bool {
        self.queue_done && self.out.is_empty() && !self.sending
    }

    /// The peer acknowledged everything written (or the socket is gone or broken: nothing
    /// left to wait for).
    pub(super) fn acknowledged(&self) -> bool {
        self.stream
            .as_ref()
            .is_none_or(|s| van_core::link::stream::unsent_bytes(s).map_or(true, |n| n == 0))
    }
}

/// A batch of events on its way into the inbox.
pub(super) type Delivery = Pin<Box<dyn Future<Output = Result<(), InboxClosed>> + Send>>;

/// A stop in progress.
pub(super) struct Stopping {
    pub(super) flush: bool,
    pub(super) deadline: Instant,
    /// Set once every connection was closed without waiting for flushes: the kernel has
    /// until then to end every operation.
    pub(super) forced_until: Option<Instant>,
}

/// One ring's event loop and everything it owns: run by a thread of its own, or as a task
/// of the application's runtime.
pub(crate) struct Worker {
    pub(super) index: usize,
    pub(super) ring: IoUring,
    pub(super) bufs: BufRing,
    pub(super) command_queue: Arc<CommandQueue>,
    pub(super) shared: Arc<Shared>,
    pub(super) conns: HashMap<u64, Conn>,
    pub(super) inbox: Option<InboxSender>,
    pub(super) batch: Vec<Event>,
    pub(super) delivering: Option<Delivery>,
    pub(super) delivery_waker: Waker,
    pub(super) eventfd_buf: Box<u64>,
    pub(super) eventfd_armed: bool,
    pub(super) stopping: Option<Stopping>,
    /// Connections waiting to receive again once the inbox has room.
    pub(super) parked: Vec<u64>,
    /// Entries that did not fit in the submission queue, in order.
    pub(super) overflow: VecDeque<squeue::Entry>,
    pub(super) busy: bool,
    pub(super) zc_supported: bool,
    // Scratch space, reused.
    pub(super) commands: Vec<Command>,
    pub(super) ready: Vec<u64>,
    pub(super) cqes: Vec<(u64, i32, u32)>,
    pub(super) frames: Vec<Frame>,
}

// SAFETY: the raw pointers a worker holds (the provided-buffer ring's entries, each send's
// `msghdr` and iovecs) point into memory the worker itself owns (heap allocations and the
// buffer ring's mapping), which does not move when the worker does; they are only used by
// whoever runs the loop, one thread at a time (a thread of its own, or the runtime thread
// polling its task). The ring is not set up with `SINGLE_ISSUER`, so submitting from another
// thread after a move is allowed.
unsafe impl Send for Worker {}
