//! The sending half of an I/O thread: one vectored (or zero-copy) send per connection in
//! flight, each owning its memory until the kernel lets go.

use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use bytes::Bytes;
use io_uring::{cqueue, opcode};
use tracing::{debug, warn};
use van_core::link::stream::Closed;

use super::state::{user_data, SendOp, Worker, K_SEND};

/// Most frames one send takes from a peer queue.
const MAX_BATCH_FRAMES: usize = 256;
/// Most iovecs per `sendmsg` (Linux `UIO_MAXIOV`).
const MAX_IOVECS: usize = 1024;
/// `IORING_SEND_ZC_REPORT_USAGE`: ask the notification to say whether the kernel copied.
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// `IORING_NOTIF_USAGE_ZC_COPIED`, in a notification's result.
const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;

impl Worker {
    // ---- sending ----------------------------------------------------------------------

    /// Submits the next send of connection `id` if none is outstanding: what is left of
    /// the last one, else everything its queue holds (up to the batch limits).
    pub(super) fn pump_send(&mut self, id: u64) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.closing || conn.sending || conn.write_error.is_some() {
            return;
        }
        if conn.out.is_empty() && !conn.queue_done {
            if let Some(queue) = &mut conn.queue {
                let mut cx = Context::from_waker(&conn.waker);
                match queue.poll_recv_many(&mut cx, &mut self.frames, MAX_BATCH_FRAMES) {
                    Poll::Ready(0) => conn.queue_done = true,
                    Poll::Ready(_) => {
                        for frame in self.frames.drain(..) {
                            conn.out.extend(frame);
                        }
                    }
                    Poll::Pending => {}
                }
            }
        }
        if conn.out.is_empty() {
            return;
        }
        let Some(slot) = conn.sends.iter().position(Option::is_none) else {
            return; // every slot waits for a zero-copy notification, which pumps again
        };
        let count = conn.out.len().min(MAX_IOVECS);
        let parts: Vec<Bytes> = conn.out.drain(..count).collect();
        let total: usize = parts.iter().map(Bytes::len).sum();
        let threshold = self.shared.options.zc_threshold.unwrap_or(usize::MAX);
        let zc = conn.zc && total >= threshold;
        let iov: Vec<libc::iovec> = parts
            .iter()
            .map(|part| libc::iovec {
                iov_base: part.as_ptr() as *mut libc::c_void,
                iov_len: part.len(),
            })
            .collect();
        // SAFETY: an all-zero msghdr is valid (no name, no control data).
        let mut msg: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = iov.len() as _;
        let msg_ptr: *const libc::msghdr = &*msg;
        let fd = conn.fd();
        conn.sends[slot] = Some(SendOp {
            parts,
            iov,
            msg,
            zc,
            completed: false,
            notification_pending: false,
        });
        conn.sending = true;
        let data = user_data(K_SEND, id, slot);
        let entry = if zc {
            self.shared.stats.zc_sends.fetch_add(1, Ordering::Relaxed);
            opcode::SendMsgZc::new(fd, msg_ptr)
                .flags(libc::MSG_NOSIGNAL as u32)
                .ioprio(SEND_ZC_REPORT_USAGE)
                .build()
        } else {
            opcode::SendMsg::new(fd, msg_ptr)
                .flags(libc::MSG_NOSIGNAL as u32)
                .build()
        }
        .user_data(data);
        self.shared.stats.send_ops.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the msghdr, its iovec array and the bytes they point to are owned by the
        // `SendOp` in slot `slot` of this connection, which is freed only after the send's
        // completion and, for a zero-copy send, its notification (`on_send`); the connection
        // itself is dropped only when every slot is empty (`reap_connection`).
        unsafe { self.push(entry) };
    }

    pub(super) fn on_send(&mut self, id: u64, slot: usize, result: i32, flags: u32) {
        let Some(conn) = self.conns.get_mut(&id) else {
            warn!(id, "send completion for a connection that is gone");
            return;
        };
        let Some(op) = conn.sends.get_mut(slot).and_then(Option::as_mut) else {
            warn!(id, slot, "send completion for an empty slot");
            return;
        };
        let mut closed = None;
        let was_in_kernel = !op.completed || op.notification_pending;
        if cqueue::notif(flags) {
            op.notification_pending = false;
            let forced = self.shared.options.zc_loopback;
            if (result as u32) & NOTIF_USAGE_ZC_COPIED != 0 && conn.zc && !forced {
                // The kernel copied anyway (loopback, or a device without scatter-gather):
                // zero-copy only adds the notification; plain sends are cheaper.
                debug!(id, remote = %conn.remote, "kernel copied zero-copy sends; using plain sends");
                conn.zc = false;
                self.shared.stats.zc_copied.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            op.completed = true;
            op.notification_pending = op.zc && cqueue::more(flags);
            conn.sending = false;
        }
        if was_in_kernel && op.completed && !op.notification_pending {
            // The kernel is done with this send's memory: count that before any of it is
            // released (the ownership tests read this counter from the buffers' destructor).
            self.shared.stats.send_ops.fetch_sub(1, Ordering::Relaxed);
        }
        if !cqueue::notif(flags) {
            if result < 0 {
                if !conn.closing && conn.write_error.is_none() {
                    // Writing is over, reading is not: what the peer sent before the
                    // connection broke (it may have reset it right after its last frame) is
                    // still in the socket, and the receive ends the connection once it has
                    // taken that. With no receive left to do so, it ends here.
                    let e = std::io::Error::from_raw_os_error(-result);
                    warn!(
                        id,
                        remote = %conn.remote,
                        peer = ?conn.peer,
                        "cannot write to the connection; queued frames are lost: {e}"
                    );
                    conn.write_error = Some(-result);
                    conn.queue = None;
                    conn.queue_done = true;
                    conn.out.clear();
                    if !conn.multishot && !conn.direct && !self.parked.contains(&id) {
                        closed = Some(Closed::Io(e));
                    }
                }
            } else if !conn.closing && conn.write_error.is_none() {
                // What was not written goes back to the front of the queue, in order. A
                // zero-copy send keeps its own parts until the notification.
                let mut sent = result as usize;
                let parts: Vec<Bytes> = if op.notification_pending {
                    op.parts.clone()
                } else {
                    std::mem::take(&mut op.parts)
                };
                let mut rest = Vec::new();
                for mut part in parts {
                    if sent >= part.len() {
                        sent -= part.len();
                        continue;
                    }
                    part = part.slice(sent..);
                    sent = 0;
                    rest.push(part);
                }
                for part in rest.into_iter().rev() {
                    conn.out.push_front(part);
                }
            }
        }
        if op.completed && !op.notification_pending {
            conn.sends[slot] = None;
        }
        match closed {
            Some(closed) => self.close(id, closed, false),
            None => self.pump_send(id),
        }
    }
}
