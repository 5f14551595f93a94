//! How async callers reach a ring's event loop: its [`CommandQueue`] of commands and ready
//! connections, and what wakes the loop, used only when the loop is about to sleep: the
//! loop's task waker when it runs on the application's runtime, else an eventfd its thread's
//! ring reads.
//!
//! This is the whole bridge between the `Van` API and a ring: a sender puts a frame in the
//! peer's bounded queue (a tokio channel); the queue's waker (registered by the I/O thread
//! when it found the queue empty) marks the connection ready and writes the eventfd only if
//! the thread is waiting. A busy thread is never woken by a system call, and one wake-up
//! covers every frame queued meanwhile.

use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Wake, Waker};
use std::time::Instant;

use tokio::sync::mpsc;
use van_core::link::Frame;
use van_core::NodeId;

/// A connection handed to an I/O thread.
pub(crate) struct NewConnection {
    pub(crate) id: u64,
    pub(crate) stream: TcpStream,
    pub(crate) remote: SocketAddr,
    /// The node dialed, or `None` for an accepted connection (learned from its first message).
    pub(crate) peer: Option<NodeId>,
    pub(crate) queue: mpsc::Receiver<Frame>,
}

/// What an async caller asks of an I/O thread.
pub(crate) enum Command {
    /// Deliver everything received from now on into this inbox.
    Inbox(van_core::InboxSender),
    /// Serve this connection.
    Adopt(NewConnection),
    /// End this connection now, abortively, dropping what is queued: its peer was declared
    /// dead.
    Abort(u64),
    /// Stop: stop reading, write what is queued until `deadline` (nothing when
    /// `flush` is false), close every connection, wait for the kernel to give every buffer
    /// back, and exit.
    Stop {
        /// Whether queued frames are written first.
        flush: bool,
        /// When to give up writing.
        deadline: Instant,
    },
}

/// One I/O thread's queue of commands and ready connections, with the eventfd that wakes it.
pub(crate) struct CommandQueue {
    eventfd: OwnedFd,
    /// The thread is waiting (or about to): a poster must write the eventfd.
    armed: AtomicBool,
    /// Something was posted since the thread last looked.
    work: AtomicBool,
    /// `None` once the loop has ended: nothing posted later would ever be read.
    commands: Mutex<Option<Vec<Command>>>,
    /// Connections whose send queue has frames (their queue's waker fired).
    ready: Mutex<Vec<u64>>,
    /// The loop's task, when it runs on a runtime and waits (see [`CommandQueue::arm_task`]).
    task: Mutex<Option<Waker>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each critical section is a push or a swap of a Vec: nothing can be left half-done.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl std::fmt::Debug for CommandQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommandQueue")
    }
}

impl CommandQueue {
    /// An empty queue with a fresh non-blocking eventfd.
    pub(crate) fn new() -> std::io::Result<CommandQueue> {
        let eventfd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        Ok(CommandQueue {
            eventfd,
            armed: AtomicBool::new(false),
            work: AtomicBool::new(false),
            commands: Mutex::new(Some(Vec::new())),
            ready: Mutex::new(Vec::new()),
            task: Mutex::new(None),
        })
    }

    /// The eventfd the thread keeps a read armed on.
    pub(crate) fn eventfd(&self) -> i32 {
        self.eventfd.as_raw_fd()
    }

    /// Posts a command and wakes the thread; gives it back when the loop has ended.
    pub(crate) fn post(&self, command: Command) -> Result<(), Command> {
        match lock(&self.commands).as_mut() {
            Some(commands) => commands.push(command),
            None => return Err(command),
        }
        self.wake();
        Ok(())
    }

    /// The loop has ended: later posts are refused; returns what was posted and never read.
    pub(crate) fn close(&self) -> Vec<Command> {
        lock(&self.commands).take().unwrap_or_default()
    }

    /// Marks connection `id` ready to send and wakes the thread.
    pub(crate) fn ready(&self, id: u64) {
        lock(&self.ready).push(id);
        self.wake();
    }

    /// Wakes the thread if it is waiting; otherwise it will see `work` before it waits.
    pub(crate) fn wake(&self) {
        self.work.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.armed.swap(false, Ordering::SeqCst) {
            if let Some(task) = lock(&self.task).take() {
                task.wake();
                return;
            }
            // Non-blocking; fails only when the counter is about to overflow, in which case
            // the thread is awake anyway.
            let _ = rustix::io::write(&self.eventfd, &1u64.to_ne_bytes());
        }
    }

    /// Called by the thread before it looks at its lists.
    pub(crate) fn begin(&self) {
        self.work.store(false, Ordering::SeqCst);
    }

    /// Called by the thread before blocking: returns false (and stays awake) when something
    /// was posted since [`begin`](Self::begin).
    pub(crate) fn arm(&self) -> bool {
        self.armed.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.work.load(Ordering::SeqCst) {
            self.armed.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// [`arm`](Self::arm) for a loop running as a task: a poster wakes `task` instead of
    /// writing the eventfd.
    pub(crate) fn arm_task(&self, task: &Waker) -> bool {
        {
            let mut slot = lock(&self.task);
            if !slot.as_ref().is_some_and(|w| w.will_wake(task)) {
                *slot = Some(task.clone());
            }
        }
        self.arm()
    }

    /// Called by the thread after waiting.
    pub(crate) fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }

    /// Whether something was posted since [`begin`](Self::begin) (for spinning).
    pub(crate) fn has_work(&self) -> bool {
        self.work.load(Ordering::SeqCst)
    }

    /// Takes the posted commands.
    pub(crate) fn take_commands(&self, into: &mut Vec<Command>) {
        if let Some(commands) = lock(&self.commands).as_mut() {
            std::mem::swap(commands, into);
        }
    }

    /// Takes the ready connections.
    pub(crate) fn take_ready(&self, into: &mut Vec<u64>) {
        std::mem::swap(&mut *lock(&self.ready), into);
    }
}

/// The waker of one connection's send queue.
pub(crate) struct QueueWaker {
    pub(crate) command_queue: Arc<CommandQueue>,
    pub(crate) connection: u64,
}

impl Wake for QueueWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.command_queue.ready(self.connection);
    }
}

/// The waker of a pending inbox delivery.
pub(crate) struct DeliveryWaker {
    pub(crate) command_queue: Arc<CommandQueue>,
}

impl Wake for DeliveryWaker {
    fn wake(self: Arc<Self>) {
        self.command_queue.wake();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.command_queue.wake();
    }
}
