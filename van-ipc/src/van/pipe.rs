//! The bytes of a connection: the writer thread copying queued frames into the ring, the
//! direct path for small frames, and the reader reassembling and delivering them (a task on
//! the runtime woken by a doorbell, or in named mode a thread sleeping on the ring's futex).

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use bytes::{Bytes, BytesMut};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc;
use tracing::{debug, warn};
use van_core::wire::{self, Limits};
use van_core::{Event, InboxSender, Message, NodeId};

use super::conn::{ConnectionIo, WAIT_SLICE};
use crate::arena::{self, PeerArena, Ref};
use crate::ring::{Consumer, Producer, FIRST, LAST};
use crate::{Doorbell, WaitResult};

/// Why a reader ends when the peer closed its ring or went away (an orderly end as far as
/// the ring can tell; the node decides whether the peer's departure is a failure).
pub(super) const PEER_CLOSED: &str = "the peer closed the connection";
/// Messages a reader delivers in one batch at most.
const MAX_BATCH: usize = 256;
/// Frames up to this size may be written into the ring by the sending task itself (when
/// nothing is queued and the ring has room), saving the writer thread's wake-up.
const DIRECT_MAX: usize = 64 << 10;

/// The producing end of a connection's ring and what keeps its messages in order: a sender
/// writes directly only while no queued message is pending (`pending == 0`, checked under
/// the lock the writer thread holds while it writes one).
#[derive(Debug)]
pub(super) struct Direct {
    pub(super) producer: Mutex<Producer>,
    /// Messages queued for the writer thread and not yet completely written.
    pub(super) pending: std::sync::atomic::AtomicUsize,
}

impl Direct {
    /// Writes a small frame into the ring from the calling task when nothing is queued and
    /// the ring has room now; `false` when the caller must queue it instead.
    pub(super) fn try_write(&self, frame: &[Bytes], connection: &ConnectionIo) -> bool {
        let total: usize = frame.iter().map(Bytes::len).sum();
        if total > DIRECT_MAX || total == 0 || connection.is_closed() {
            return false;
        }
        // Never wait for the lock: the writer may hold it while it waits for room.
        let Ok(mut producer) = self.producer.try_lock() else {
            return false;
        };
        if self.pending.load(Ordering::Acquire) != 0 || total > producer.max_record() {
            return false;
        }
        let slices: Vec<&[u8]> = frame.iter().map(|p| p.as_ref()).collect();
        match producer.try_push_message(&slices, 0) {
            Ok(Some(written)) if written == total => {
                producer.wake_consumer();
                true
            }
            Ok(_) => false,
            Err(e) => {
                // A corrupt cursor: the queued path reports it and closes the connection.
                debug!("IPC direct write refused: {e}");
                false
            }
        }
    }
}

/// One queued message: its encoded frame, preceded in the ring by a references record when
/// some data segments travel by reference.
#[derive(Debug)]
pub(super) struct Outgoing {
    pub(super) refs: Option<Bytes>,
    pub(super) frame: wire::Frame,
}

/// Copies queued frames into the ring until the queue closes or the connection ends: each
/// frame's parts are copied once, straight into the ring, fragmented into records of at
/// most `max_record` bytes when larger.
pub(super) fn write_loop(
    mut frames: mpsc::Receiver<Outgoing>,
    direct: &Direct,
    connection: &ConnectionIo,
    spins: u32,
) {
    let lock = || direct.producer.lock().unwrap_or_else(|e| e.into_inner());
    while let Some(outgoing) = frames.blocking_recv() {
        let mut producer = lock();
        let sent = outgoing
            .refs
            .is_none_or(|refs| write_message(&mut producer, &[refs], connection, spins))
            && write_message(&mut producer, &outgoing.frame, connection, spins);
        // Under the lock: a direct sender sees the count and the ring change together.
        direct.pending.fetch_sub(1, Ordering::AcqRel);
        drop(producer);
        if !sent {
            break;
        }
    }
    lock().close();
}

/// Copies one message into the ring, waiting for room; `false` when the connection ended.
fn write_message(
    producer: &mut Producer,
    parts: &[Bytes],
    connection: &ConnectionIo,
    spins: u32,
) -> bool {
    {
        let slices: Vec<&[u8]> = parts.iter().map(|p| p.as_ref()).collect();
        let total: usize = slices.iter().map(|s| s.len()).sum();
        let mut offset = 0;
        loop {
            if connection.is_closed() {
                return false;
            }
            match producer.try_push_message(&slices, offset) {
                Ok(Some(next)) => {
                    offset = next;
                    if offset >= total {
                        break;
                    }
                }
                Ok(None) => {
                    producer.wake_consumer();
                    let want = (total - offset).min(producer.max_record());
                    if let WaitResult::Closed = producer.wait_for_space(want, spins, WAIT_SLICE) {
                        connection.close();
                        return false;
                    }
                }
                Err(e) => {
                    warn!("IPC writer: {e}");
                    connection.close();
                    return false;
                }
            }
        }
        producer.wake_consumer();
    }
    true
}

/// Reassembles frames from a ring's records into messages.
#[derive(Debug)]
pub(super) struct Reader {
    consumer: Consumer,
    limits: Limits,
    /// The peer's arena, where its references point.
    peer_arena: Option<PeerArena>,
    /// The frame being reassembled.
    frame: BytesMut,
    in_frame: bool,
    /// References announced for the next frame.
    refs: Option<Vec<Ref>>,
}

impl Reader {
    pub(super) fn new(consumer: Consumer, limits: Limits, peer_arena: Option<PeerArena>) -> Reader {
        Reader {
            consumer,
            limits,
            peer_arena,
            frame: BytesMut::new(),
            in_frame: false,
            refs: None,
        }
    }

    /// Pops what the ring holds into `batch` until it is empty (`Ok(false)`) or the batch
    /// is full (`Ok(true)`); `Err` says why the connection must end.
    fn fill(
        &mut self,
        batch: &mut Vec<Event>,
        on_sender: &mut impl FnMut(NodeId),
    ) -> Result<bool, String> {
        let limits = self.limits;
        while batch.len() < MAX_BATCH {
            let flags = match self.consumer.try_pop(&mut self.frame) {
                Ok(Some(flags)) => flags,
                Ok(None) => return Ok(false),
                Err(e) => return Err(format!("peer corrupted the ring: {e}")),
            };
            if flags & FIRST != 0 {
                if self.in_frame {
                    return Err("peer started a frame inside another".into());
                }
                self.in_frame = true;
            } else if !self.in_frame {
                return Err("peer continued a frame it never started".into());
            }
            if self.frame.len() as u64 > limits.max_frame {
                return Err(format!(
                    "peer sent a frame over the limit of {} bytes",
                    limits.max_frame
                ));
            }
            if flags & LAST == 0 {
                // A fragmented frame: its header (in the first record) says how long it is,
                // so the rest lands in one buffer without reallocating (the length was
                // checked against the limits; a lie only costs this allocation).
                if flags & FIRST != 0 {
                    if let Ok(header) = wire::FrameHeader::parse(&self.frame, &limits) {
                        let total = usize::try_from(header.frame_len).unwrap_or(0);
                        self.frame.reserve(total.saturating_sub(self.frame.len()));
                    }
                }
                continue;
            }
            self.in_frame = false;
            if self.frame.starts_with(&arena::REFS_MAGIC) {
                if self.refs.is_some() || self.peer_arena.is_none() {
                    return Err("peer sent references it may not send".into());
                }
                match arena::decode_refs(&self.frame) {
                    Ok(r) => self.refs = Some(r),
                    Err(e) => return Err(format!("peer corrupted the ring: {e}")),
                }
                self.frame.clear();
                continue;
            }
            let mut msg = wire::decode(self.frame.split().freeze(), &limits)
                .map_err(|e| format!("bad frame from peer: {e}"))?;
            if let (Some(refs), Some(arena)) = (self.refs.take(), &self.peer_arena) {
                resolve_refs(&mut msg, &refs, arena)
                    .map_err(|e| format!("peer sent a bad reference: {e}"))?;
            }
            if let Some(sender) = msg.meta.sender {
                on_sender(sender);
            }
            batch.push(Event::Message(msg));
        }
        Ok(true)
    }
}

/// Reads on a thread of its own, sleeping on the ring's futex (named mode, where no doorbell
/// can be passed): delivers batches until the ring is closed and drained or the connection
/// ends; returns why it stopped. `abandon` says when a full inbox is no longer worth waiting
/// for (the van stopped).
pub(super) fn read_blocking(
    mut reader: Reader,
    connection: &ConnectionIo,
    spins: u32,
    inbox: &InboxSender,
    abandon: impl Fn() -> bool,
    mut on_sender: impl FnMut(NodeId),
) -> String {
    let mut batch = Vec::new();
    let mut ring_closed = false;
    loop {
        let full = match reader.fill(&mut batch, &mut on_sender) {
            Ok(full) => full,
            Err(reason) => return reason,
        };
        if !batch.is_empty()
            && inbox
                .deliver_blocking(std::mem::take(&mut batch), &abandon)
                .is_err()
        {
            return "the local inbox closed".into();
        }
        if full {
            continue;
        }
        // Only an empty ring ends the connection: what was written before a close is always
        // delivered.
        if ring_closed {
            return PEER_CLOSED.into();
        }
        if connection.is_closed() {
            // Drain once more (records may have landed just before), then end.
            ring_closed = true;
            continue;
        }
        if let WaitResult::Closed = reader.consumer.wait_for_data(spins, WAIT_SLICE) {
            // Drain once more: records may have landed just before the close.
            ring_closed = true;
        }
    }
}

/// Reads on the caller's runtime: spins briefly when the ring is empty, then sleeps on
/// `doorbell` (which the peer's producer rings when it publishes to a sleeping reader), so a
/// message costs one wake of this runtime and no thread hop. With `busy` polling the task
/// yields to the runtime instead of sleeping. Returns why it stopped, as
/// [`read_blocking`] does.
pub(super) async fn read_async(
    mut reader: Reader,
    doorbell: Doorbell,
    connection: &ConnectionIo,
    spins: u32,
    busy: bool,
    inbox: &InboxSender,
    mut on_sender: impl FnMut(NodeId),
) -> String {
    // SAFETY: the doorbell owns its descriptor for its whole life (nothing replaces or
    // closes it while it is registered), so `as_raw_fd` always names the same open file.
    let doorbell = match unsafe { AsyncFd::register_with_interest(doorbell, Interest::READABLE) } {
        Ok(doorbell) => doorbell,
        Err(e) => return format!("cannot watch the doorbell: {e}"),
    };
    let mut batch = Vec::new();
    let mut ring_closed = false;
    loop {
        let full = match reader.fill(&mut batch, &mut on_sender) {
            Ok(full) => full,
            Err(reason) => return reason,
        };
        if !batch.is_empty() && inbox.deliver(std::mem::take(&mut batch)).await.is_err() {
            return "the local inbox closed".into();
        }
        if full {
            // Let the runtime run what was just delivered before reading on.
            tokio::task::yield_now().await;
            continue;
        }
        if ring_closed {
            return PEER_CLOSED.into();
        }
        if connection.is_closed() {
            ring_closed = true;
            continue;
        }
        let mut ready = None;
        for _ in 0..spins {
            ready = reader.consumer.poll_data();
            if ready.is_some() {
                break;
            }
            std::hint::spin_loop();
        }
        if ready.is_none() && busy {
            tokio::task::yield_now().await;
            continue;
        }
        match ready.or_else(|| reader.consumer.sleep_on_doorbell()) {
            Some(WaitResult::Closed) => ring_closed = true,
            Some(_) => {}
            None => {
                if let Ok(Ok(mut guard)) =
                    tokio::time::timeout(WAIT_SLICE, doorbell.readable()).await
                {
                    guard.get_inner().clear();
                    guard.clear_ready();
                }
            }
        }
    }
}

/// Puts the referenced bytes of the peer's arena into the data segments they replace.
fn resolve_refs(msg: &mut Message, refs: &[Ref], arena: &PeerArena) -> Result<(), String> {
    for r in refs {
        let slot = msg
            .data
            .get_mut(r.index as usize)
            .filter(|d| d.is_empty())
            .ok_or_else(|| format!("no empty data segment {} to fill", r.index))?;
        *slot = arena.bytes(r).map_err(|e| e.to_string())?;
    }
    Ok(())
}
