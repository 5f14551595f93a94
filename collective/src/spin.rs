//! What a rank waiting for its peers does before it sleeps: spin, or, when the ranks on
//! this host outnumber the cores this process may use, give its core away.

use std::time::{Duration, Instant};

/// What a waiter does before it sleeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spin {
    /// Spins for this long: the awaited rank runs on another core.
    Busy(Duration),
    /// Gives its core away (`sched_yield`) for this long between looks: the ranks outnumber
    /// the cores, so the awaited rank may need this one; a sleep and wake-up would cost more
    /// than the wait.
    Yield(Duration),
}

impl Spin {
    /// The time budget.
    fn budget(self) -> Duration {
        match self {
            Spin::Busy(d) | Spin::Yield(d) => d,
        }
    }
}

/// How often a spinning waiter offers its core to other runnable threads (this process's I/O
/// threads, other processes): the awaited rank may be waiting behind them for the other core.
/// Without it, two ranks spinning on two cores stalled for milliseconds whenever a third
/// thread needed one.
///
/// The awaited rank may also wait on this very core: a rank woken from a sleep (a barrier
/// over the vans, say) is often placed on its waker's core, and two ranks then take turns on
/// one core, each spinning until it offers the core, until the kernel moves one. Offered
/// every 20 µs, each wait cost 20 µs there: `allreduce-bench --van ipc --ranks 2` had runs
/// whose every 4 KiB all-reduce took 46 µs instead of 0.9 (and 128 KiB 52 instead of 8).
/// Every 5 µs it is 15–20 µs, and no slower when the ranks have a core each. (Offering
/// the core at every turn once an offer was taken measured the same as this in 16
/// alternating runs, the stalled state included.)
const OFFER: Duration = Duration::from_micros(5);

/// The spinning phase of one wait: since when it has waited without progress, and when it
/// last offered its core. Shared by the shared-memory waits and the mesh's.
pub(crate) struct Idle {
    spin: Spin,
    since: Instant,
    offered: Instant,
}

impl Idle {
    pub(crate) fn new(spin: Spin) -> Idle {
        let now = Instant::now();
        Idle {
            spin,
            since: now,
            offered: now,
        }
    }

    /// Whether the budget is spent: the wait sleeps between looks now.
    pub(crate) fn spent(&self) -> bool {
        self.since.elapsed() >= self.spin.budget()
    }

    /// When the wait began (or, after [`reset`](Self::reset), last moved). (Read by the
    /// shared-memory waits only, feature `ipc`.)
    #[cfg_attr(not(feature = "ipc"), allow(dead_code))]
    pub(crate) fn started(&self) -> Instant {
        self.since
    }

    /// Something moved: the budget starts again.
    pub(crate) fn reset(&mut self) {
        self.since = Instant::now();
    }

    /// One turn before the next look: a spin hint (now and then a yield of the core), or a
    /// yield. `false` once the budget is spent: time to sleep.
    pub(crate) fn turn(&mut self) -> bool {
        let now = Instant::now();
        if now.duration_since(self.since) >= self.spin.budget() {
            return false;
        }
        match self.spin {
            Spin::Busy(_) if now.duration_since(self.offered) >= OFFER => {
                std::thread::yield_now();
                self.offered = now;
            }
            Spin::Busy(_) => std::hint::spin_loop(),
            Spin::Yield(_) => std::thread::yield_now(),
        }
        true
    }
}

/// The policy for `configured` (`VANS_COLLECTIVE_SPIN_US`) and `local_ranks` ranks on this
/// host: spin, unless they outnumber the cores this process may run on; then yield.
pub(crate) fn policy(configured: Duration, local_ranks: usize) -> Spin {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if local_ranks > cores {
        Spin::Yield(configured)
    } else {
        Spin::Busy(configured)
    }
}

/// Whether this thread may block in a collective: on a multi-thread runtime the thread's
/// other tasks (the vans' writers among them) move elsewhere meanwhile. On a current-thread
/// runtime they would stop, so a message the last collective queued to a stream van would
/// wait for the end of the next one, which may wait for it.
pub(crate) fn can_block() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Runs `f`, which blocks (spins, polls, sleeps), on this thread: on a multi-thread runtime
/// the thread's other tasks move elsewhere meanwhile.
pub(crate) fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
