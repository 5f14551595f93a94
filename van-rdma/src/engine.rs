//! The thread of one RDMA connection: credits, the large-message rendezvous, ordering and
//! delivery (see [`crate::protocol`] for what travels).
//!
//! [`Engine`] runs on a dedicated thread once the handshake connected the queue pair,
//! sleeping in `poll(2)` on the completion channel, an eventfd that `send` rings, and the
//! TCP side channel (whose end is the peer's end).
//!
//! Order per peer: small frames go out in queue order; a large frame is announced (`START`)
//! in its place and written when the peer replies, while later frames keep flowing. The
//! receiver delivers in announcement order, holding frames that arrive behind an unwritten
//! large one. Memory stays bounded: the send queue (its frames, and the peer's byte budget
//! for large ones), `rx_depth` receive buffers, at most `start_depth` large frames in flight.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;
use van_core::link::{Connection, Frame};
use van_core::wire::{self, Limits, HEADER_LEN};
use van_core::{Event, InboxSender, Message, NodeId};

use crate::connection::{post_receive, ConnShared, Setup};
use crate::device::Device;
use crate::pool::{Lease, Pool};
use crate::protocol::{Header, Kind, QpAttributes, BYE};
use crate::verbs::{Completion, Cq, Mr, Qp, SendOp, Sge};

/// Credits kept back for credit-only messages, so that returning credits never deadlocks.
const RESERVE: u32 = 1;
/// How long a sleeping engine waits before re-checking whether it was closed.
const WAIT_SLICE: Duration = Duration::from_millis(100);

pub(crate) const TAG_MASK: u64 = 3 << 62;
pub(crate) const RECV: u64 = 0;
const SEND: u64 = 1 << 62;
const WRITE: u64 = 2 << 62;
/// A piece of a large frame written before its last piece (which carries the immediate).
const WRITE_PART: u64 = 3 << 62;

/// A frame taken from the queue, with its length.
struct Outgoing {
    /// The encoded parts (the last may hold the frame's share of the peer's byte budget,
    /// given back when the parts are dropped: once sent or written).
    frame: Frame,
    /// Their total length.
    len: usize,
}

impl Outgoing {
    fn new(frame: Frame) -> Outgoing {
        let len = frame.iter().map(Bytes::len).sum();
        Outgoing { frame, len }
    }
}

/// A frame the receiver must deliver in order.
enum Pending {
    Ready(Message),
    /// A large frame announced and not yet written.
    Awaiting(u32),
}

/// A reply we owe the peer.
struct ReplyOut {
    id: u32,
    len: u64,
    addr: u64,
    rkey: u32,
}

/// A large frame the peer told us where to write.
struct WriteOut {
    id: u32,
    out: Outgoing,
    addr: u64,
    rkey: u32,
}

/// A large frame being written, in pieces of at most the port's message size.
struct Writing {
    w: WriteOut,
    staging: Option<Lease>,
    sges: Vec<Sge>,
    posted: usize,
}

/// The entries covering bytes `offset..offset + len` of the concatenation of `sges`.
pub(crate) fn slice_sges(sges: &[Sge], offset: usize, len: usize) -> Vec<Sge> {
    let mut out = Vec::new();
    let (mut skip, mut left) = (offset, len);
    for sge in sges {
        let n = sge.len as usize;
        if skip >= n {
            skip -= n;
            continue;
        }
        if left == 0 {
            break;
        }
        let take = (n - skip).min(left);
        out.push(Sge {
            addr: sge.addr + skip as u64,
            len: take as u32,
            lkey: sge.lkey,
        });
        left -= take;
        skip = 0;
    }
    out
}

/// How many large frames may be announced and not yet fully written: our start depth, but
/// below the peer's receive depth, which bounds the announced frames it holds buffers for
/// (more is a protocol error there, and depths are configured per node).
pub(crate) fn start_limit(start_depth: u32, peer_rx_depth: u32) -> usize {
    start_depth.min(peer_rx_depth.saturating_sub(1)).max(1) as usize
}

/// What the engine needs beyond the setup.
pub(crate) struct EngineContext {
    /// Frames to send; closed by the van's stop.
    pub(crate) queue: mpsc::Receiver<Frame>,
    /// The side channel (non-blocking).
    pub(crate) tcp: std::net::TcpStream,
    /// Where messages go.
    pub(crate) inbox: InboxSender,
    /// Frame limits.
    pub(crate) limits: Limits,
    /// The shared registered pool.
    pub(crate) pool: Arc<Pool>,
    /// The shared flags.
    pub(crate) shared: Arc<ConnShared>,
    /// The peer, when we dialed it.
    pub(crate) peer: Option<NodeId>,
    /// Called once with the peer's id when an accepted connection learns it.
    pub(crate) on_peer: Box<dyn FnMut(NodeId) + Send>,
}

/// Drives one connection on its own thread; see the [module docs](self).
pub(crate) struct Engine {
    // Declared first, so dropped first: the device stops using the rings before they go.
    qp: Qp,
    cq: Arc<Cq>,
    rx: Mr,
    tx: Mr,
    slot_bytes: usize,
    /// Largest SEND the peer accepts (its buffer size).
    send_bytes: usize,
    rx_depth: u32,
    peer_depth: u32,
    tx_free: Vec<usize>,
    credits: u32,
    owed: u32,
    threshold: u32,
    max_sge: usize,
    start_depth: usize,
    next_id: u32,
    starts: HashMap<u32, Outgoing>,
    replies: VecDeque<ReplyOut>,
    writes_ready: VecDeque<WriteOut>,
    writing: Option<Writing>,
    writes: HashMap<u32, (Outgoing, Option<Lease>)>,
    /// Work requests in the send queue, and its capacity.
    sq_used: u32,
    sq_cap: u32,
    /// Largest message the port carries.
    max_msg: usize,
    incoming: HashMap<u32, (Lease, usize)>,
    order: VecDeque<Pending>,
    batch: Vec<Event>,
    held: Option<Outgoing>,
    queue_closed: bool,
    completions: Vec<Completion>,
    ctx: EngineContext,
}

/// Why an engine ended.
pub(crate) enum End {
    /// Our stop: everything sent was acknowledged, and the peer was told.
    Flushed,
    /// The connection ended: the reason.
    Lost(String),
}

impl Engine {
    /// An engine for a connected setup.
    pub(crate) fn new(
        setup: Setup,
        peer: &QpAttributes,
        device: &Device,
        ctx: EngineContext,
    ) -> Engine {
        let sizes = setup.sizes;
        let depth = sizes.rx_depth;
        Engine {
            qp: setup.qp,
            cq: setup.cq,
            rx: setup.rx,
            tx: setup.tx,
            slot_bytes: sizes.slot_bytes,
            send_bytes: sizes.slot_bytes.min(peer.slot_bytes as usize),
            rx_depth: depth,
            peer_depth: peer.rx_depth,
            tx_free: (0..depth as usize).rev().collect(),
            credits: peer.rx_depth,
            owed: 0,
            threshold: (depth / 2).max(1),
            max_sge: device.max_sge.max(1) as usize,
            start_depth: start_limit(sizes.start_depth, peer.rx_depth),
            next_id: 0,
            starts: HashMap::new(),
            replies: VecDeque::new(),
            writes_ready: VecDeque::new(),
            writing: None,
            writes: HashMap::new(),
            sq_used: 0,
            sq_cap: setup.send_wr,
            max_msg: usize::try_from(device.max_msg).unwrap_or(usize::MAX),
            incoming: HashMap::new(),
            order: VecDeque::new(),
            batch: Vec::new(),
            held: None,
            queue_closed: false,
            completions: Vec::new(),
            ctx,
        }
    }

    /// Runs until the connection ends; returns how, and the peer if it was known (dialed,
    /// or learned from its messages).
    pub(crate) fn run(mut self) -> (End, Option<NodeId>) {
        let end = match self.run_loop() {
            Ok(()) => End::Flushed,
            Err(reason) => End::Lost(reason),
        };
        (end, self.ctx.peer)
    }

    fn run_loop(&mut self) -> Result<(), String> {
        loop {
            let progressed = self.step()?;
            if self.queue_closed && self.flushed() {
                let _ = self.ctx.tcp.write_all(&[BYE]);
                let _ = self.ctx.tcp.shutdown(std::net::Shutdown::Write);
                return Ok(());
            }
            if self.ctx.shared.is_closed() {
                return Err("the connection was closed".into());
            }
            if !self.peer_alive() {
                self.drain_after_close();
                return Err("the peer closed the connection".into());
            }
            if !progressed {
                self.wait()?;
            }
        }
    }

    /// Everything we sent has completed.
    fn flushed(&self) -> bool {
        self.held.is_none()
            && self.starts.is_empty()
            && self.writes_ready.is_empty()
            && self.writing.is_none()
            && self.writes.is_empty()
            && self.tx_free.len() == self.rx_depth as usize
    }

    /// One round: completions, deliveries, then what can be posted.
    fn step(&mut self) -> Result<bool, String> {
        let mut progressed = !self.completions.is_empty();
        loop {
            let pending = std::mem::take(&mut self.completions);
            for completion in &pending {
                self.on_completion(completion)?;
            }
            let n = self
                .cq
                .poll(&mut self.completions, 32)
                .map_err(|e| format!("polling the completion queue: {e}"))?;
            if n == 0 {
                break;
            }
            progressed = true;
        }
        self.deliver()?;
        progressed |= self.post_control()?;
        progressed |= self.post_queue()?;
        Ok(progressed)
    }

    fn deliver(&mut self) -> Result<(), String> {
        while let Some(Pending::Ready(_)) = self.order.front() {
            if let Some(Pending::Ready(msg)) = self.order.pop_front() {
                self.batch.push(Event::Message(msg));
            }
        }
        if !self.batch.is_empty() {
            self.ctx
                .inbox
                .deliver_blocking(std::mem::take(&mut self.batch), || {
                    self.ctx.shared.is_closed()
                })
                .map_err(|_| "the local inbox closed".to_owned())?;
        }
        Ok(())
    }

    fn on_completion(&mut self, c: &Completion) -> Result<(), String> {
        if !c.ok() {
            return Err(format!("RDMA work request failed: {}", c.status_text()));
        }
        let index = (c.wr_id & !TAG_MASK) as usize;
        match c.wr_id & TAG_MASK {
            RECV => {
                self.on_receive(index, c)?;
                post_receive(&self.qp, &self.rx, index, self.slot_bytes)
                    .map_err(|e| format!("reposting a receive: {e}"))?;
                self.owed += 1;
            }
            SEND => {
                self.sq_used -= 1;
                self.tx_free.push(index);
            }
            WRITE => {
                self.sq_used -= 1;
                self.writes.remove(&(index as u32));
            }
            _ => self.sq_used -= 1,
        }
        Ok(())
    }

    fn note_sender(&mut self, msg: &Message) {
        if let (None, Some(sender)) = (self.ctx.peer, msg.meta.sender) {
            self.ctx.peer = Some(sender);
            (self.ctx.on_peer)(sender);
        }
    }

    fn decode(&self, frame: Bytes) -> Result<Message, String> {
        wire::decode(frame, &self.ctx.limits).map_err(|e| format!("bad frame from peer: {e}"))
    }

    fn on_receive(&mut self, slot: usize, c: &Completion) -> Result<(), String> {
        let len = c.byte_len as usize;
        if c.is_write_with_imm() {
            let (lease, expected) = self
                .incoming
                .remove(&c.imm)
                .ok_or("peer wrote a large message it never announced")?;
            // `len` counts the last piece only (a frame over the port's message size is
            // written in pieces); the frame's own header says how long it is, and decoding
            // checks that against what was announced.
            if len > expected {
                return Err(format!(
                    "peer wrote {len} bytes for a message announced as {expected}"
                ));
            }
            let msg = self.decode(lease.into_bytes().slice(..expected))?;
            self.note_sender(&msg);
            let id = c.imm;
            match self
                .order
                .iter_mut()
                .find(|p| matches!(p, Pending::Awaiting(a) if *a == id))
            {
                Some(entry) => *entry = Pending::Ready(msg),
                None => return Err("a written message has no place in the order".into()),
            }
            return Ok(());
        }
        if len > self.slot_bytes {
            return Err(format!(
                "peer sent {len} bytes into a {}-byte buffer",
                self.slot_bytes
            ));
        }
        // SAFETY: the receive for this slot completed (the device wrote `len` bytes and is
        // done with it) and it is reposted only after this function returns; the slice is
        // within `rx` (checked above) and dropped before then.
        let bytes = unsafe {
            std::slice::from_raw_parts(self.rx.ptr().as_ptr().add(slot * self.slot_bytes), len)
        };
        let (header, start) =
            Header::decode(bytes).map_err(|e| format!("bad message from peer: {e}"))?;
        self.credits += u32::from(header.credits);
        if self.credits > self.peer_depth {
            return Err("peer returned more credits than it has buffers".into());
        }
        match header.kind {
            Kind::Data => {
                let frame = Bytes::copy_from_slice(&bytes[start..]);
                let msg = self.decode(frame)?;
                self.note_sender(&msg);
                if self.order.is_empty() {
                    self.batch.push(Event::Message(msg));
                } else {
                    self.order.push_back(Pending::Ready(msg));
                }
            }
            Kind::Credit => {}
            Kind::Start { len } => {
                let limit = self.ctx.limits.max_frame;
                if len > limit || len < HEADER_LEN as u64 {
                    return Err(format!(
                        "peer announced a {len}-byte frame (limit {limit} bytes)"
                    ));
                }
                if self.incoming.len() >= self.rx_depth as usize {
                    return Err("peer announced more large messages than it may".into());
                }
                let len = usize::try_from(len).map_err(|_| "frame too large".to_owned())?;
                let lease = self.ctx.pool.take(len).map_err(|e| {
                    format!(
                        "cannot register {len} bytes for a large message: {e} (is the memlock \
                         limit too low? see VANS_RDMA_POOL_BYTES)"
                    )
                })?;
                self.replies.push_back(ReplyOut {
                    id: header.id,
                    len: len as u64,
                    addr: lease.addr(),
                    rkey: lease.rkey(),
                });
                if self.incoming.insert(header.id, (lease, len)).is_some() {
                    return Err("peer announced a large message id twice".into());
                }
                self.order.push_back(Pending::Awaiting(header.id));
            }
            Kind::Reply { len, addr, rkey } => {
                let out = self
                    .starts
                    .remove(&header.id)
                    .ok_or("peer replied to a large message we never announced")?;
                if len != out.len as u64 {
                    return Err("peer reserved the wrong size for a large message".into());
                }
                // Pieces are written at `addr + offset`: that must not wrap.
                if addr.checked_add(len).is_none() {
                    return Err(format!("peer replied with an invalid address {addr:#x}"));
                }
                self.writes_ready.push_back(WriteOut {
                    id: header.id,
                    out,
                    addr,
                    rkey,
                });
            }
        }
        Ok(())
    }

    fn can_send(&self, credits: u32) -> bool {
        self.credits >= credits && !self.tx_free.is_empty() && self.sq_used < self.sq_cap
    }

    /// Copies a header and `parts` into a send slot and posts it.
    fn post_small(&mut self, kind: Kind, id: u32, parts: &[Bytes]) -> Result<(), String> {
        let slot = self.tx_free.pop().ok_or("no free send slot")?;
        let header = Header {
            kind,
            credits: u16::try_from(self.owed).unwrap_or(u16::MAX),
            id,
        };
        self.owed -= u32::from(header.credits);
        let base = slot * self.slot_bytes;
        let total = parts.iter().map(Bytes::len).sum::<usize>();
        // SAFETY: the slot is free (its last send completed, or it was never used), so the
        // device does not read it; it lies within `tx`; the slice ends before the post.
        let buf = unsafe {
            std::slice::from_raw_parts_mut(self.tx.ptr().as_ptr().add(base), self.slot_bytes)
        };
        let mut at = header.encode(buf);
        if at + total > self.send_bytes {
            return Err("a message does not fit a send slot".into());
        }
        for part in parts {
            buf[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        let sge = self.tx.sge(base, at).ok_or("send slot outside its ring")?;
        // SAFETY: the slot is in `tx`, registered with the QP's PD and owned by the engine,
        // which drops the QP first; the slot returns to `tx_free` (and is rewritten) only
        // after this send's completion.
        unsafe { self.qp.post_send(SEND | slot as u64, &[sge], SendOp::Send) }
            .map_err(|e| format!("posting a send: {e}"))?;
        self.credits -= 1;
        self.sq_used += 1;
        Ok(())
    }

    /// Replies, writes and credits: what unblocks the peer or a started message.
    fn post_control(&mut self) -> Result<bool, String> {
        let mut progressed = false;
        while !self.replies.is_empty() && self.can_send(RESERVE + 1) {
            if let Some(r) = self.replies.pop_front() {
                let kind = Kind::Reply {
                    len: r.len,
                    addr: r.addr,
                    rkey: r.rkey,
                };
                self.post_small(kind, r.id, &[])?;
                progressed = true;
            }
        }
        loop {
            if let Some(writing) = self.writing.take() {
                let before = writing.posted;
                self.continue_write(writing)?;
                progressed |= self.writing.as_ref().is_none_or(|w| w.posted != before);
                if self.writing.is_some() {
                    break;
                }
            }
            if self.writes_ready.is_empty() || self.credits <= RESERVE {
                break;
            }
            if let Some(w) = self.writes_ready.pop_front() {
                // The last piece consumes one of the peer's receives: its credit, now.
                self.credits -= 1;
                self.writing = Some(self.prepare_write(w)?);
                progressed = true;
            }
        }
        if self.owed >= self.threshold && self.can_send(1) {
            self.post_small(Kind::Credit, 0, &[])?;
            progressed = true;
        }
        Ok(progressed)
    }

    /// Writes a large frame where the peer said, from registered memory: parts that lie in
    /// the pool (buffers from `Van::alloc`) directly, the rest copied into a staging buffer.
    fn prepare_write(&mut self, w: WriteOut) -> Result<Writing, String> {
        let pool = Arc::clone(&self.ctx.pool);
        let located: Vec<Option<Sge>> = w
            .out
            .frame
            .iter()
            .map(|p| pool.lookup(p.as_ptr(), p.len()))
            .collect();
        let unregistered: usize = w
            .out
            .frame
            .iter()
            .zip(&located)
            .filter(|(_, l)| l.is_none())
            .map(|(p, _)| p.len())
            .sum();
        let stage_error = |e: std::io::Error| format!("cannot register a staging buffer: {e}");
        let mut staging = None;
        let mut sges: Vec<Sge> = Vec::new();
        if unregistered > 0 {
            let mut lease = pool.take(unregistered).map_err(stage_error)?;
            // Taken before the slice borrows the lease; staged runs are entries in it.
            let (base, lkey) = (lease.addr(), lease.sge(0, 1).map_or(0, |s| s.lkey));
            let buf = lease.as_mut_slice();
            let mut at = 0;
            let mut run_start: Option<usize> = None;
            for (part, sge) in w.out.frame.iter().zip(&located) {
                if part.is_empty() {
                    continue;
                }
                match sge {
                    Some(sge) => {
                        if let Some(start) = run_start.take() {
                            sges.push(Sge {
                                addr: base + start as u64,
                                len: (at - start) as u32,
                                lkey,
                            });
                        }
                        sges.push(*sge);
                    }
                    _ => {
                        run_start.get_or_insert(at);
                        buf[at..at + part.len()].copy_from_slice(part);
                        at += part.len();
                    }
                }
            }
            if let Some(start) = run_start {
                sges.push(Sge {
                    addr: base + start as u64,
                    len: (at - start) as u32,
                    lkey,
                });
            }
            staging = Some(lease);
        } else {
            sges = located
                .into_iter()
                .flatten()
                .filter(|s| s.len > 0)
                .collect();
        }
        if sges.len() > self.max_sge {
            // Too many pieces for one work request: one contiguous copy instead.
            let mut lease = pool.take(w.out.len).map_err(stage_error)?;
            let buf = lease.as_mut_slice();
            let mut at = 0;
            for part in &w.out.frame {
                buf[at..at + part.len()].copy_from_slice(part);
                at += part.len();
            }
            sges = vec![lease.sge(0, at).ok_or("staging buffer too small")?];
            staging = Some(lease);
        }
        Ok(Writing {
            w,
            staging,
            sges,
            posted: 0,
        })
    }

    /// Posts the pieces of a large frame while the send queue has room; the last piece
    /// carries the immediate data that completes the peer's receive.
    fn continue_write(&mut self, mut writing: Writing) -> Result<(), String> {
        let total = writing.w.out.len;
        while writing.posted < total && self.sq_used < self.sq_cap {
            let len = (total - writing.posted).min(self.max_msg);
            let last = writing.posted + len == total;
            let sges = slice_sges(&writing.sges, writing.posted, len);
            let remote_addr = writing.w.addr + writing.posted as u64;
            let (wr_id, op) = if last {
                let op = SendOp::WriteWithImm {
                    remote_addr,
                    rkey: writing.w.rkey,
                    imm: writing.w.id,
                };
                (WRITE | u64::from(writing.w.id), op)
            } else {
                let op = SendOp::Write {
                    remote_addr,
                    rkey: writing.w.rkey,
                };
                (WRITE_PART | u64::from(writing.w.id), op)
            };
            // SAFETY: every entry lies in a registration of this QP's PD: pool buffers found
            // by `lookup` (kept alive by the frame's `Bytes`) or the staging lease, both held
            // in `writing` and then in `writes` until the last piece's completion (pieces
            // complete in order on an RC queue pair); the QP is dropped before either.
            unsafe { self.qp.post_send(wr_id, &sges, op) }
                .map_err(|e| format!("posting an RDMA write: {e}"))?;
            self.sq_used += 1;
            writing.posted += len;
        }
        if writing.posted >= total {
            self.writes
                .insert(writing.w.id, (writing.w.out, writing.staging));
        } else {
            self.writing = Some(writing);
        }
        Ok(())
    }

    /// Frames from the queue, in order, while credits, slots and start depth allow.
    fn post_queue(&mut self) -> Result<bool, String> {
        let mut progressed = false;
        loop {
            let item = match self.held.take() {
                Some(item) => item,
                None => match self.ctx.queue.try_recv() {
                    Ok(frame) => Outgoing::new(frame),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        self.queue_closed = true;
                        break;
                    }
                },
            };
            if !self.can_send(RESERVE + 1) {
                self.held = Some(item);
                break;
            }
            if item.len + Header::LEN <= self.send_bytes {
                self.post_small(Kind::Data, 0, &item.frame)?;
            } else {
                // Frames announced and not completely written (the peer holds a buffer for
                // each); a write posted in full reaches the peer before a later START.
                let announced = self.starts.len()
                    + self.writes_ready.len()
                    + usize::from(self.writing.is_some());
                if announced >= self.start_depth {
                    self.held = Some(item);
                    break;
                }
                let id = self.next_id;
                self.next_id = self.next_id.wrapping_add(1);
                self.post_small(
                    Kind::Start {
                        len: item.len as u64,
                    },
                    id,
                    &[],
                )?;
                self.starts.insert(id, item);
            }
            progressed = true;
        }
        Ok(progressed)
    }

    /// Whether the side channel is still open (its end is the peer's end).
    fn peer_alive(&mut self) -> bool {
        let mut buf = [0u8; 16];
        match self.ctx.tcp.read(&mut buf) {
            Ok(0) => false,
            Ok(n) => !buf[..n].contains(&BYE),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => true,
            Err(_) => false,
        }
    }

    /// After the peer closed: deliver what it sent before (its completions may trail the
    /// close by a moment), ignoring failures of our own sends to it.
    fn drain_after_close(&mut self) {
        let deadline = Instant::now() + Duration::from_millis(300);
        let mut quiet = 0;
        while quiet < 3 && Instant::now() < deadline {
            let mut got = std::mem::take(&mut self.completions);
            if self.cq.poll(&mut got, 32).unwrap_or(0) == 0 {
                quiet += 1;
                std::thread::sleep(Duration::from_millis(10));
            } else {
                quiet = 0;
            }
            for c in &got {
                if c.ok()
                    && c.wr_id & TAG_MASK == RECV
                    && self.on_receive((c.wr_id & !TAG_MASK) as usize, c).is_err()
                {
                    break;
                }
            }
            if self.deliver().is_err() {
                return;
            }
        }
    }

    /// Sleeps until a completion, a send, the side channel or the wait slice.
    fn wait(&mut self) -> Result<(), String> {
        self.cq
            .arm()
            .map_err(|e| format!("arming the completion queue: {e}"))?;
        // Completions that landed before arming raise no event: look once more.
        let n = self
            .cq
            .poll(&mut self.completions, 32)
            .map_err(|e| format!("polling the completion queue: {e}"))?;
        if n > 0 {
            return Ok(());
        }
        let mut fds = [
            libc::pollfd {
                fd: self.cq.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.ctx.shared.wake.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.ctx.tcp.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a live array of three initialised pollfd entries.
        let _ = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                WAIT_SLICE.as_millis() as i32,
            )
        };
        self.cq.drain_events();
        self.ctx.shared.wake.drain();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(addr: u64, len: u32) -> Sge {
        Sge {
            addr,
            len,
            lkey: addr as u32,
        }
    }

    #[test]
    fn announced_large_frames_stay_below_the_peers_receive_depth() {
        // The peer refuses an announcement once it holds `rx_depth` of them.
        assert_eq!(start_limit(16, 128), 16);
        assert_eq!(start_limit(128, 128), 127);
        assert_eq!(start_limit(4096, 4), 3);
        assert_eq!(start_limit(0, 4), 1);
        assert_eq!(start_limit(16, 0), 1);
    }

    #[test]
    fn pieces_of_a_scatter_list_cover_exactly_their_range() {
        let list = [sge(1000, 10), sge(5000, 5), sge(9000, 20)];
        assert_eq!(slice_sges(&list, 0, 35), list.to_vec());
        assert_eq!(
            slice_sges(&list, 8, 10),
            vec![
                Sge {
                    addr: 1008,
                    len: 2,
                    lkey: 1000
                },
                sge(5000, 5),
                Sge {
                    addr: 9000,
                    len: 3,
                    lkey: 9000
                }
            ]
        );
        assert_eq!(slice_sges(&list, 15, 20), vec![sge(9000, 20)]);
        assert!(slice_sges(&list, 35, 0).is_empty());
        // Pieces of a whole cover it once.
        let pieces: u32 = (0..35)
            .step_by(4)
            .flat_map(|at| slice_sges(&list, at, 4.min(35 - at)))
            .map(|s| s.len)
            .sum();
        assert_eq!(pieces, 35);
    }
}
