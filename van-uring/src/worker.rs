//! One I/O thread: its ring, its provided-buffer ring, and the connections it owns.
//!
//! Nothing here is shared with other threads except through the thread's [`CommandQueue`]
//! (commands in, ready connections in) and the van's [`Shared`] state (routes, counters).
//! Every operation the kernel may still be working on owns its memory through this thread's
//! tables (in [`state`]):
//!
//! - a send owns its frames' `Bytes`, its iovec array and its `msghdr` in a
//!   [`SendOp`](state::SendOp) slot of its connection until the completion arrives — and, for
//!   `SENDMSG_ZC`, until the notification arrives too;
//! - a multishot receive writes only into provided buffers, which belong to the [`BufRing`]
//!   until a completion hands one back;
//! - a direct receive of a large frame writes into that frame's buffer, owned by the
//!   connection's [`Reassembly`];
//! - a connection — its socket, its send slots, its reassembly — is dropped only when none of
//!   its operations is in flight, however it ended (peer closed, bad frame, cancel, stop).
//!
//! At shutdown the thread cancels everything and keeps reaping completions until every
//! operation has ended; only if the kernel has not answered within [`DRAIN_TIMEOUT`] does it
//! leak what is left rather than free memory the kernel may still use.

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use std::future::Future;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use io_uring::{opcode, squeue, types, IoUring};
use rustix::thread::CpuSet;
use tokio::sync::oneshot;
use tracing::{debug, warn};
use van_core::link::stream::Closed;
use van_core::van::InboxClosed;
use van_core::Event;

use crate::bufring::BufRing;
use crate::command_queue::{Command, CommandQueue, DeliveryWaker, NewConnection, QueueWaker};
use crate::error::{setup_failed, UringError};
use crate::reassembly::Reassembly;
use crate::shared::Shared;
use crate::MAX_BATCH_EVENTS;

mod recv;
mod send;
mod state;

pub(crate) use state::Worker;
use state::{
    user_data, Conn, Delivery, Stopping, K_CANCEL, K_EVENTFD, K_RECV_DIRECT, K_RECV_MULTI, K_SEND,
};

/// Send slots per connection: one send in flight, the others zero-copy sends waiting for
/// their notification.
const SEND_SLOTS: usize = 16;
/// Completions handled between checks of the batch's size.
const REAP_CHUNK: usize = 8;
/// How often a stopping loop looks whether flushed connections were acknowledged.
const ACK_POLL: Duration = Duration::from_millis(1);
/// After stop gave up on flushing, how long the kernel has to return every buffer.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// With busy polling, how long the thread spins on its queues before it blocks.
const BUSY_SPIN: Duration = Duration::from_millis(2);

/// Settings of one thread.
pub(crate) struct WorkerSetup {
    pub(crate) index: usize,
    pub(crate) busy_polling: bool,
    pub(crate) pin_to: Option<usize>,
}

impl Worker {
    /// Sets up the ring and the buffer ring on the calling thread (the I/O thread).
    pub(crate) fn new(
        setup: &WorkerSetup,
        command_queue: Arc<CommandQueue>,
        shared: Arc<Shared>,
    ) -> Result<Worker, UringError> {
        let options = &shared.options;
        if options.simulate_unavailable {
            return Err(setup_failed(&std::io::Error::from_raw_os_error(
                libc::ENOSYS,
            )));
        }
        if let Some(cpu) = setup.pin_to {
            pin_to_cpu(cpu);
        }
        let entries = options.ring_entries.clamp(64, 4096).next_power_of_two();
        let mut builder = IoUring::builder();
        builder.setup_cqsize(entries * 4);
        let mut sqpoll = false;
        let ring = if setup.busy_polling {
            let mut with_poll = IoUring::builder();
            with_poll.setup_cqsize(entries * 4).setup_sqpoll(100);
            match with_poll.build(entries) {
                Ok(ring) => {
                    sqpoll = true;
                    Ok(ring)
                }
                Err(e) => {
                    warn!(
                        "io_uring SQPOLL is not permitted here ({e}); busy polling without it \
                         (the I/O thread still spins on its completion queue)"
                    );
                    builder.build(entries)
                }
            }
        } else {
            builder.build(entries)
        }
        .map_err(|e| setup_failed(&e))?;
        let mut probe = io_uring::Probe::new();
        if let Err(e) = ring.submitter().register_probe(&mut probe) {
            return Err(UringError::Unavailable {
                reason: format!("cannot probe io_uring operations: {e}"),
            });
        }
        for (code, name) in [
            (opcode::Recv::CODE, "RECV"),
            (opcode::SendMsg::CODE, "SENDMSG"),
            (opcode::AsyncCancel::CODE, "ASYNC_CANCEL"),
            (opcode::Read::CODE, "READ"),
        ] {
            if !probe.is_supported(code) {
                return Err(UringError::Unavailable {
                    reason: format!("the kernel's io_uring lacks {name}"),
                });
            }
        }
        let zc_supported = probe.is_supported(opcode::SendMsgZc::CODE);
        let bufs =
            BufRing::new(&ring, options.ring_buffers(), options.buffer_bytes()).map_err(|e| {
                UringError::Unavailable {
                    reason: format!("cannot register a provided-buffer ring (kernel 5.19+): {e}"),
                }
            })?;
        debug!(
            index = setup.index,
            sqpoll, zc_supported, "io_uring thread ready"
        );
        let delivery_waker = Waker::from(Arc::new(DeliveryWaker {
            command_queue: Arc::clone(&command_queue),
        }));
        Ok(Worker {
            index: setup.index,
            ring,
            bufs,
            command_queue,
            shared,
            conns: HashMap::new(),
            inbox: None,
            batch: Vec::new(),
            delivering: None,
            delivery_waker,
            eventfd_buf: Box::new(0),
            eventfd_armed: false,
            stopping: None,
            parked: Vec::new(),
            overflow: VecDeque::new(),
            busy: setup.busy_polling,
            zc_supported,
            commands: Vec::new(),
            ready: Vec::new(),
            cqes: Vec::new(),
            frames: Vec::new(),
        })
    }

    /// The event loop on a thread of its own; returns when stopped and every operation has
    /// ended.
    pub(crate) fn run(mut self, done: oneshot::Sender<()>) {
        while !self.turn() {
            self.wait();
            self.reap();
        }
        self.teardown();
        let _ = done.send(());
    }

    /// The event loop as a task of the application's runtime: the same turns, but waiting is
    /// awaiting the ring's descriptor (readable when completions are posted), the command
    /// queue's wake and any deadline, so the runtime thread drives the ring and nothing
    /// crosses threads per message. Ends when stopped and every operation has ended.
    ///
    /// Dropped unfinished (the runtime shut down first), it frees nothing the kernel may
    /// still write: the ring, its buffers and its connections are leaked instead.
    ///
    /// The guard is taken before the first poll: a loop whose runtime ends before it ever
    /// ran still refuses the connections posted to it.
    pub(crate) fn run_task(
        self,
        done: oneshot::Sender<()>,
    ) -> impl std::future::Future<Output = ()> + Send {
        Worker::drive(Unfinished(Some(self)), done)
    }

    async fn drive(mut guard: Unfinished, done: oneshot::Sender<()>) {
        let Some(worker) = guard.0.as_mut() else {
            return;
        };
        let fd = RingFd(worker.ring.as_raw_fd());
        // SAFETY: the descriptor is the ring's, which `worker` owns and keeps open until
        // `teardown`, after `ready` is dropped (or never closes, when leaked).
        let ready = match unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) } {
            Ok(ready) => ready,
            Err(e) => {
                warn!("cannot watch the io_uring descriptor: {e}; using a thread");
                if let Some(worker) = guard.0.take() {
                    let index = worker.index;
                    // Nothing was submitted yet, so a worker that cannot get its thread is
                    // simply dropped (its connections' sends then fail); `done` goes with it.
                    let spawned = std::thread::Builder::new()
                        .name(format!("vans-uring-{index}"))
                        .spawn(move || worker.run(done));
                    if let Err(e) = spawned {
                        warn!(index, "cannot start the io_uring thread either: {e}");
                    }
                }
                return;
            }
        };
        while !worker.turn() {
            worker.wait_task(&ready).await;
            worker.reap();
        }
        drop(ready);
        if let Some(worker) = guard.0.take() {
            worker.teardown();
        }
        let _ = done.send(());
    }

    /// One turn of the loop: commands, ready queues, delivery, receive buffers,
    /// stopping. Returns whether the loop is over.
    fn turn(&mut self) -> bool {
        {
            self.command_queue.begin();
            self.handle_commands();
            self.handle_ready();
            self.deliver();
            if self.delivering.is_none() && self.stopping.is_none() {
                self.bufs.replenish();
                for id in std::mem::take(&mut self.parked) {
                    self.next_recv(id);
                }
            }
            if self.progress_stop() {
                return true;
            }
            self.shared.stats.ring_lent[self.index].store(self.bufs.lent(), Ordering::Relaxed);
        }
        false
    }

    // ---- submission -------------------------------------------------------------------

    /// Queues an entry. The caller guarantees (and says in a `SAFETY` comment) that every
    /// buffer the entry points to is owned by this thread's tables until its completion.
    ///
    /// # Safety
    ///
    /// As above: the memory the entry references must stay valid until the kernel posts the
    /// operation's last completion.
    unsafe fn push(&mut self, entry: squeue::Entry) {
        if self.overflow.is_empty() {
            // SAFETY: forwarded from the caller.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return;
            }
            let _ = self.ring.submit();
            // SAFETY: forwarded from the caller.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return;
            }
        }
        self.overflow.push_back(entry);
    }

    fn flush_overflow(&mut self) {
        while let Some(entry) = self.overflow.pop_front() {
            // SAFETY: every entry in `overflow` was pushed by `push`, whose callers
            // guaranteed its memory until completion.
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                self.overflow.push_front(entry);
                if self.ring.submit().is_err() {
                    return;
                }
                if self.ring.submission().is_full() {
                    return;
                }
            }
        }
    }

    fn cancel(&mut self, target: u64, connection: u64) {
        let entry = opcode::AsyncCancel::new(target)
            .build()
            .user_data(user_data(K_CANCEL, connection, 0));
        // SAFETY: a cancel references no memory.
        unsafe { self.push(entry) };
    }

    // ---- waiting ----------------------------------------------------------------------

    fn wait(&mut self) {
        self.flush_overflow();
        if !self.eventfd_armed {
            let entry = opcode::Read::new(
                types::Fd(self.command_queue.eventfd()),
                (&mut *self.eventfd_buf as *mut u64).cast(),
                8,
            )
            .build()
            .user_data(user_data(K_EVENTFD, 0, 0));
            // SAFETY: `eventfd_buf` is a heap box owned by this worker; `teardown` keeps it
            // until this read's completion (or leaks it).
            unsafe { self.push(entry) };
            self.eventfd_armed = true;
        }
        if !self.ring.completion().is_empty() || !self.command_queue.arm() {
            let _ = self.ring.submit();
            self.command_queue.disarm();
            return;
        }
        if self.busy {
            let spin_until = Instant::now() + BUSY_SPIN;
            let _ = self.ring.submit();
            while Instant::now() < spin_until {
                if !self.ring.completion().is_empty() || self.command_queue.has_work() {
                    self.command_queue.disarm();
                    return;
                }
                std::hint::spin_loop();
            }
        }
        let result = match self.deadline() {
            None => self.ring.submit_and_wait(1),
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now());
                let ts = types::Timespec::new()
                    .sec(left.as_secs())
                    .nsec(left.subsec_nanos());
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
        };
        if let Err(e) = result {
            match e.raw_os_error() {
                Some(libc::EINTR | libc::ETIME | libc::EBUSY | libc::EAGAIN) => {}
                _ => {
                    warn!("io_uring wait failed: {e}");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        self.command_queue.disarm();
    }

    /// When the loop must look again even if nothing happens: a stop's deadline, or soon
    /// while flushed connections wait for their peers' acknowledgements.
    fn deadline(&self) -> Option<Instant> {
        let stop = self.stopping.as_ref()?;
        let at = stop.forced_until.unwrap_or(stop.deadline);
        if stop.forced_until.is_none() && self.conns.values().any(|c| !c.closing && c.flushed()) {
            return Some(at.min(Instant::now() + ACK_POLL));
        }
        Some(at)
    }

    /// [`wait`](Self::wait) for a loop running as a task: submits, then awaits the ring's
    /// descriptor, the command queue and the deadline, whichever comes first.
    async fn wait_task(&mut self, ready: &AsyncFd<RingFd>) {
        self.flush_overflow();
        if let Err(e) = self.ring.submit() {
            if !matches!(
                e.raw_os_error(),
                Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
            ) {
                warn!("io_uring submit failed: {e}");
            }
        }
        if !self.ring.completion().is_empty() {
            return;
        }
        let mut sleep = self
            .deadline()
            .map(|at| Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(at))));
        let command_queue = &self.command_queue;
        std::future::poll_fn(|cx| {
            if !command_queue.arm_task(cx.waker()) {
                return Poll::Ready(());
            }
            if let Poll::Ready(result) = ready.poll_read_ready(cx) {
                if let Ok(mut guard) = result {
                    // Completions are reaped next; any posted later raise a new edge.
                    guard.clear_ready();
                }
                return Poll::Ready(());
            }
            match sleep.as_mut() {
                Some(sleep) => sleep.as_mut().poll(cx),
                None => Poll::Pending,
            }
        })
        .await;
        self.command_queue.disarm();
    }

    /// Handles completions until none is left, or until the batch of events for the inbox
    /// is full: under a continuous flood every buffer given back is filled again at once, so
    /// an unbounded reap would grow the batch (and starve sends) for as long as the flood
    /// lasts. While a delivery is pending, buffers are held (see `BufRing::hold`), so the
    /// completions left are bounded by the buffers and are all taken.
    fn reap(&mut self) {
        loop {
            if self.delivering.is_none() && self.batch.len() >= MAX_BATCH_EVENTS {
                return;
            }
            let mut cqes = std::mem::take(&mut self.cqes);
            cqes.clear();
            cqes.extend(
                self.ring
                    .completion()
                    .take(REAP_CHUNK)
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
            if cqes.is_empty() {
                self.cqes = cqes;
                return;
            }
            for (data, result, flags) in cqes.drain(..) {
                self.complete(data, result, flags);
            }
            self.cqes = cqes;
        }
    }

    fn complete(&mut self, data: u64, result: i32, flags: u32) {
        let kind = data & 0xff;
        let slot = ((data >> 8) & 0xffff) as usize;
        let id = data >> 24;
        match kind {
            K_EVENTFD => self.eventfd_armed = false,
            K_RECV_MULTI => self.on_recv_multi(id, result, flags),
            K_RECV_DIRECT => self.on_recv_direct(id, result),
            K_SEND => self.on_send(id, slot, result, flags),
            K_CANCEL => {
                if result == -libc::EALREADY {
                    // The receive was mid-flight; ask again.
                    if let Some(conn) = self.conns.get(&id) {
                        if conn.multishot {
                            self.cancel(user_data(K_RECV_MULTI, id, 0), id);
                        }
                    }
                }
            }
            _ => warn!(data, "completion of an unknown operation"),
        }
        if matches!(kind, K_RECV_MULTI | K_RECV_DIRECT | K_SEND) {
            self.reap_connection(id);
        }
    }

    /// Closes a closing connection's socket once only notifications are outstanding, and
    /// drops the connection once the kernel holds nothing of it.
    fn reap_connection(&mut self, id: u64) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if !conn.closing {
            return;
        }
        if conn.only_notifications() {
            conn.stream = None;
        }
        if conn.idle() {
            self.conns.remove(&id);
            self.shared
                .stats
                .connections
                .fetch_sub(1, Ordering::Relaxed);
        }
    }

    // ---- commands ---------------------------------------------------------------------

    fn handle_commands(&mut self) {
        let mut commands = std::mem::take(&mut self.commands);
        self.command_queue.take_commands(&mut commands);
        for command in commands.drain(..) {
            match command {
                Command::Inbox(inbox) => {
                    if self.stopping.is_none() {
                        self.inbox = Some(inbox);
                    }
                }
                Command::Adopt(new) => self.adopt(new),
                Command::Abort(id) => self.close(id, Closed::Stopped, false),
                Command::Stop { flush, deadline } => self.begin_stop(flush, deadline),
            }
        }
        self.commands = commands;
    }

    fn handle_ready(&mut self) {
        let mut ready = std::mem::take(&mut self.ready);
        self.command_queue.take_ready(&mut ready);
        for id in ready.drain(..) {
            self.pump_send(id);
        }
        self.ready = ready;
    }

    fn adopt(&mut self, new: NewConnection) {
        if self.stopping.is_some() {
            return; // dropping it closes the socket; its sends fail
        }
        let waker = Waker::from(Arc::new(QueueWaker {
            command_queue: Arc::clone(&self.command_queue),
            connection: new.id,
        }));
        let options = &self.shared.options;
        let zc = self.zc_supported
            && options.zc_threshold.is_some()
            && (options.zc_loopback || !new.remote.ip().is_loopback());
        let conn = Conn {
            id: new.id,
            raw_fd: new.stream.as_raw_fd(),
            stream: Some(new.stream),
            remote: new.remote,
            peer: new.peer,
            queue: Some(new.queue),
            queue_done: false,
            waker,
            reassembly: Reassembly::new(options.limits, self.shared.pool.clone()),
            multishot: false,
            single_shot: false,
            direct: false,
            cancel_sent: false,
            out: VecDeque::new(),
            sends: (0..SEND_SLOTS).map(|_| None).collect(),
            sending: false,
            zc,
            closing: false,
            write_error: None,
            peer_done: false,
        };
        debug!(id = new.id, remote = %new.remote, peer = ?new.peer, thread = self.index, "connection adopted");
        self.conns.insert(new.id, conn);
        self.shared
            .stats
            .connections
            .fetch_add(1, Ordering::Relaxed);
        self.next_recv(new.id);
        self.pump_send(new.id);
    }

    // ---- closing ----------------------------------------------------------------------

    /// Ends connection `id`: no more reading or writing, its queue closed (so sends fail),
    /// its peer reported lost unless the van is stopping, and every operation cancelled.
    /// Its memory is freed by `reap_connection` once the kernel has ended every operation.
    ///
    /// A `graceful` close (after a flush) lets the kernel deliver what was written; any other
    /// is abortive (`SO_LINGER` 0: a reset, and the kernel drops unsent data at once, which
    /// also releases the pages of zero-copy sends).
    fn close(&mut self, id: u64, closed: Closed, graceful: bool) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.closing {
            return;
        }
        conn.closing = true;
        conn.queue = None;
        conn.out.clear();
        if let Some(stream) = &conn.stream {
            if !graceful {
                if let Err(e) = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO)) {
                    debug!("cannot make the close abortive: {e}");
                }
            }
            let _ = rustix::net::shutdown(stream, rustix::net::Shutdown::Both);
        }
        let (peer, remote) = (conn.peer, conn.remote);
        let mut cancels = Vec::new();
        if conn.multishot && !conn.cancel_sent {
            conn.cancel_sent = true;
            cancels.push(user_data(K_RECV_MULTI, id, 0));
        }
        if conn.direct {
            cancels.push(user_data(K_RECV_DIRECT, id, 0));
        }
        for (slot, op) in conn.sends.iter().enumerate() {
            if op.as_ref().is_some_and(|op| !op.completed) {
                cancels.push(user_data(K_SEND, id, slot));
            }
        }
        for target in cancels {
            self.cancel(target, id);
        }
        let reason = closed.to_string();
        if closed.is_failure() {
            warn!(%remote, ?peer, "dropping connection: {reason}");
        } else {
            debug!(%remote, ?peer, "connection closed: {reason}");
        }
        if let Some(lost) = self.shared.links.closed(id, &reason) {
            if self.inbox.is_some() {
                self.batch.push(Event::PeerLost(lost));
            }
        }
        self.reap_connection(id);
    }

    // ---- delivering -------------------------------------------------------------------

    /// Hands the events of this round to the inbox: one channel hop per batch. A full inbox
    /// leaves the batch pending (its waker wakes the ring) and receiving pauses meanwhile.
    fn deliver(&mut self) {
        if let Some(delivery) = &mut self.delivering {
            let mut cx = Context::from_waker(&self.delivery_waker);
            match delivery.as_mut().poll(&mut cx) {
                Poll::Pending => return,
                Poll::Ready(Ok(())) => self.delivering = None,
                Poll::Ready(Err(InboxClosed)) => {
                    self.delivering = None;
                    self.inbox = None;
                }
            }
        }
        if self.batch.is_empty() {
            return;
        }
        let Some(inbox) = &self.inbox else {
            self.batch.clear();
            return;
        };
        let inbox = inbox.clone();
        let batch = std::mem::take(&mut self.batch);
        self.shared
            .stats
            .largest_batch
            .fetch_max(batch.len(), Ordering::Relaxed);
        let mut delivery: Delivery = Box::pin(async move { inbox.deliver(batch).await });
        let mut cx = Context::from_waker(&self.delivery_waker);
        match delivery.as_mut().poll(&mut cx) {
            Poll::Pending => self.delivering = Some(delivery),
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(InboxClosed)) => self.inbox = None,
        }
    }

    // ---- stopping ---------------------------------------------------------------------

    fn begin_stop(&mut self, flush: bool, deadline: Instant) {
        if let Some(stopping) = &mut self.stopping {
            if !flush {
                stopping.flush = false;
            }
            return;
        }
        self.stopping = Some(Stopping {
            flush,
            deadline,
            forced_until: None,
        });
        // Nothing is read or delivered any more; the inbox ends once every thread let go.
        self.inbox = None;
        self.batch.clear();
        self.delivering = None;
        self.parked.clear();
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            let Some(conn) = self.conns.get_mut(&id) else {
                continue;
            };
            let mut cancels = Vec::new();
            if conn.multishot && !conn.cancel_sent {
                conn.cancel_sent = true;
                cancels.push(user_data(K_RECV_MULTI, id, 0));
            }
            if conn.direct {
                cancels.push(user_data(K_RECV_DIRECT, id, 0));
            }
            for target in cancels {
                self.cancel(target, id);
            }
            if flush {
                self.pump_send(id);
            } else {
                self.close(id, Closed::Stopped, false);
            }
        }
    }

    /// Advances a stop; true when the thread may exit.
    fn progress_stop(&mut self) -> bool {
        let Some((flush, deadline, forced)) = self
            .stopping
            .as_ref()
            .map(|s| (s.flush, s.deadline, s.forced_until.is_some()))
        else {
            return false;
        };
        let now = Instant::now();
        let force = !forced && (!flush || now >= deadline);
        if force {
            if flush && self.conns.values().any(|c| !c.closing && !c.flushed()) {
                warn!("uring van stop: queued frames not written in time; dropping them");
            }
            if let Some(stopping) = &mut self.stopping {
                stopping.forced_until = Some(now + DRAIN_TIMEOUT);
            }
            let ids: Vec<u64> = self.conns.keys().copied().collect();
            for id in ids {
                self.close(id, Closed::Stopped, false);
            }
        } else {
            // Connections whose queue is written out, and acknowledged by the peer, end with a
            // FIN: closing with unread input resets the connection and drops what the kernel
            // has not sent yet.
            let flushed: Vec<u64> = self
                .conns
                .values()
                .filter(|c| !c.closing && c.flushed() && c.acknowledged())
                .map(|c| c.id)
                .collect();
            for id in flushed {
                // Writing is over: the peer sees a FIN after the data.
                self.close(id, Closed::Stopped, true);
            }
        }
        let done = self.conns.is_empty();
        let expired = self
            .stopping
            .as_ref()
            .and_then(|s| s.forced_until)
            .is_some_and(|until| now >= until);
        if !done && expired {
            warn!(
                connections = self.conns.len(),
                "io_uring operations did not end within {DRAIN_TIMEOUT:?} of stop; leaking \
                 their buffers rather than freeing memory the kernel may still use"
            );
            for (_, conn) in self.conns.drain() {
                std::mem::forget(conn);
            }
            return true;
        }
        done
    }

    /// The loop is over: connections posted to it and never adopted are closed and
    /// forgotten, and later posts are refused (see [`CommandQueue::close`]).
    fn refuse_commands(&self) {
        for command in self.command_queue.close() {
            if let Command::Adopt(new) = command {
                debug!(remote = %new.remote, "closing a connection posted to an ended loop");
                self.shared
                    .links
                    .closed(new.id, "the io_uring loop has ended");
            }
        }
    }

    fn teardown(mut self) {
        self.refuse_commands();
        if self.eventfd_armed {
            self.cancel(user_data(K_EVENTFD, 0, 0), 0);
        }
        let until = Instant::now() + DRAIN_TIMEOUT;
        while self.eventfd_armed && Instant::now() < until {
            self.flush_overflow();
            let ts = types::Timespec::new().nsec(50_000_000);
            let args = types::SubmitArgs::new().timespec(&ts);
            let _ = self.ring.submitter().submit_with_args(1, &args);
            let cqes: Vec<u64> = self.ring.completion().map(|c| c.user_data()).collect();
            if cqes.iter().any(|d| d & 0xff == K_EVENTFD) {
                self.eventfd_armed = false;
            }
        }
        if self.eventfd_armed {
            std::mem::forget(std::mem::replace(&mut self.eventfd_buf, Box::new(0)));
        }
        // A leaked connection may still have a receive in flight: its buffers must stay.
        let leaked = !self.conns.is_empty();
        self.shared.stats.ring_lent[self.index].store(0, Ordering::Relaxed);
        let index = self.index;
        let Worker { ring, mut bufs, .. } = self;
        if leaked {
            bufs.leak();
        } else {
            bufs.unregister(&ring);
            drop(bufs);
        }
        drop(ring);
        debug!(index, "io_uring thread exits");
    }
}

/// Pins the calling thread to `cpu`; logs and carries on when that fails.
fn pin_to_cpu(cpu: usize) {
    let mut set = CpuSet::new();
    set.set(cpu);
    if let Err(errno) = rustix::thread::sched_setaffinity(None, &set) {
        warn!(
            cpu,
            "cannot pin the io_uring thread: {}",
            std::io::Error::from(errno)
        );
    }
}

/// The CPUs this process may run on, in order.
pub(crate) fn allowed_cpus() -> Vec<usize> {
    let Ok(set) = rustix::thread::sched_getaffinity(None) else {
        return Vec::new();
    };
    (0..CpuSet::MAX_CPU)
        .filter(|cpu| set.is_set(*cpu))
        .collect()
}

/// The ring's descriptor, as the runtime's reactor watches it.
struct RingFd(std::os::fd::RawFd);

impl AsRawFd for RingFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0
    }
}

/// A loop dropped before it finished (its runtime shut down): what the kernel may still
/// write into (the ring, the provided buffers, the connections' buffers) is leaked rather
/// than freed.
struct Unfinished(Option<Worker>);

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(worker) = self.0.take() {
            debug!(
                index = worker.index,
                "io_uring loop dropped unfinished; leaking its ring"
            );
            worker.refuse_commands();
            std::mem::forget(worker);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_pinned_to_an_allowed_cpu_runs_only_there() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|pair| pair[0] < pair[1]), "{cpus:?}");
        let last = cpus[cpus.len() - 1];
        let pinned = std::thread::spawn(move || {
            pin_to_cpu(last);
            allowed_cpus()
        })
        .join()
        .unwrap();
        assert_eq!(pinned, vec![last]);
    }
}
