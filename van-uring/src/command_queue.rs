//! How async callers reach an I/O thread: its [`CommandQueue`] of commands and ready
//! connections, and an eventfd the thread's ring reads, written only when the thread is about
//! to sleep.
//!
//! This is the whole bridge between the `Van` API and a ring: a sender puts a frame in the
//! peer's bounded queue (a tokio channel); the queue's waker (registered by the I/O thread
//! when it found the queue empty) marks the connection ready and writes the eventfd only if
//! the thread is waiting. A busy thread is never woken by a system call, and one wake-up
//! covers every frame queued meanwhile.

use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Wake;
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
    /// Accept connections on this listener (thread 0 only).
    Listen(std::net::TcpListener),
    /// Serve this connection.
    Adopt(NewConnection),
    /// Stop: stop reading and accepting, write what is queued until `deadline` (nothing when
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
    commands: Mutex<Vec<Command>>,
    /// Connections whose send queue has frames (their queue's waker fired).
    ready: Mutex<Vec<u64>>,
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
        // SAFETY: eventfd takes no pointers; a non-negative result is a descriptor we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(CommandQueue {
            // SAFETY: `fd` was just created and is owned by nothing else.
            eventfd: unsafe { OwnedFd::from_raw_fd(fd) },
            armed: AtomicBool::new(false),
            work: AtomicBool::new(false),
            commands: Mutex::new(Vec::new()),
            ready: Mutex::new(Vec::new()),
        })
    }

    /// The eventfd the thread keeps a read armed on.
    pub(crate) fn eventfd(&self) -> i32 {
        self.eventfd.as_raw_fd()
    }

    /// Posts a command and wakes the thread.
    pub(crate) fn post(&self, command: Command) {
        lock(&self.commands).push(command);
        self.wake();
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
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd. It cannot block (the fd
            // is non-blocking) and can only fail when the counter is about to overflow, in
            // which case the thread is awake anyway.
            let _ = unsafe {
                libc::write(
                    self.eventfd.as_raw_fd(),
                    (&one as *const u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
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
        std::mem::swap(&mut *lock(&self.commands), into);
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
