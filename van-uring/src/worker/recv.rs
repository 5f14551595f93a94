//! The receiving half of an I/O thread: multishot receives into provided buffers, direct
//! receives into a large frame's buffer, and the switch between them.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use io_uring::{cqueue, opcode, squeue, types};
use van_core::link::stream::Closed;
use van_core::{Event, Message, NodeId, WireError};

use super::state::{user_data, Conn, Worker, K_RECV_DIRECT, K_RECV_MULTI};
use crate::bufring::GROUP;
use crate::shared::Shared;

/// A large frame with more than this many provided buffers' worth still to come makes a
/// connection receive one buffer at a time (see `Conn::single_shot`).
const SINGLE_SHOT_MIN: usize = 4;

impl Worker {
    // ---- receiving --------------------------------------------------------------------

    /// Arms the next receive of an idle connection: straight into the large frame's buffer
    /// when one is pending, else multishot into provided buffers (unless the inbox is full).
    pub(super) fn next_recv(&mut self, id: u64) {
        let backlogged = self.delivering.is_some();
        let stopping = self.stopping.is_some();
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.closing || stopping || conn.multishot || conn.direct {
            return;
        }
        let fd = conn.fd();
        if let Some((ptr, room)) = conn.reassembly.large_target() {
            conn.direct = true;
            let entry = opcode::Recv::new(fd, ptr, room)
                .build()
                .user_data(user_data(K_RECV_DIRECT, id, 0));
            self.shared.stats.recv_ops.fetch_add(1, Ordering::Relaxed);
            // SAFETY: `ptr..ptr+room` is spare capacity of the large frame's buffer, owned by
            // this connection's reassembly, which is neither touched nor dropped while
            // `conn.direct` is set (cleared by this receive's completion).
            unsafe { self.push(entry) };
            return;
        }
        if backlogged {
            self.parked.push(id);
            return;
        }
        conn.multishot = true;
        // A multishot receive armed once the peer has ended the stream (reset it, typically
        // while this connection's reading was paused for a full inbox) takes the bytes left
        // and then never completes (seen on Linux 6.18): the end is never reported. From then
        // on single receives, each of which reports it. Only multishot arms pay for the check.
        if !conn.single_shot && !conn.peer_done {
            conn.peer_done = peer_done(&conn.fd());
        }
        let entry = if conn.single_shot || conn.peer_done {
            // One provided buffer, chosen by the kernel; completes like a multishot
            // receive's last completion.
            opcode::Recv::new(fd, std::ptr::null_mut(), self.bufs.buffer_len())
                .buf_group(GROUP)
                .build()
                .flags(squeue::Flags::BUFFER_SELECT)
        } else {
            opcode::RecvMulti::new(fd, GROUP).build()
        }
        .user_data(user_data(K_RECV_MULTI, id, 0));
        self.shared.stats.recv_ops.fetch_add(1, Ordering::Relaxed);
        // SAFETY: a multishot receive writes only into buffers of the provided-buffer ring,
        // which stays registered (and its buffers allocated) until no receive is in flight.
        unsafe { self.push(entry) };
    }

    pub(super) fn on_recv_multi(&mut self, id: u64, result: i32, flags: u32) {
        let more = cqueue::more(flags);
        let bid = cqueue::buffer_select(flags);
        if !more {
            self.shared.stats.recv_ops.fetch_sub(1, Ordering::Relaxed);
        }
        let data = match (result, bid) {
            (n, Some(bid)) if n > 0 => self.bufs.take(bid, n as usize).map(|buf| (bid, buf)),
            (_, Some(bid)) => {
                // A buffer with no data: give it straight back.
                if let Some(buf) = self.bufs.take(bid, 0) {
                    self.bufs.give_back(bid, buf);
                }
                None
            }
            _ => None,
        };
        let stopping = self.stopping.is_some();
        // The inbox is full: buffers are not lent again until it drains (see `BufRing::hold`).
        let backlogged = self.delivering.is_some();
        let Some(conn) = self.conns.get_mut(&id) else {
            if let Some((bid, buf)) = data {
                self.bufs.give_back(bid, buf);
            }
            return;
        };
        if !more {
            conn.multishot = false;
            conn.cancel_sent = false;
        }
        let mut closed = None;
        if let Some((bid, buf)) = data {
            if conn.closing || stopping {
                self.bufs.give_back(bid, buf);
            } else {
                let Conn {
                    id,
                    reassembly,
                    peer,
                    ..
                } = conn;
                let shared = &self.shared;
                let batch = &mut self.batch;
                let mut out = |msg: Message| on_message(msg, *id, peer, shared, batch);
                let result = if reassembly.adopts(buf.len()) {
                    // The buffer becomes the messages' storage; the ring gets a fresh one.
                    reassembly.push_owned(Bytes::from(buf), &mut out)
                } else {
                    let result = reassembly.push_slice(&buf, &mut out);
                    if backlogged {
                        self.bufs.hold(bid, buf);
                    } else {
                        self.bufs.give_back(bid, buf);
                    }
                    result
                };
                if let Err(e) = result {
                    closed = Some(Closed::Wire(e));
                }
            }
        } else if result == 0 {
            closed = Some(match conn.reassembly.truncated() {
                Some(e) => Closed::Wire(e),
                None => Closed::Eof,
            });
        } else if result < 0 {
            match -result {
                libc::ENOBUFS => {
                    // Every provided buffer is out: wait for the ring to be replenished.
                    if !conn.closing && !stopping {
                        self.parked.push(id);
                    }
                    return;
                }
                libc::ECANCELED => {}
                errno => closed = Some(Closed::Io(std::io::Error::from_raw_os_error(errno))),
            }
        }
        if let Some(closed) = closed {
            let closed = conn.ended(closed);
            self.close(id, closed, false);
            return;
        }
        let copied = conn.reassembly.take_copied_large();
        if copied > 0 {
            self.shared
                .stats
                .large_copied
                .fetch_add(copied, Ordering::Relaxed);
        }
        // Frames of a few buffers are cheaper to copy than to receive in two steps.
        if conn.reassembly.large_remaining() > SINGLE_SHOT_MIN * self.bufs.buffer_len() as usize {
            conn.single_shot = true;
        } else if !more && result > 0 && !conn.reassembly.in_large_frame() {
            conn.single_shot = false;
        }
        let switch = conn.reassembly.in_large_frame() && conn.multishot && !conn.cancel_sent;
        if switch {
            // The rest of a large frame goes straight into its own buffer: stop the
            // multishot receive first, so the two never race for the same bytes.
            conn.cancel_sent = true;
            self.cancel(user_data(K_RECV_MULTI, id, 0), id);
        } else if !more {
            self.next_recv(id);
        }
    }

    pub(super) fn on_recv_direct(&mut self, id: u64, result: i32) {
        self.shared.stats.recv_ops.fetch_sub(1, Ordering::Relaxed);
        let stopping = self.stopping.is_some();
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        conn.direct = false;
        if conn.closing || stopping {
            return;
        }
        let closed = match result {
            n if n > 0 => {
                let Conn {
                    id,
                    reassembly,
                    peer,
                    ..
                } = conn;
                let shared = &self.shared;
                let batch = &mut self.batch;
                let mut out = |msg: Message| on_message(msg, *id, peer, shared, batch);
                reassembly
                    .large_filled(n as usize, &mut out)
                    .err()
                    .map(Closed::Wire)
            }
            0 => Some(Closed::Wire(conn.reassembly.truncated().unwrap_or(
                WireError::Truncated {
                    needed: 1,
                    available: 0,
                },
            ))),
            n if n == -libc::ECANCELED => None,
            n => Some(Closed::Io(std::io::Error::from_raw_os_error(-n))),
        };
        match closed {
            Some(closed) => {
                let closed = conn.ended(closed);
                self.close(id, closed, false)
            }
            None => self.next_recv(id),
        }
    }
}

/// A message arrived on a connection: learn who is on it, and queue it for the inbox.
fn on_message(
    msg: Message,
    id: u64,
    peer: &mut Option<NodeId>,
    shared: &Shared,
    batch: &mut Vec<Event>,
) {
    if peer.is_none() {
        if let Some(sender) = msg.meta.sender {
            *peer = Some(sender);
            shared.links.learn(id, sender);
        }
    }
    batch.push(Event::Message(msg));
}

/// Whether the peer has ended the stream or the socket failed: poll without waiting for a
/// hang-up, half-close or error (a failed poll counts as ended, so single receives report it).
fn peer_done(fd: &types::Fd) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    // SAFETY: the descriptor belongs to a connection whose socket is open while receives are
    // armed (`Conn::stream` is `Some` until the connection closes), and is borrowed for the
    // call only.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd.0) };
    let mut fds = [PollFd::new(&fd, PollFlags::RDHUP)];
    match poll(
        &mut fds,
        Some(&Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        }),
    ) {
        Ok(_) => fds[0]
            .revents()
            .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR),
        Err(_) => true,
    }
}
