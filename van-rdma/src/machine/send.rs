//! The sending half of [`Machine`]: credits, send slots and the send queue, frames in order,
//! the large-frame announcement and its RDMA WRITE, and the completions of what we posted.

use super::{Action, Machine, WriteOut, Writing, RESERVE};
use crate::protocol::{Header, Kind};

impl<F, M> Machine<F, M> {
    /// Whether a SEND may go now, keeping `credits - 1` credits back.
    fn can_send(&self, credits: u32) -> bool {
        self.credits >= credits && !self.free_slots.is_empty() && self.sq_used < self.send_queue
    }

    /// Queues a SEND from a free slot, its header returning what we owe; uses a credit.
    /// Callers check [`Machine::can_send`] first.
    fn send(&mut self, kind: Kind, id: u32, frame: Option<F>) {
        let Some(slot) = self.free_slots.pop() else {
            return;
        };
        if let Some(busy) = self.busy_slots.get_mut(slot) {
            *busy = true;
        }
        let credits = u16::try_from(self.owed).unwrap_or(u16::MAX);
        self.owed -= u32::from(credits);
        self.credits = self.credits.saturating_sub(1);
        self.sq_used += 1;
        let header = Header { kind, credits, id };
        self.out.push_back(Action::Send {
            slot,
            header,
            frame,
        });
    }

    /// Replies, writes and credits: what unblocks the peer or a started frame.
    pub(super) fn post_control(&mut self) {
        while self.can_send(RESERVE + 1) {
            let Some(r) = self.replies.pop_front() else {
                break;
            };
            let kind = Kind::Reply {
                len: r.len,
                addr: r.addr,
                rkey: r.rkey,
            };
            self.send(kind, r.id, None);
        }
        loop {
            if let Some(mut writing) = self.writing.take() {
                let done = self.continue_write(&mut writing);
                if !done {
                    self.writing = Some(writing);
                    break;
                }
                self.writes.insert(writing.id);
            }
            if self.credits <= RESERVE {
                break;
            }
            let Some(w) = self.writes_ready.pop_front() else {
                break;
            };
            // The last piece consumes one of the peer's receives: its credit, now.
            self.credits -= 1;
            self.out.push_back(Action::BeginWrite {
                id: w.id,
                frame: w.out.frame,
                len: w.out.len,
            });
            self.writing = Some(Writing {
                id: w.id,
                len: w.out.len,
                addr: w.addr,
                rkey: w.rkey,
                posted: 0,
            });
        }
        if self.owed >= self.threshold && self.can_send(1) {
            self.send(Kind::Credit, 0, None);
        }
    }

    /// Posts pieces of a large frame while the send queue has room; the last carries the
    /// immediate data that completes the peer's receive. Whether the last was posted.
    fn continue_write(&mut self, w: &mut Writing) -> bool {
        while self.sq_used < self.send_queue {
            let len = (w.len - w.posted).min(self.max_message);
            let last = w.posted + len == w.len;
            self.out.push_back(Action::Write {
                id: w.id,
                offset: w.posted,
                len,
                remote_addr: w.addr.saturating_add(w.posted as u64),
                rkey: w.rkey,
                last,
            });
            self.sq_used += 1;
            w.posted += len;
            if last {
                return true;
            }
        }
        false
    }

    /// Frames from the queue, in order, while credits, slots and the start depth allow.
    pub(super) fn post_queue(&mut self) {
        while let Some(item) = self.waiting.pop_front() {
            if !self.can_send(RESERVE + 1) {
                self.waiting.push_front(item);
                break;
            }
            if item.len.saturating_add(Header::LEN) <= self.send_bytes {
                self.send(Kind::Data, 0, Some(item.frame));
                continue;
            }
            // Frames announced and not completely written (the peer holds a buffer for each);
            // a write posted in full reaches the peer before a later START.
            if self.announced() >= self.start_depth {
                self.waiting.push_front(item);
                break;
            }
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1);
            self.send(
                Kind::Start {
                    len: item.len as u64,
                },
                id,
                None,
            );
            self.starts.insert(id, item);
        }
    }

    /// A SEND completed: its slot is free again.
    pub(super) fn on_sent(&mut self, slot: usize) -> Result<(), String> {
        match self.busy_slots.get_mut(slot) {
            Some(busy) if *busy => *busy = false,
            _ => {
                return Err(format!(
                    "a send from slot {slot} completed that was not posted"
                ))
            }
        }
        self.free_slots.push(slot);
        self.work_completed()
    }

    /// A piece of an RDMA WRITE completed; after the last (pieces complete in order on an RC
    /// queue pair) the frame's memory may go.
    pub(super) fn on_wrote(&mut self, id: u32, last: bool) -> Result<(), String> {
        let writing = self.writing.as_ref().is_some_and(|w| w.id == id);
        if last {
            if !self.writes.remove(&id) {
                return Err(format!(
                    "an RDMA write of frame {id} completed that was not posted"
                ));
            }
            self.out.push_back(Action::EndWrite { id });
        } else if !writing && !self.writes.contains(&id) {
            return Err(format!(
                "a piece of frame {id} completed that was not posted"
            ));
        }
        self.work_completed()
    }

    fn work_completed(&mut self) -> Result<(), String> {
        self.sq_used = self
            .sq_used
            .checked_sub(1)
            .ok_or("a work request completed that was not posted")?;
        Ok(())
    }

    /// The peer's reply to our `START`: the frame may be written.
    pub(super) fn on_reply(
        &mut self,
        id: u32,
        len: u64,
        addr: u64,
        rkey: u32,
    ) -> Result<(), String> {
        let out = self
            .starts
            .remove(&id)
            .ok_or("peer replied to a large message we never announced")?;
        if len != out.len as u64 {
            return Err("peer reserved the wrong size for a large message".into());
        }
        // Pieces are written at `addr + offset`: that must not wrap.
        if addr.checked_add(len).is_none() {
            return Err(format!("peer replied with an invalid address {addr:#x}"));
        }
        self.writes_ready.push_back(WriteOut {
            id,
            out,
            addr,
            rkey,
        });
        Ok(())
    }

    /// Returns `credits` of the peer's.
    pub(super) fn add_credits(&mut self, credits: u16) -> Result<(), String> {
        let total = self.credits.saturating_add(u32::from(credits));
        if total > self.peer_depth {
            return Err("peer returned more credits than it has buffers".into());
        }
        self.credits = total;
        Ok(())
    }
}
