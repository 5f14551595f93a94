//! The chaos harness: a TCP fault proxy ([`proxy`]), a schedule of faults drawn from a seed
//! ([`Schedule`]), and garbage written to listening ports ([`garbage`]). `vans-soak` puts
//! them between the nodes of a real cluster; the tests use them directly.

pub mod proxy;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

pub use proxy::{FaultProxy, Mode};

/// A small deterministic generator (xorshift64*), so a seed replays the same schedule.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value; 0 is remapped).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A duration between `lo` and `hi`.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = hi.saturating_sub(lo).as_millis() as u64;
        lo + Duration::from_millis(self.below(span + 1))
    }
}

/// One fault the schedule injects into one proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Every chunk held this long, for a while.
    Delay(Duration),
    /// At most this many bytes per second, for a while.
    Throttle(u64),
    /// Nothing forwarded, for a while.
    Blackhole,
    /// Nothing forwarded for a while, then every connection reset: what was held is lost,
    /// as when a partition outlasts the connections.
    Partition,
    /// Every connection closed.
    Cut,
    /// Every connection reset.
    Reset,
}

impl Fault {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Delay(_) => "delay",
            Fault::Throttle(_) => "throttle",
            Fault::Blackhole => "blackhole",
            Fault::Partition => "partition",
            Fault::Cut => "cut",
            Fault::Reset => "reset",
        }
    }

    /// The proxy's mode while the fault lasts (`None` for the instant ones).
    pub fn mode(self) -> Option<Mode> {
        match self {
            Fault::Delay(d) => Some(Mode::Delay(d)),
            Fault::Throttle(rate) => Some(Mode::Throttle(rate)),
            Fault::Blackhole | Fault::Partition => Some(Mode::Blackhole),
            Fault::Cut | Fault::Reset => None,
        }
    }
}

/// The next faults, drawn from a seed: which proxy, what, for how long, and the pause before
/// the next. Lasting faults stay below `max_outage` (keep it under the heartbeat timeout: a
/// longer silence is a dead node, not a fault to survive).
#[derive(Debug, Clone)]
pub struct Schedule {
    rng: Rng,
    proxies: usize,
    max_outage: Duration,
}

/// One step of a [`Schedule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Index of the proxy to act on.
    pub proxy: usize,
    /// What to do.
    pub fault: Fault,
    /// How long a lasting fault lasts.
    pub lasts: Duration,
    /// The pause after it (the fault lifted) before the next step.
    pub pause: Duration,
}

impl Schedule {
    /// A schedule over `proxies` proxies.
    pub fn new(seed: u64, proxies: usize, max_outage: Duration) -> Schedule {
        Schedule {
            rng: Rng::new(seed),
            proxies,
            max_outage,
        }
    }

    /// The next step.
    pub fn next_step(&mut self) -> Step {
        let rng = &mut self.rng;
        let proxy = rng.below(self.proxies as u64) as usize;
        let fault = match rng.below(6) {
            0 => Fault::Delay(rng.between(Duration::from_millis(5), Duration::from_millis(80))),
            1 => Fault::Throttle(256 << 10),
            2 => Fault::Blackhole,
            3 => Fault::Partition,
            4 => Fault::Cut,
            _ => Fault::Reset,
        };
        let lasts = rng.between(Duration::from_millis(100), self.max_outage);
        let pause = rng.between(Duration::from_millis(100), Duration::from_millis(600));
        Step {
            proxy,
            fault,
            lasts,
            pause,
        }
    }
}

/// Connects to `addr` and writes `len` random bytes, then waits up to a second for the
/// other end to close. Returns whether it closed (a node must drop a connection that speaks
/// garbage rather than keep it or crash).
pub async fn garbage(addr: SocketAddr, len: usize, rng: &mut Rng) -> std::io::Result<bool> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
    // The node may close while we write: that is the answer we want.
    let _ = stream.write_all(&bytes).await;
    let mut sink = [0u8; 256];
    let closed = tokio::time::timeout(Duration::from_secs(1), async {
        use tokio::io::AsyncReadExt;
        loop {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    })
    .await;
    Ok(closed.unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_the_same_schedule_within_its_bounds() {
        let max = Duration::from_millis(1500);
        let mut a = Schedule::new(7, 3, max);
        let mut b = Schedule::new(7, 3, max);
        let steps: Vec<Step> = (0..200).map(|_| a.next_step()).collect();
        assert_eq!(steps, (0..200).map(|_| b.next_step()).collect::<Vec<_>>());
        assert!(steps.iter().all(|s| s.proxy < 3 && s.lasts <= max));
        // Every kind of fault comes up.
        for name in [
            "delay",
            "throttle",
            "blackhole",
            "partition",
            "cut",
            "reset",
        ] {
            assert!(
                steps.iter().any(|s| s.fault.name() == name),
                "{name} never drawn"
            );
        }
        let mut c = Schedule::new(8, 3, max);
        assert_ne!(
            steps[..10],
            (0..10).map(|_| c.next_step()).collect::<Vec<_>>()
        );
    }
}
