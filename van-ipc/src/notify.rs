//! Wake-ups between processes: a futex word in shared memory and a spin-then-sleep wait.
//!
//! Spinning alone answers in a fraction of a microsecond but collapses when cores are
//! oversubscribed; sleeping alone costs a futex wake (4–50 µs) on every message. So a waiter
//! spins a bounded number of iterations, then sleeps on a futex word with a timeout, and the
//! other side pays for a wake only when the waiter has announced that it sleeps.
//!
//! # The protocol (no lost wake-ups)
//!
//! Waiter: store `word = 1`; `fence(SeqCst)`; re-check the condition; if still false,
//! `FUTEX_WAIT(word, 1, timeout)`; on return re-check and repeat.
//! Waker: publish (a `Release` store of a ring cursor or of `closed`); `fence(SeqCst)`; if
//! `word != 0`, swap it to 0 and `FUTEX_WAKE`.
//!
//! The two `SeqCst` fences order each side's store before its load, so at least one side
//! sees the other's store: either the waiter's re-check sees the publication and it does not
//! sleep, or the waker sees `word == 1` and wakes it. If the wake comes before the waiter
//! reaches `FUTEX_WAIT`, the word is already 0 and the kernel returns at once (the kernel
//! compares the word with 1 atomically with queueing the waiter). The futexes are *shared*
//! (no `FUTEX_PRIVATE_FLAG`): the word lives in a `MAP_SHARED` mapping and the kernel keys
//! the wait on the file and offset, so the two processes meet on it. The timeout bounds
//! every wait, so a peer that vanished, or that scribbled on the word, cannot hang us.
//!
//! # Doorbells
//!
//! A waiter that runs on an async runtime cannot sleep on a futex without stalling the
//! runtime thread. It sleeps on a [`Doorbell`] instead (an eventfd the runtime's reactor
//! watches, handed to the other side at the handshake) and announces it with
//! `word = DOORBELL` instead of 1; the waker sees which and rings the doorbell instead of the
//! futex. The protocol is otherwise the same.

use std::hint::spin_loop;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rustix::event::{eventfd, EventfdFlags};
use rustix::thread::futex;

/// Value of a wait word whose waiter sleeps on the futex.
const FUTEX: u32 = 1;
/// Value of a wait word whose waiter sleeps on its doorbell.
pub(crate) const DOORBELL: u32 = 2;

/// An eventfd one process rings and another awaits on its async runtime; see the
/// module docs.
#[derive(Debug)]
pub struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    /// A fresh doorbell (non-blocking, close-on-exec).
    ///
    /// # Errors
    ///
    /// When the kernel refuses an eventfd (descriptor limit).
    pub fn new() -> io::Result<Doorbell> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Doorbell { fd })
    }

    /// The doorbell a peer handed over. It must be an eventfd: anything else (a file, a
    /// socket) is refused, so a confused peer cannot make us write into it.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::InvalidData`] when `fd` is not an eventfd.
    pub fn from_peer(fd: OwnedFd) -> io::Result<Doorbell> {
        let link = rustix::fs::readlinkat(
            rustix::fs::CWD,
            format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd)),
            Vec::new(),
        )?;
        if link.as_bytes() != b"anon_inode:[eventfd]" {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the peer's doorbell is not an eventfd ({link:?})"),
            ));
        }
        Ok(Doorbell { fd })
    }

    /// Rings: the waiter's runtime sees the descriptor readable. A full counter (the waiter
    /// has not read 2^64 - 2 rings) is as good as a ring, so errors are ignored.
    pub fn ring(&self) {
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// Consumes the rings so far (the waiter's side), so the next wait sleeps until a new one.
    pub fn clear(&self) {
        let mut count = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut count);
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl std::os::fd::AsRawFd for Doorbell {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.fd)
    }
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitResult {
    /// The condition holds (or the ring needs attention: the next push or pop will either
    /// succeed or report what is wrong).
    Ready,
    /// The timeout passed first; check the peer's liveness and wait again or give up.
    TimedOut,
    /// The ring was closed by either side.
    Closed,
}

/// Longest sleep when the futex call itself fails (seccomp filters, exotic kernels), so such
/// a system degrades to polling rather than spinning.
const FALLBACK_SLEEP: Duration = Duration::from_millis(1);

/// Spins up to `spins` times calling `check`, then sleeps on `word` until `check` returns a
/// result or `timeout` passes. `check` must read what the waker publishes (with `Acquire`).
pub(crate) fn wait_adaptive(
    word: &AtomicU32,
    spins: u32,
    timeout: Duration,
    mut check: impl FnMut() -> Option<WaitResult>,
) -> WaitResult {
    for _ in 0..spins {
        if let Some(result) = check() {
            return result;
        }
        spin_loop();
    }
    // `None` when the deadline is beyond what `Instant` represents: wait without a bound.
    let deadline = Instant::now().checked_add(timeout);
    loop {
        word.store(FUTEX, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if let Some(result) = check() {
            word.store(0, Ordering::Relaxed);
            return result;
        }
        let remaining = match deadline {
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    word.store(0, Ordering::Relaxed);
                    return WaitResult::TimedOut;
                }
                Some(deadline - now)
            }
            None => None,
        };
        if futex_wait(word, FUTEX, remaining).is_err() {
            std::thread::sleep(remaining.map_or(FALLBACK_SLEEP, |r| r.min(FALLBACK_SLEEP)));
        }
    }
}

/// The waker's half of the protocol: call right after publishing. Costs a fence and a load
/// when nobody sleeps on `word`, a system call when somebody does: a futex wake, or a ring
/// of `bell` when the waiter sleeps on its doorbell.
pub(crate) fn wake_if_waiting(word: &AtomicU32) {
    wake_or_ring(word, None);
}

/// [`wake_if_waiting`] for a word whose waiter may sleep on `bell`.
pub(crate) fn wake_or_ring(word: &AtomicU32, bell: Option<&Doorbell>) {
    fence(Ordering::SeqCst);
    if word.load(Ordering::Relaxed) != 0 {
        match (word.swap(0, Ordering::Relaxed), bell) {
            (0, _) => {}
            (DOORBELL, Some(bell)) => bell.ring(),
            _ => futex_wake(word),
        }
    }
}

/// Wakes whoever sleeps on `word`, unconditionally (for `close`, where the cost is paid once).
pub(crate) fn wake_always(word: &AtomicU32) {
    always_wake_or_ring(word, None);
}

/// [`wake_always`] for a word whose waiter may sleep on `bell`.
pub(crate) fn always_wake_or_ring(word: &AtomicU32, bell: Option<&Doorbell>) {
    fence(Ordering::SeqCst);
    word.store(0, Ordering::Relaxed);
    futex_wake(word);
    if let Some(bell) = bell {
        bell.ring();
    }
}

/// `FUTEX_WAIT` (shared) while `*word == expected`, for at most `timeout`. A wake, a changed
/// value, a signal and the timeout all return `Ok`: the caller re-checks its condition.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> io::Result<()> {
    let timeout = timeout.map(|t| futex::Timespec {
        tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(t.subsec_nanos()),
    });
    // Shared (no PRIVATE flag): the word lives in a mapping two processes share.
    match futex::wait(word, futex::Flags::empty(), expected, timeout.as_ref()) {
        Ok(()) => Ok(()),
        Err(e)
            if e == rustix::io::Errno::AGAIN
                || e == rustix::io::Errno::INTR
                || e == rustix::io::Errno::TIMEDOUT =>
        {
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// `FUTEX_WAKE` (shared) of one waiter on `word`; there is at most one (single consumer or
/// single producer per word). Failure is ignored: the waiter's timeout covers it.
fn futex_wake(word: &AtomicU32) {
    let _ = futex::wake(word, futex::Flags::empty(), 1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn wait_times_out_when_nothing_happens() {
        let word = AtomicU32::new(0);
        let start = Instant::now();
        let r = wait_adaptive(&word, 10, Duration::from_millis(30), || None);
        assert_eq!(r, WaitResult::TimedOut);
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert_eq!(
            word.load(Ordering::Relaxed),
            0,
            "the waiter clears its word"
        );
    }

    #[test]
    fn wait_returns_at_once_when_ready() {
        let word = AtomicU32::new(0);
        let r = wait_adaptive(&word, 0, Duration::ZERO, || Some(WaitResult::Closed));
        assert_eq!(r, WaitResult::Closed);
    }

    #[test]
    fn waker_wakes_a_sleeping_waiter() {
        let word = Arc::new(AtomicU32::new(0));
        let flag = Arc::new(AtomicBool::new(false));
        let (w, f) = (word.clone(), flag.clone());
        let waiter = std::thread::spawn(move || {
            wait_adaptive(&w, 0, Duration::from_secs(20), || {
                f.load(Ordering::Acquire).then_some(WaitResult::Ready)
            })
        });
        // Wait until the waiter has announced itself, then publish and wake.
        while word.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        flag.store(true, Ordering::Release);
        wake_if_waiting(&word);
        assert_eq!(waiter.join().unwrap(), WaitResult::Ready);
    }

    #[test]
    fn wake_without_waiter_is_harmless() {
        let word = AtomicU32::new(0);
        wake_if_waiting(&word);
        wake_always(&word);
        assert_eq!(word.load(Ordering::Relaxed), 0);
    }
}
