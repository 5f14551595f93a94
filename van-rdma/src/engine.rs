//! The thread of one RDMA connection: verbs, registered memory and the side channel around
//! the protocol's state machine ([`crate::machine`], which decides credits, the large-message
//! rendezvous, ordering and the flush; see [`crate::protocol`] for what travels).
//!
//! [`Engine`] runs on a dedicated thread once the handshake connected the queue pair,
//! sleeping in `poll(2)` on the completion channel, an eventfd that `send` rings, and the
//! TCP side channel (whose end is the peer's end). Each round it turns work completions into
//! [`Event`]s, lets the machine post ([`Machine::pump`]), takes frames from the queue while
//! the machine wants them, and carries out the machine's [`Action`]s: verbs calls, buffers
//! from the pool, decoding and delivery. Memory stays bounded: the send queue (its frames,
//! and the peer's byte budget for large ones), `rx_depth` receive buffers, and the large
//! frames the machine lets be in flight.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;
use van_core::link::{Connection, Frame};
use van_core::wire::{self, Limits};
use van_core::{InboxSender, Message, NodeId};

use crate::connection::{post_receive, ConnectionIo, Setup};
use crate::device::Device;
use crate::machine::{Action, Config, End, Event, Incoming, Machine};
use crate::pool::{Lease, Pool};
use crate::protocol::{Header, QpAttributes, BYE};
use crate::verbs::{Completion, Cq, Mr, Qp, SendOp, Sge};
use crate::wr_id::{RECV, SEND, TAG_MASK, WRITE, WRITE_PART};

/// How long a sleeping engine waits before re-checking whether it was closed.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// A large frame being written, and the registered memory its pieces are written from.
struct Prepared {
    /// The whole frame as registered memory, in order.
    sges: Vec<Sge>,
    /// Held, not read, until the write ends, as the device reads from it: the encoded parts
    /// (the last may hold the frame's share of the peer's byte budget, given back when the
    /// parts are dropped) and the copy of the parts that lie outside the pool, if any.
    _memory: (Frame, Option<Lease>),
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
    pub(crate) shared: Arc<ConnectionIo>,
    /// The peer, when we dialed it.
    pub(crate) peer: Option<NodeId>,
    /// Called once with the peer's id when an accepted connection learns it.
    pub(crate) on_peer: Box<dyn FnMut(NodeId) + Send>,
}

/// Drives one connection on its own thread; see the [module docs](self).
pub(crate) struct Engine {
    // Declared first, so dropped first: the device stops using the rings and the buffers
    // below before they go.
    qp: Qp,
    cq: Arc<Cq>,
    rx: Mr,
    tx: Mr,
    /// Large frames being written, until the machine ends their write.
    writes: HashMap<u32, Prepared>,
    /// Buffers reserved for the peer's large frames, until written and decoded.
    incoming: HashMap<u32, Lease>,
    slot_bytes: usize,
    /// Largest SEND the peer accepts (its buffer size).
    send_bytes: usize,
    max_sge: usize,
    machine: Machine<Frame, Message>,
    batch: Vec<van_core::Event>,
    /// The machine closed after a flush.
    flushed: bool,
    completions: Vec<Completion>,
    ctx: EngineContext,
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
        let send_bytes = sizes.slot_bytes.min(peer.slot_bytes as usize);
        let machine = Machine::new(Config {
            rx_depth: sizes.rx_depth,
            peer_rx_depth: peer.rx_depth,
            send_bytes,
            start_depth: sizes.start_depth,
            send_queue: setup.send_wr,
            max_message: usize::try_from(device.max_msg).unwrap_or(usize::MAX),
            max_frame: ctx.limits.max_frame,
        });
        Engine {
            qp: setup.qp,
            cq: setup.cq,
            rx: setup.rx,
            tx: setup.tx,
            writes: HashMap::new(),
            incoming: HashMap::new(),
            slot_bytes: sizes.slot_bytes,
            send_bytes,
            max_sge: device.max_sge.max(1) as usize,
            machine,
            batch: Vec::new(),
            flushed: false,
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
            if self.flushed {
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

    /// One round: completions, deliveries, what the machine posts, then frames from the
    /// queue while it takes them.
    fn step(&mut self) -> Result<bool, String> {
        let mut progressed = !self.completions.is_empty();
        loop {
            let pending = std::mem::take(&mut self.completions);
            for completion in &pending {
                let event = self.event_of(completion)?;
                self.machine.handle(event);
                self.execute()?;
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
        self.machine.pump();
        progressed |= self.execute()?;
        while self.machine.wants_frame() {
            match self.ctx.queue.try_recv() {
                Ok(frame) => {
                    let len = frame.iter().map(Bytes::len).sum();
                    self.machine.handle(Event::Frame { frame, len });
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => self.machine.handle(Event::Finish),
            }
            progressed |= self.execute()?;
        }
        Ok(progressed)
    }

    fn deliver(&mut self) -> Result<(), String> {
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

    /// The machine's event for a work completion.
    fn event_of(&mut self, c: &Completion) -> Result<Event<Frame, Message>, String> {
        if !c.ok() {
            return Err(format!("RDMA work request failed: {}", c.status_text()));
        }
        let index = (c.wr_id & !TAG_MASK) as usize;
        Ok(match c.wr_id & TAG_MASK {
            RECV => self.received(index, c)?,
            SEND => Event::Sent { slot: index },
            WRITE => Event::Wrote {
                id: index as u32,
                last: true,
            },
            _ => Event::Wrote {
                id: index as u32,
                last: false,
            },
        })
    }

    /// What a completed receive holds: the peer's WRITE_WITH_IMM, or a SEND's header and,
    /// for `DATA`, its frame (copied out and decoded, so the buffer can be posted again).
    fn received(&mut self, slot: usize, c: &Completion) -> Result<Event<Frame, Message>, String> {
        let len = c.byte_len as usize;
        if c.is_write_with_imm() {
            return Ok(Event::Written {
                slot,
                id: c.imm,
                len,
            });
        }
        if len > self.slot_bytes || self.rx.sge(slot * self.slot_bytes, len).is_none() {
            return Err(format!(
                "peer sent {len} bytes into a {}-byte buffer",
                self.slot_bytes
            ));
        }
        // SAFETY: the receive for this slot completed (the device wrote `len` bytes and is
        // done with it) and it is reposted only after the machine has this event, which
        // holds a copy; the slice is within `rx` (checked above) and dropped before then.
        let bytes = unsafe {
            std::slice::from_raw_parts(self.rx.ptr().as_ptr().add(slot * self.slot_bytes), len)
        };
        let (header, start) =
            Header::decode(bytes).map_err(|e| format!("bad message from peer: {e}"))?;
        let incoming = Incoming::new(&header, || {
            self.decode(Bytes::copy_from_slice(&bytes[start..]))
        })?;
        Ok(Event::Received {
            slot,
            credits: header.credits,
            incoming,
        })
    }

    /// Decodes a frame from the peer, learning the peer's id from it if not known yet.
    fn decode(&mut self, frame: Bytes) -> Result<Message, String> {
        let msg = wire::decode(frame, &self.ctx.limits)
            .map_err(|e| format!("bad frame from peer: {e}"))?;
        if let (None, Some(sender)) = (self.ctx.peer, msg.meta.sender) {
            self.ctx.peer = Some(sender);
            (self.ctx.on_peer)(sender);
        }
        Ok(msg)
    }

    /// Carries out what the machine asks, in order; whether it asked anything.
    fn execute(&mut self) -> Result<bool, String> {
        let mut any = false;
        while let Some(action) = self.machine.poll() {
            any = true;
            match action {
                Action::PostReceive { slot } => {
                    post_receive(&self.qp, &self.rx, slot, self.slot_bytes)
                        .map_err(|e| format!("reposting a receive: {e}"))?;
                }
                Action::Send {
                    slot,
                    header,
                    frame,
                } => self.post_send(slot, &header, frame.as_deref().unwrap_or_default())?,
                Action::BeginWrite { id, frame, len } => {
                    let prepared = self.prepare_write(frame, len)?;
                    self.writes.insert(id, prepared);
                }
                Action::Write {
                    id,
                    offset,
                    len,
                    remote_addr,
                    rkey,
                    last,
                } => self.post_write(id, offset, len, (remote_addr, rkey), last)?,
                Action::EndWrite { id } => {
                    self.writes.remove(&id);
                }
                Action::Reserve { id, len } => {
                    let lease = self.ctx.pool.take(len).map_err(|e| {
                        format!(
                            "cannot register {len} bytes for a large message: {e} (is the \
                             memlock limit too low? see VANS_RDMA_POOL_BYTES)"
                        )
                    })?;
                    let (addr, rkey) = (lease.addr(), lease.rkey());
                    self.incoming.insert(id, lease);
                    self.machine.handle(Event::Reserved { id, addr, rkey });
                }
                Action::Decode { id, len } => {
                    let bytes = self
                        .incoming
                        .remove(&id)
                        .ok_or("a written message has no buffer")?
                        .into_bytes();
                    if len > bytes.len() {
                        return Err("a written message is larger than its buffer".into());
                    }
                    let message = self.decode(bytes.slice(..len))?;
                    self.machine.handle(Event::Decoded { id, message });
                }
                Action::Deliver(message) => self.batch.push(van_core::Event::Message(message)),
                Action::Close(End::Flushed) => self.flushed = true,
                Action::Close(End::Lost(reason)) => return Err(reason),
            }
        }
        Ok(any)
    }

    /// Copies `header` and `parts` into send slot `slot` and posts it.
    fn post_send(&mut self, slot: usize, header: &Header, parts: &[Bytes]) -> Result<(), String> {
        let base = slot * self.slot_bytes;
        if self.tx.sge(base, self.slot_bytes).is_none() {
            return Err("send slot outside its ring".into());
        }
        let total = parts.iter().map(Bytes::len).sum::<usize>();
        // SAFETY: the machine hands out a slot only while it is free (its last send
        // completed, or it was never used), so the device does not read it; it lies within
        // `tx` (checked above); the slice ends before the post.
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
        // which drops the QP first; the machine hands the slot out again (and it is
        // rewritten) only after this send's completion.
        unsafe { self.qp.post_send(SEND | slot as u64, &[sge], SendOp::Send) }
            .map_err(|e| format!("posting a send: {e}"))
    }

    /// Posts bytes `offset..offset + len` of large frame `id` to `(address, rkey)`; the last
    /// piece carries the immediate data that completes the peer's receive.
    fn post_write(
        &mut self,
        id: u32,
        offset: usize,
        len: usize,
        (remote_addr, rkey): (u64, u32),
        last: bool,
    ) -> Result<(), String> {
        let prepared = self
            .writes
            .get(&id)
            .ok_or("an RDMA write of a frame not prepared")?;
        let sges = slice_sges(&prepared.sges, offset, len);
        let (wr_id, op) = if last {
            let op = SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm: id,
            };
            (WRITE | u64::from(id), op)
        } else {
            (
                WRITE_PART | u64::from(id),
                SendOp::Write { remote_addr, rkey },
            )
        };
        // SAFETY: every entry lies in a registration of this QP's PD: pool buffers found by
        // `lookup` (kept alive by the frame's `Bytes`) or the staging lease, both held in
        // `writes` until the machine ends the write, after the last piece's completion
        // (pieces complete in order on an RC queue pair); the QP is dropped before either.
        unsafe { self.qp.post_send(wr_id, &sges, op) }
            .map_err(|e| format!("posting an RDMA write: {e}"))
    }

    /// Writes a large frame where the peer said, from registered memory: parts that lie in
    /// the pool (buffers from `Van::alloc`) directly, the rest copied into a staging buffer.
    fn prepare_write(&self, frame: Frame, len: usize) -> Result<Prepared, String> {
        let pool = Arc::clone(&self.ctx.pool);
        let located: Vec<Option<Sge>> = frame
            .iter()
            .map(|p| pool.lookup(p.as_ptr(), p.len()))
            .collect();
        let unregistered: usize = frame
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
            for (part, sge) in frame.iter().zip(&located) {
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
            let mut lease = pool.take(len).map_err(stage_error)?;
            let buf = lease.as_mut_slice();
            let mut at = 0;
            for part in &frame {
                buf[at..at + part.len()].copy_from_slice(part);
                at += part.len();
            }
            sges = vec![lease.sge(0, at).ok_or("staging buffer too small")?];
            staging = Some(lease);
        }
        Ok(Prepared {
            sges,
            _memory: (frame, staging),
        })
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
        self.machine.handle(Event::PeerClosed);
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
                if !c.ok() || c.wr_id & TAG_MASK != RECV {
                    continue;
                }
                let Ok(event) = self.received((c.wr_id & !TAG_MASK) as usize, c) else {
                    break;
                };
                self.machine.handle(event);
                if self.execute().is_err() {
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
