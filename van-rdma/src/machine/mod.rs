//! The protocol of one RDMA connection as a deterministic state machine with no I/O: credits,
//! send slots, the large-frame rendezvous (`START`, `REPLY`, RDMA WRITE_WITH_IMM), ordered
//! delivery, and the flush on stop.
//!
//! Like `node::control`, [`Machine`] touches no device, memory registration, socket or clock.
//! The engine (the connection's thread, `rdma` feature) turns what happens into [`Event`]s —
//! a frame taken from the send queue, a work completion, the peer's end — hands them to
//! [`Machine::handle`], calls [`Machine::pump`] once per round to let it post what it may, and
//! carries out the [`Action`]s that [`Machine::poll`] returns, in order: post a receive, post
//! a SEND from a send slot with the header given, post an RDMA WRITE, reserve or decode a
//! large frame's buffer, deliver a message, close. So the whole protocol is tested without
//! hardware (unit tests, a property test that runs two machines against each other over a
//! simulated queue-pair pair, and a fuzz target feeding arbitrary events).
//!
//! The machine is generic over what it carries: `F`, an outgoing frame (opaque to it; its
//! length comes with it), and `M`, an incoming message (decoded by the engine).
//!
//! # Rules
//!
//! - **Credits.** Each receive buffer the peer posted is a credit; we start with the peer's
//!   receive depth. Every SEND, and the last piece of every RDMA WRITE (WRITE_WITH_IMM), uses
//!   one. Receive buffers we repost are *owed* to the peer and ride back on the next header we
//!   send, or in a credit-only SEND once half our ring is owed. [`RESERVE`] credit is kept
//!   back from everything but credit-only SENDs, so returning credits never deadlocks. A peer
//!   that returns more credits than it has buffers, or sends into a buffer it had no credit
//!   for, ends the connection.
//! - **Send slots and the send queue.** A SEND is copied into one of `rx_depth` send slots,
//!   free again at its completion; every posted work request counts against the send queue's
//!   capacity until it completes.
//! - **Order.** Frames go in queue order: a small one (header and frame fit the peer's buffer)
//!   as a `DATA` SEND, a large one announced by a `START` in its place. The receiver reserves
//!   a buffer and `REPLY`s with its address and key; the sender then writes the frame there,
//!   in pieces of at most the port's message size, the last with the frame's id as immediate
//!   data. Later frames keep flowing meanwhile, and the receiver delivers in announcement
//!   order, holding what arrives behind an unwritten large frame. At most
//!   [`start_limit`] large frames are announced and not completely posted.
//! - **Flush.** After [`Event::Finish`] (the van's stop closed the queue), every queued frame
//!   is sent and written and every send completes; then [`Action::Close`] with
//!   [`End::Flushed`]. After [`Event::PeerClosed`] nothing more is posted, and what the peer
//!   sent before is still delivered.

mod receive;
mod send;

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet, VecDeque};

use crate::protocol::{Header, Kind, RX_DEPTH};

/// Credits kept back for credit-only messages, so that returning credits never deadlocks.
pub const RESERVE: u32 = 1;

/// How many large frames may be announced and not yet fully written: our start depth, but
/// below the peer's receive depth, which bounds the announced frames it holds buffers for
/// (more is a protocol error there, and depths are configured per node).
pub fn start_limit(start_depth: u32, peer_rx_depth: u32) -> usize {
    start_depth.min(peer_rx_depth.saturating_sub(1)).max(1) as usize
}

/// The sizes one connection runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Our receive buffers, and our send slots (kept within [`RX_DEPTH`]).
    pub rx_depth: u32,
    /// The peer's receive buffers: our initial credits.
    pub peer_rx_depth: u32,
    /// Largest SEND the peer accepts, header included (the smaller buffer size of the two).
    pub send_bytes: usize,
    /// Large frames we may have in flight (`VANS_RDMA_START_DEPTH`), before [`start_limit`].
    pub start_depth: u32,
    /// Work requests the send queue holds.
    pub send_queue: u32,
    /// Largest message the port carries: the size of one RDMA WRITE piece.
    pub max_message: usize,
    /// Largest frame a peer may announce.
    pub max_frame: u64,
}

/// What happened, for [`Machine::handle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<F, M> {
    /// A frame taken from the send queue, `len` bytes long (take one while
    /// [`Machine::wants_frame`]).
    Frame {
        /// The frame.
        frame: F,
        /// Its length in bytes.
        len: usize,
    },
    /// The send queue closed (our stop): send everything, then close.
    Finish,
    /// The peer ended the connection: nothing more is posted; what it sent is still delivered.
    PeerClosed,
    /// The SEND from send slot `slot` completed.
    Sent {
        /// The send slot.
        slot: usize,
    },
    /// A piece of the RDMA WRITE of large frame `id` completed; `last` for the piece that
    /// carried the immediate data.
    Wrote {
        /// The large frame's id.
        id: u32,
        /// Whether it was the last piece.
        last: bool,
    },
    /// Receive buffer `slot` holds a SEND from the peer: its header's credits and the rest.
    Received {
        /// The receive buffer.
        slot: usize,
        /// Credits the header returns.
        credits: u16,
        /// What the SEND carries.
        incoming: Incoming<M>,
    },
    /// Receive buffer `slot` was used by the peer's WRITE_WITH_IMM of large frame `id`,
    /// whose last piece was `len` bytes.
    Written {
        /// The receive buffer (its bytes are not used).
        slot: usize,
        /// The immediate data: the frame's id.
        id: u32,
        /// Bytes of the last piece.
        len: usize,
    },
    /// The buffer asked for by [`Action::Reserve`]: where the peer writes frame `id`.
    Reserved {
        /// The large frame's id.
        id: u32,
        /// Address of the buffer.
        addr: u64,
        /// Its remote key.
        rkey: u32,
    },
    /// The message [`Action::Decode`] decoded from large frame `id`.
    Decoded {
        /// The large frame's id.
        id: u32,
        /// The message.
        message: M,
    },
}

/// What a received SEND carries (its [`Header`], with a `DATA` frame decoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming<M> {
    /// A whole frame, decoded.
    Data(M),
    /// Only credits.
    Credit,
    /// The peer has large frame `id` of `len` bytes for us.
    Start {
        /// The frame's id.
        id: u32,
        /// Its length.
        len: u64,
    },
    /// The peer reserved `len` bytes at `addr` (key `rkey`) for our large frame `id`.
    Reply {
        /// The frame's id.
        id: u32,
        /// Bytes reserved.
        len: u64,
        /// Where to write.
        addr: u64,
        /// The remote key.
        rkey: u32,
    },
}

impl<M> Incoming<M> {
    /// What `header` announces; `data` decodes the frame after it, called only for `DATA`.
    pub fn new<E>(header: &Header, data: impl FnOnce() -> Result<M, E>) -> Result<Self, E> {
        Ok(match header.kind {
            Kind::Data => Incoming::Data(data()?),
            Kind::Credit => Incoming::Credit,
            Kind::Start { len } => Incoming::Start { id: header.id, len },
            Kind::Reply { len, addr, rkey } => Incoming::Reply {
                id: header.id,
                len,
                addr,
                rkey,
            },
        })
    }
}

/// What to do, from [`Machine::poll`], in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<F, M> {
    /// Post receive buffer `slot` again.
    PostReceive {
        /// The receive buffer.
        slot: usize,
    },
    /// Encode `header` into send slot `slot`, copy `frame` after it, and post a SEND of it.
    Send {
        /// The send slot.
        slot: usize,
        /// The header, with the credits it returns.
        header: Header,
        /// The frame (`DATA`), or nothing (`CREDIT`, `START`, `REPLY`).
        frame: Option<F>,
    },
    /// Large frame `id` is written next: make its `len` bytes writable from registered
    /// memory and keep them until [`Action::EndWrite`]. Its [`Action::Write`]s follow.
    BeginWrite {
        /// The large frame's id.
        id: u32,
        /// The frame.
        frame: F,
        /// Its length.
        len: usize,
    },
    /// Post an RDMA WRITE of bytes `offset..offset + len` of large frame `id` to
    /// `remote_addr`; the `last` piece is a WRITE_WITH_IMM with `id` as immediate data.
    Write {
        /// The large frame's id.
        id: u32,
        /// First byte of the piece in the frame.
        offset: usize,
        /// Bytes of the piece.
        len: usize,
        /// Where they go.
        remote_addr: u64,
        /// The peer's key for it.
        rkey: u32,
        /// Whether this is the last piece.
        last: bool,
    },
    /// The write of large frame `id` completed: its memory may go.
    EndWrite {
        /// The large frame's id.
        id: u32,
    },
    /// Reserve a registered buffer of `len` bytes for the peer's large frame `id`, and answer
    /// with [`Event::Reserved`].
    Reserve {
        /// The large frame's id.
        id: u32,
        /// Its length.
        len: usize,
    },
    /// The peer wrote large frame `id`: decode the first `len` bytes of its buffer, and answer
    /// with [`Event::Decoded`].
    Decode {
        /// The large frame's id.
        id: u32,
        /// Its length.
        len: usize,
    },
    /// Hand a message to the application (in the peer's order).
    Deliver(M),
    /// The connection is over.
    Close(End),
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Our stop: everything sent was acknowledged (the peer is then told).
    Flushed,
    /// The connection ended: the reason.
    Lost(String),
}

/// Where a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Open,
    /// The peer ended: deliver what arrived, post nothing.
    Draining,
    Closed,
}

/// A frame waiting to be sent or written.
#[derive(Debug)]
struct Queued<F> {
    frame: F,
    len: usize,
}

/// A large frame the peer told us where to write.
#[derive(Debug)]
struct WriteOut<F> {
    id: u32,
    out: Queued<F>,
    addr: u64,
    rkey: u32,
}

/// A large frame being written, in pieces.
#[derive(Debug)]
struct Writing {
    id: u32,
    len: usize,
    addr: u64,
    rkey: u32,
    /// Bytes posted so far.
    posted: usize,
}

/// A reply we owe the peer.
#[derive(Debug)]
struct ReplyOut {
    id: u32,
    len: u64,
    addr: u64,
    rkey: u32,
}

/// Where one of the peer's large frames is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inbound {
    /// Announced; its buffer is being reserved.
    Announced(usize),
    /// Reserved and replied to (or the reply is queued): the peer may write it.
    Replied(usize),
    /// Written; being decoded.
    Decoding,
}

/// A place in the delivery order.
#[derive(Debug)]
enum DeliverySlot<M> {
    Ready(M),
    /// A large frame announced and not yet written and decoded.
    Awaiting(u32),
}

/// One connection's protocol; see the [module docs](self).
#[derive(Debug)]
pub struct Machine<F, M> {
    phase: Phase,
    /// The send queue closed: close once flushed.
    finishing: bool,
    out: VecDeque<Action<F, M>>,

    // Sending.
    send_bytes: usize,
    peer_depth: u32,
    send_queue: u32,
    max_message: usize,
    start_depth: usize,
    /// Credits: the peer's receive buffers we may use.
    credits: u32,
    /// Send slots not in use (the last is used next), and which are in use.
    free_slots: Vec<usize>,
    busy_slots: Vec<bool>,
    /// Work requests in the send queue.
    sq_used: u32,
    next_id: u32,
    /// Frames from the queue not yet sent or announced.
    waiting: VecDeque<Queued<F>>,
    /// Large frames announced, waiting for the peer's reply.
    starts: HashMap<u32, Queued<F>>,
    writes_ready: VecDeque<WriteOut<F>>,
    writing: Option<Writing>,
    /// Large frames posted in full, waiting for their last piece's completion.
    writes: HashSet<u32>,
    replies: VecDeque<ReplyOut>,

    // Receiving.
    max_frame: u64,
    /// Our receive buffers, and which are posted.
    posted: Vec<bool>,
    posted_count: u32,
    /// Buffers reposted and not yet returned to the peer as credits.
    owed: u32,
    /// Owed credits that warrant a credit-only message.
    threshold: u32,
    incoming: HashMap<u32, Inbound>,
    order: VecDeque<DeliverySlot<M>>,
}

impl<F, M> Machine<F, M> {
    /// A connection whose queue pair just connected: every receive buffer of both sides is
    /// posted, nothing is in flight.
    pub fn new(config: Config) -> Self {
        let depth = config.rx_depth.clamp(*RX_DEPTH.start(), *RX_DEPTH.end());
        Machine {
            phase: Phase::Open,
            finishing: false,
            out: VecDeque::new(),
            send_bytes: config.send_bytes,
            peer_depth: config.peer_rx_depth,
            send_queue: config.send_queue,
            max_message: config.max_message.max(1),
            start_depth: start_limit(config.start_depth, config.peer_rx_depth),
            credits: config.peer_rx_depth,
            free_slots: (0..depth as usize).rev().collect(),
            busy_slots: vec![false; depth as usize],
            sq_used: 0,
            next_id: 0,
            waiting: VecDeque::new(),
            starts: HashMap::new(),
            writes_ready: VecDeque::new(),
            writing: None,
            writes: HashSet::new(),
            replies: VecDeque::new(),
            max_frame: config.max_frame,
            posted: vec![true; depth as usize],
            posted_count: depth,
            owed: 0,
            threshold: (depth / 2).max(1),
            incoming: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Takes in what happened; what follows from it is queued for [`Machine::poll`]. Posting
    /// new work waits for [`Machine::pump`], except a frame's, which is tried at once.
    pub fn handle(&mut self, event: Event<F, M>) {
        if self.phase == Phase::Closed {
            return;
        }
        let result = match event {
            Event::Frame { frame, len } => {
                self.waiting.push_back(Queued { frame, len });
                if self.phase == Phase::Open {
                    self.post_queue();
                }
                Ok(())
            }
            Event::Finish => {
                self.finishing = true;
                self.close_if_flushed();
                Ok(())
            }
            Event::PeerClosed => {
                self.phase = Phase::Draining;
                Ok(())
            }
            Event::Sent { slot } => self.on_sent(slot),
            Event::Wrote { id, last } => self.on_wrote(id, last),
            Event::Received {
                slot,
                credits,
                incoming,
            } => self.on_received(slot, credits, incoming),
            Event::Written { slot, id, len } => self.on_written(slot, id, len),
            Event::Reserved { id, addr, rkey } => self.on_reserved(id, addr, rkey),
            Event::Decoded { id, message } => self.on_decoded(id, message),
        };
        if let Err(reason) = result {
            self.fail(reason);
        }
    }

    /// Posts what may be posted now: replies, RDMA writes and credits first (what unblocks
    /// the peer or a started frame), then waiting frames; closes once flushed after
    /// [`Event::Finish`]. Called once per round, after the round's completions.
    pub fn pump(&mut self) {
        if self.phase != Phase::Open {
            return;
        }
        self.post_control();
        self.post_queue();
        self.close_if_flushed();
    }

    /// The next thing to do, in order.
    pub fn poll(&mut self) -> Option<Action<F, M>> {
        self.out.pop_front()
    }

    /// Whether the machine takes another frame from the send queue: it holds none waiting,
    /// the queue has not closed, and the connection is open.
    pub fn wants_frame(&self) -> bool {
        self.phase == Phase::Open && !self.finishing && self.waiting.is_empty()
    }

    /// Whether the connection is over ([`Action::Close`] was queued).
    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }

    /// Whether everything we sent has completed: no frame waits, is announced or written,
    /// and every send slot is free.
    pub fn is_flushed(&self) -> bool {
        self.waiting.is_empty()
            && self.starts.is_empty()
            && self.writes_ready.is_empty()
            && self.writing.is_none()
            && self.writes.is_empty()
            && self.free_slots.len() == self.busy_slots.len()
    }

    /// Our credits: the peer's receive buffers we may still use.
    pub fn credits(&self) -> u32 {
        self.credits
    }

    /// Receive buffers reposted and not yet returned to the peer.
    pub fn owed(&self) -> u32 {
        self.owed
    }

    /// Our receive buffers that are posted.
    pub fn posted_receives(&self) -> u32 {
        self.posted_count
    }

    /// Work requests in the send queue.
    pub fn send_queue_used(&self) -> u32 {
        self.sq_used
    }

    /// Large frames announced and not yet posted in full.
    pub fn announced(&self) -> usize {
        self.starts.len() + self.writes_ready.len() + usize::from(self.writing.is_some())
    }

    /// Checks the machine's bounds: credits within the peer's depth, slots and receives
    /// within ours, the send queue within its capacity, announced frames within the start
    /// limit. What a bug would break first; the tests and the fuzz target call it after
    /// every step.
    pub fn check(&self) -> Result<(), String> {
        let depth = self.busy_slots.len();
        let busy = self.busy_slots.iter().filter(|b| **b).count();
        let posted = self.posted.iter().filter(|p| **p).count();
        let problems = [
            (
                self.credits > self.peer_depth,
                "credits above the peer's depth",
            ),
            (self.owed as usize > depth, "more owed than buffers"),
            (
                self.posted_count as usize != posted,
                "posted receives miscounted",
            ),
            (
                self.owed > self.posted_count,
                "more owed than receives posted",
            ),
            (busy + self.free_slots.len() != depth, "send slots lost"),
            (self.sq_used > self.send_queue, "send queue overfilled"),
            (self.announced() > self.start_depth, "too many announced"),
        ];
        match problems.iter().find(|(broken, _)| *broken) {
            Some((_, what)) => Err((*what).to_owned()),
            None => Ok(()),
        }
    }

    /// Ends the connection with `reason` (once).
    fn fail(&mut self, reason: String) {
        if self.phase != Phase::Closed {
            self.phase = Phase::Closed;
            self.out.push_back(Action::Close(End::Lost(reason)));
        }
    }

    fn close_if_flushed(&mut self) {
        if self.finishing && self.phase == Phase::Open && self.is_flushed() {
            self.phase = Phase::Closed;
            self.out.push_back(Action::Close(End::Flushed));
        }
    }
}
