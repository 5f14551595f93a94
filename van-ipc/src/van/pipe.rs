//! The bytes of a connection: the writer thread copying queued frames into the ring, the
//! direct path for small frames, and the reader thread reassembling and delivering them.

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;
use tracing::{debug, warn};
use van_core::wire::{self};
use van_core::{Event, InboxSender, Message, NodeId};

use super::{Connection, Shared, WAIT_SLICE};
use crate::arena::{self, PeerArena, Ref};
use crate::ring::{Consumer, Producer, FIRST, LAST};
use crate::WaitResult;

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
    pub(super) fn try_write(&self, frame: &[Bytes], connection: &Connection) -> bool {
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
    pub(super) frame: Vec<Bytes>,
}

/// Copies queued frames into the ring until the queue closes or the connection ends: each
/// frame's parts are copied once, straight into the ring, fragmented into records of at
/// most `max_record` bytes when larger.
pub(super) fn write_loop(
    mut frames: mpsc::Receiver<Outgoing>,
    direct: &Direct,
    connection: &Connection,
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
    connection: &Connection,
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
                        connection.closed.store(true, Ordering::Release);
                        return false;
                    }
                }
                Err(e) => {
                    warn!("IPC writer: {e}");
                    connection.closed.store(true, Ordering::Release);
                    return false;
                }
            }
        }
        producer.wake_consumer();
    }
    true
}

/// Reassembles frames from the ring and delivers them in batches; returns why it stopped.
pub(super) fn read_loop(
    mut consumer: Consumer,
    peer_arena: Option<&PeerArena>,
    connection: &Connection,
    shared: &Shared,
    inbox: &InboxSender,
    mut on_sender: impl FnMut(NodeId),
) -> String {
    let limits = shared.options.limits;
    let spins = shared.options.spins();
    // A full inbox nobody drains holds this thread only until the van stops.
    let abandon = || shared.links.is_stopped();
    let mut frame = BytesMut::new();
    let mut in_frame = false;
    let mut batch = Vec::new();
    let mut ring_closed = false;
    // References announced for the next frame.
    let mut refs: Option<Vec<Ref>> = None;
    loop {
        match consumer.try_pop(&mut frame) {
            Ok(Some(flags)) => {
                if flags & FIRST != 0 {
                    if in_frame {
                        return "peer started a frame inside another".into();
                    }
                    in_frame = true;
                } else if !in_frame {
                    return "peer continued a frame it never started".into();
                }
                if frame.len() as u64 > limits.max_frame {
                    return format!(
                        "peer sent a frame over the limit of {} bytes",
                        limits.max_frame
                    );
                }
                if flags & LAST == 0 {
                    // A fragmented frame: its header (in the first record) says how long it
                    // is, so the rest lands in one buffer without reallocating (the length
                    // was checked against the limits; a lie only costs this allocation).
                    if flags & FIRST != 0 {
                        if let Ok(header) = wire::FrameHeader::parse(&frame, &limits) {
                            let total = usize::try_from(header.frame_len).unwrap_or(0);
                            frame.reserve(total.saturating_sub(frame.len()));
                        }
                    }
                    continue;
                }
                in_frame = false;
                if frame.starts_with(&arena::REFS_MAGIC) {
                    if refs.is_some() || peer_arena.is_none() {
                        return "peer sent references it may not send".into();
                    }
                    match arena::decode_refs(&frame) {
                        Ok(r) => refs = Some(r),
                        Err(e) => return format!("peer corrupted the ring: {e}"),
                    }
                    frame.clear();
                    continue;
                }
                match wire::decode(frame.split().freeze(), &limits) {
                    Ok(mut msg) => {
                        if let (Some(refs), Some(arena)) = (refs.take(), peer_arena) {
                            if let Err(e) = resolve_refs(&mut msg, &refs, arena) {
                                return format!("peer sent a bad reference: {e}");
                            }
                        }
                        if let Some(sender) = msg.meta.sender {
                            on_sender(sender);
                        }
                        batch.push(Event::Message(msg));
                        if batch.len() >= MAX_BATCH
                            && inbox
                                .deliver_blocking(std::mem::take(&mut batch), abandon)
                                .is_err()
                        {
                            return "the local inbox closed".into();
                        }
                    }
                    Err(e) => return format!("bad frame from peer: {e}"),
                }
            }
            Ok(None) => {
                if !batch.is_empty()
                    && inbox
                        .deliver_blocking(std::mem::take(&mut batch), abandon)
                        .is_err()
                {
                    return "the local inbox closed".into();
                }
                // Only an empty ring ends the connection: what was written before a close
                // is always delivered.
                if ring_closed {
                    return "the peer closed the connection".into();
                }
                if connection.is_closed() {
                    // Drain once more (records may have landed just before), then end.
                    ring_closed = true;
                    continue;
                }
                if let WaitResult::Closed = consumer.wait_for_data(spins, WAIT_SLICE) {
                    // Drain once more: records may have landed just before the close.
                    ring_closed = true;
                }
            }
            Err(e) => return format!("peer corrupted the ring: {e}"),
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
