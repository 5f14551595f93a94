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

use std::hint::spin_loop;
use std::io;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};

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
        word.store(1, Ordering::Relaxed);
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
        if futex_wait(word, 1, remaining).is_err() {
            std::thread::sleep(remaining.map_or(FALLBACK_SLEEP, |r| r.min(FALLBACK_SLEEP)));
        }
    }
}

/// The waker's half of the protocol: call right after publishing. Costs a fence and a load
/// when nobody sleeps on `word`, a system call when somebody does.
pub(crate) fn wake_if_waiting(word: &AtomicU32) {
    fence(Ordering::SeqCst);
    if word.load(Ordering::Relaxed) != 0 && word.swap(0, Ordering::Relaxed) != 0 {
        futex_wake(word);
    }
}

/// Wakes whoever sleeps on `word`, unconditionally (for `close`, where the cost is paid once).
pub(crate) fn wake_always(word: &AtomicU32) {
    fence(Ordering::SeqCst);
    word.store(0, Ordering::Relaxed);
    futex_wake(word);
}

/// `FUTEX_WAIT` (shared) while `*word == expected`, for at most `timeout`. A wake, a changed
/// value, a signal and the timeout all return `Ok`: the caller re-checks its condition.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> io::Result<()> {
    let timespec = timeout.map(|t| {
        // SAFETY: `timespec` is plain old data (integers, and padding on some targets) for
        // which all-zero bytes are a valid value.
        let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
        ts.tv_sec = libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX);
        // Below 10^9, so it fits a c_long of any width.
        ts.tv_nsec = t.subsec_nanos() as libc::c_long;
        ts
    });
    let timespec_ptr = timespec
        .as_ref()
        .map_or(std::ptr::null(), |ts| ts as *const libc::timespec);
    // SAFETY: `word` is a live, aligned u32 (for a ring, inside a mapping that outlives the
    // call); the kernel only reads it. `timespec_ptr` is null or points to a timespec that
    // lives until the call returns. The last two arguments are unused by FUTEX_WAIT.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            timespec_ptr,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EAGAIN | libc::EINTR | libc::ETIMEDOUT) => Ok(()),
        _ => Err(err),
    }
}

/// `FUTEX_WAKE` (shared) of one waiter on `word`; there is at most one (single consumer or
/// single producer per word). Failure is ignored: the waiter's timeout covers it.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE only uses its address as a key and
    // ignores the remaining arguments.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            1u32,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
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
