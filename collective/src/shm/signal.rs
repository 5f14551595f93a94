//! How the ranks of a shared-memory group tell each other they moved on: one progress counter
//! per rank, an abort word, and a wait that spins for a bounded time and then sleeps on a
//! futex in the segment.
//!
//! # The protocol (no lost wake-ups, many waiters)
//!
//! A rank *publishes* by storing its counter (`Release`), then `fence(SeqCst)`, then reading
//! `sleepers`: when somebody sleeps, it bumps `epoch` and wakes every waiter on it. A
//! *waiter* that has spun long enough adds itself to `sleepers`, `fence(SeqCst)`, reads
//! `epoch`, checks its condition, and only then `FUTEX_WAIT(epoch, read)`. The two fences
//! order each side's store before its load, so either the waiter's check sees the counter or
//! the publisher sees the sleeper and bumps `epoch` (and then the kernel, which compares the
//! word with what the waiter read atomically with queueing it, does not let it sleep). The
//! futex is shared (no `FUTEX_PRIVATE_FLAG`): the word lives in a `MAP_SHARED` mapping of a
//! memfd, so the kernel keys the wait on the file and the ranks meet on it. Every sleep is
//! bounded, so a rank that died, or scribbled on the words, cannot hang a waiter: after each
//! it asks `alive`, which checks the generation and the peers' processes.
//!
//! The counters are `u64` and only grow, so they never wrap.

use std::hint::spin_loop;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::io::Errno;

use crate::error::CollectiveError;
use crate::spin::{Idle, Spin};
use rustix::thread::futex;

/// `u64` words in a rank's line of the segment's header (64 bytes), its progress counter
/// first.
pub(super) const WORDS_PER_LINE: usize = 8;

/// Longest single sleep before the waiter checks the generation and the peers again.
const NAP: Duration = Duration::from_millis(10);

/// The words of a group's header, in shared memory (see the module docs).
pub(super) struct Signals<'a> {
    /// The ranks' lines, rank `q`'s from word `q * WORDS_PER_LINE`, its progress (the
    /// number of phases it has finished) first.
    pub(super) lines: &'a [AtomicU64],
    /// Non-zero once a rank gave up on the generation: every waiter stops. The failed rank
    /// plus one when the one that gave up knew it, else `u32::MAX`.
    pub(super) abort: &'a AtomicU32,
    /// How many ranks sleep on `epoch`.
    pub(super) sleepers: &'a AtomicU32,
    /// The futex word sleepers wait on; bumped by a publisher that sees a sleeper.
    pub(super) epoch: &'a AtomicU32,
}

impl Signals<'_> {
    /// Rank `q`'s progress counter.
    fn step(&self, q: usize) -> &AtomicU64 {
        &self.lines[q * WORDS_PER_LINE]
    }

    /// How many ranks.
    fn ranks(&self) -> usize {
        self.lines.len() / WORDS_PER_LINE
    }
}

/// Why a wait ended without its condition.
#[derive(Debug)]
pub(super) enum Stopped {
    /// A rank set the abort word, naming the rank that failed if it knew.
    Aborted(Option<usize>),
    /// `alive` failed.
    Failed(CollectiveError),
    /// The deadline passed while waiting for rank `.0`.
    TimedOut(usize),
    /// Rank `.0` runs another collective (or another length or element type) here: what it
    /// published of its call ([`super::group::call_word`]; 0 when it published none).
    Mismatch(usize, u64),
    /// Rank `.0` published a chunk that does not lie in its arena.
    Corrupt(usize),
}

impl Signals<'_> {
    /// Publishes that rank `rank` finished phase `step`, waking sleepers if there are any.
    pub(super) fn publish(&self, rank: usize, step: u64) {
        self.step(rank).store(step, Ordering::Release);
        self.wake();
    }

    /// Tells every rank to stop waiting (this one left the generation, because rank
    /// `failed` did, when known). The first word set stays: a rank that ends the generation
    /// afterwards (not knowing why) does not erase the failed rank's name.
    pub(super) fn abort(&self, failed: Option<usize>) {
        let word = failed.map_or(u32::MAX, |q| u32::try_from(q + 1).unwrap_or(u32::MAX));
        let _ = self
            .abort
            .compare_exchange(0, word, Ordering::AcqRel, Ordering::Acquire);
        self.wake();
    }

    fn wake(&self) {
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::Relaxed) != 0 {
            self.epoch.fetch_add(1, Ordering::Release);
            // Failure is ignored: the waiters' naps bound the wait.
            let _ = futex::wake(self.epoch, futex::Flags::empty(), u32::MAX);
        }
    }

    /// `Some` once a rank aborted: the failed rank, when it knew.
    pub(super) fn aborted(&self) -> Option<Option<usize>> {
        match self.abort.load(Ordering::Acquire) {
            0 => None,
            u32::MAX => Some(None),
            word => Some(Some(word as usize - 1)),
        }
    }

    /// Waits until every rank but `me` has finished phase `step`: spinning or yielding as
    /// `spin` says, then sleeping in naps, asking `alive` after each, each wait for a rank
    /// for up to `timeout`.
    pub(super) fn wait_all(
        &self,
        me: usize,
        step: u64,
        spin: Spin,
        timeout: Duration,
        alive: &dyn Fn() -> Result<(), CollectiveError>,
    ) -> Result<(), Stopped> {
        for q in (0..self.ranks()).filter(|&q| q != me) {
            self.wait_one(q, step, spin, timeout, alive)?;
        }
        Ok(())
    }

    /// Waits until rank `q` has finished phase `step` (see [`wait_all`](Self::wait_all)).
    pub(super) fn wait_one(
        &self,
        q: usize,
        step: u64,
        spin: Spin,
        timeout: Duration,
        alive: &dyn Fn() -> Result<(), CollectiveError>,
    ) -> Result<(), Stopped> {
        let done = || self.step(q).load(Ordering::Acquire) >= step;
        // Most waits end here, or in the spin below: the clock is read once there.
        if done() {
            return Ok(());
        }
        let mut idle = Idle::new(spin);
        loop {
            // Reading the clock costs more than a look: look 64 times between turns.
            for _ in 0..64 {
                if done() {
                    return Ok(());
                }
                spin_loop();
            }
            if let Some(failed) = self.aborted() {
                return Err(Stopped::Aborted(failed));
            }
            if !idle.turn() {
                break;
            }
        }
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let result = self.sleep_until(q, &done, idle.started() + timeout, alive);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        result
    }

    fn sleep_until(
        &self,
        q: usize,
        done: &dyn Fn() -> bool,
        deadline: Instant,
        alive: &dyn Fn() -> Result<(), CollectiveError>,
    ) -> Result<(), Stopped> {
        for nap in 0u64.. {
            fence(Ordering::SeqCst);
            let epoch = self.epoch.load(Ordering::Acquire);
            if done() {
                return Ok(());
            }
            if let Some(failed) = self.aborted() {
                return Err(Stopped::Aborted(failed));
            }
            // Not before the first sleep: most waits end in it, and the check costs system
            // calls.
            if nap > 0 {
                alive().map_err(Stopped::Failed)?;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Stopped::TimedOut(q));
            }
            let sleep = (deadline - now).min(NAP);
            let timeout = futex::Timespec {
                tv_sec: sleep.as_secs() as i64,
                tv_nsec: i64::from(sleep.subsec_nanos()),
            };
            // A wake, a changed word, a signal and the timeout all return: check again. A
            // futex the kernel refuses (seccomp) degrades to polling every millisecond.
            match futex::wait(self.epoch, futex::Flags::empty(), epoch, Some(&timeout)) {
                Ok(()) => {}
                Err(e) if e == Errno::AGAIN || e == Errno::INTR || e == Errno::TIMEDOUT => {}
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        Err(Stopped::TimedOut(q))
    }
}
