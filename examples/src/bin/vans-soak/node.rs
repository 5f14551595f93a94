//! One node of the soak cluster: the scheduler and servers serve; a worker runs rounds of
//! push, pull and push-pull and checks every answer exactly, then checks the shared sums.
//!
//! What a worker checks:
//! - It owns a key only it adds to: after `n` adds it must read exactly `n`.
//! - Each push round sends every server one request: `rank + 1` onto that server's shared
//!   keys and 1 onto the worker's *count key* on that server. A request to one server is
//!   applied whole or not at all, so on every server each shared key must equal
//!   Σ (rank + 1) × count over the workers, whatever was lost or cut; and the worker's count
//!   on each server must be exactly the rounds that server acknowledged.
//!
//! Killed processes (`--kill-every`) come back as new processes in their place (recovery):
//! a worker that `is_recovery` reads its counts back from the servers and goes on; a server
//! comes back empty, the workers learn it (`take_restarted_servers`) and push their totals
//! onto it again. A request the server died under may or may not have been applied: it is
//! *uncertain*, and the final check allows exactly that many extra rounds, no more; without
//! server kills every check is strict.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ps::{node_ids, Config, KvPairs, KvServer, KvWorker, NodeError, Postoffice, RequestId, Role};
use van_core::NodeId;

use crate::{BoxError, Options};

/// How long a worker waits for a failed server to come back (a killed server's new process
/// rejoins within seconds; one declared dead by the heartbeat timeout, 20 s, sooner): less
/// than the driver gives the nodes to finish, so a node that waits in vain says so.
const COMEBACK: Duration = Duration::from_secs(40);
/// How long a worker waits for an answer: a dead server fails its requests within the
/// heartbeat timeout, so a request unanswered this long is a fault of its own, named in the
/// worker's error instead of a silent hang.
const ANSWER: Duration = Duration::from_secs(30);

/// The keys of one worker: shared keys by server, its count key on each server, its own key.
struct Keys {
    shared: Vec<Vec<u64>>,
    counts: Vec<u64>,
    own: u64,
    /// Index of the server holding `own`.
    own_server: usize,
}

impl Keys {
    fn new(po: &Postoffice, rank: u32, o: &Options) -> Keys {
        let ranges = ps::range::server_key_ranges(po.num_servers() as usize);
        let step = u64::MAX / o.keys.max(1);
        let all: Vec<u64> = (0..o.keys.max(1)).map(|i| i * step + 7).collect();
        let shared = ranges
            .iter()
            .map(|r| all.iter().copied().filter(|k| r.contains(*k)).collect())
            .collect();
        let counts = ranges
            .iter()
            .map(|r| r.first + 100 + u64::from(rank))
            .collect();
        let own_server = rank as usize % ranges.len().max(1);
        let own = ranges
            .get(own_server)
            .map_or(0, |r| r.first + 100_000 + u64::from(rank));
        Keys {
            shared,
            counts,
            own,
            own_server,
        }
    }
}

pub(crate) async fn run(o: &Options) -> Result<(), BoxError> {
    let config = Config::from_env()?;
    let po = Postoffice::start(config).await?;
    println!("SOAK-READY {:?} {}", po.role(), po.my_id());
    // The scheduler waits out the run before its final barrier, unless the node stops
    // first (cut off and replaced, it must end, not go on).
    let wait_out = || async {
        let left = deadline(o)
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        tokio::select! {
            _ = tokio::time::sleep(left) => Ok(()),
            e = po.stopped() => Err(e),
        }
    };
    let result = match po.role() {
        Role::Scheduler => wait_out().await.map_err(Into::into),
        Role::Server => {
            let server = KvServer::<i64>::with_sum(&po, 0, 0, 1).await?;
            if po.is_recovery() {
                println!(
                    "SOAK-EVENT server {} came back as a new process",
                    po.my_rank()
                );
            }
            // Serves from inside finalize's barrier (as `vans.Server.serve()` does): kills
            // and replacements of workers and servers meanwhile must not end it.
            let done = po.finalize().await;
            report(&po, &format!("server {}", po.my_rank()));
            drop(server);
            return done.map_err(Into::into);
        }
        Role::Worker => Worker::start(&po, o).await?.run(o).await,
    };
    let done = po.finalize().await;
    if po.role() == Role::Scheduler {
        report(&po, "scheduler");
    }
    result?;
    done.map_err(Into::into)
}

fn report(po: &Postoffice, who: &str) {
    if let Some(s) = po.resend_stats() {
        println!(
            "SOAK-NODE {who}: resent {} duplicates-dropped {} stale-dropped {} unacked {}",
            s.resent, s.duplicates, s.stale, s.unacked
        );
    }
}

struct Worker<'a> {
    po: &'a Postoffice,
    kv: KvWorker<i64>,
    rank: u32,
    keys: Keys,
    /// Push rounds each server acknowledged.
    acked: Vec<i64>,
    /// Push rounds each server failed under (applied or not: unknown).
    uncertain: Vec<i64>,
    /// Adds onto the own key acknowledged, and those failed under.
    adds: i64,
    adds_uncertain: i64,
    /// Restarted servers not yet refilled (they failed again meanwhile).
    refill: Vec<NodeId>,
    checks: u64,
}

impl<'a> Worker<'a> {
    async fn start(po: &'a Postoffice, o: &Options) -> Result<Worker<'a>, BoxError> {
        let rank = po.my_rank();
        let servers = po.num_servers() as usize;
        let mut w = Worker {
            po,
            kv: KvWorker::<i64>::new(po, 0, 0).await?,
            rank,
            keys: Keys::new(po, rank, o),
            acked: vec![0; servers],
            uncertain: vec![0; servers],
            adds: 0,
            adds_uncertain: 0,
            refill: Vec::new(),
            checks: 0,
        };
        if po.is_recovery() {
            // The process before us died: what the servers hold is the truth.
            w.acked = w.pull(&w.keys.counts.clone()).await?;
            w.adds = w.pull(&[w.keys.own]).await?.first().copied().unwrap_or(0);
            println!(
                "SOAK-EVENT worker {rank} came back as a new process: counts {:?}, own {}",
                w.acked, w.adds
            );
        }
        Ok(w)
    }

    /// The answer to request `id` (`what` it is), within [`ANSWER`].
    async fn answer(&self, id: RequestId, what: &str) -> Result<KvPairs, NodeError> {
        let answer = self.kv.wait_timeout(id, ANSWER).await;
        if let Err(NodeError::Timeout { waited }) = &answer {
            eprintln!(
                "vans-soak: worker {}: {what} (request {id}) unanswered after {waited:?}",
                self.rank
            );
        }
        answer
    }

    /// The values of `keys` (any order; each key one value, 0 for a key never pushed). A
    /// server that fails (or is replaced) under the pull is waited for, and read again.
    async fn pull(&self, keys: &[u64]) -> Result<Vec<i64>, BoxError> {
        let mut sorted = keys.to_vec();
        sorted.sort_unstable();
        let pulled = loop {
            let answer = match self.pull_sorted(&sorted).await {
                Ok(id) => self.answer(id, "a pull").await,
                Err(e) => Err(e),
            };
            match answer {
                Ok(pulled) => break pulled,
                Err(e) => self.recover(e).await?,
            }
        };
        let vals = pulled.vals::<i64>()?;
        if vals.len() != sorted.len() {
            return Err(format!(
                "a pull of {} keys answered {} values",
                sorted.len(),
                vals.len()
            )
            .into());
        }
        let by_key: std::collections::HashMap<u64, i64> =
            sorted.iter().copied().zip(vals.iter().copied()).collect();
        Ok(keys
            .iter()
            .map(|k| by_key.get(k).copied().unwrap_or(0))
            .collect())
    }

    /// One round's request failed: a server died under it. Wait for it to come back (a
    /// new process in its place); the next round puts back what it lost.
    async fn recover(&self, error: NodeError) -> Result<(), BoxError> {
        let NodeError::NodeFailed { node, .. } = &error else {
            return Err(error.into());
        };
        if node_ids::role_of(*node) != Some(Role::Server) {
            return Err(error.into());
        }
        self.po.wait_alive(*node, COMEBACK).await?;
        Ok(())
    }

    /// Puts back onto every server that came back as a new process (empty) what this worker
    /// had put there and it does not hold: the server's own count of this worker's rounds
    /// is read first, since rounds sent after it came back did land on it. A server that
    /// fails again meanwhile is tried again next round.
    async fn refill_restarted(&mut self) -> Result<Vec<usize>, BoxError> {
        let mut done = Vec::new();
        let mut todo = std::mem::take(&mut self.refill);
        for server in self.kv.take_restarted_servers() {
            if !todo.contains(&server) {
                todo.push(server);
            }
        }
        while let Some(server) = todo.pop() {
            match self.refill(server).await {
                Ok(()) => done.push(node_ids::id_to_rank(server) as usize),
                Err(e) if matches!(e, NodeError::NodeFailed { .. }) => {
                    self.refill.push(server);
                    self.recover(e).await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(done)
    }

    async fn refill(&mut self, server: NodeId) -> Result<(), NodeError> {
        let s = node_ids::id_to_rank(server) as usize;
        let held = self.pull_one(self.keys.counts[s]).await?;
        let missing = (self.acked[s] - held).max(0);
        let mut pairs = self.rounds_onto(s, missing);
        let mut own_missing = 0;
        if s == self.keys.own_server {
            own_missing = (self.adds - self.pull_one(self.keys.own).await?).max(0);
            pairs.push((self.keys.own, own_missing));
        }
        let (keys, vals) = sorted(pairs);
        let id = self.kv.push(&keys, &vals, None, 0).await?;
        self.answer(id, "a refill").await?;
        println!(
            "SOAK-EVENT worker {}: put back {missing} rounds and {own_missing} own adds onto \
             restarted server {s}",
            self.rank
        );
        Ok(())
    }

    /// Starts a pull of sorted `keys`, one value each, into a buffer: the servers answer a
    /// key never pushed (or lost with a server) with a zero.
    async fn pull_sorted(&self, keys: &[u64]) -> Result<ps::RequestId, NodeError> {
        let out = vec![0u8; keys.len() * std::mem::size_of::<i64>()];
        self.kv.zpull_into(ps::values::to_bytes(keys), out, 0).await
    }

    /// The value of one key (0 if never pushed).
    async fn pull_one(&self, key: u64) -> Result<i64, NodeError> {
        let id = self.pull_sorted(&[key]).await?;
        let pulled = self.answer(id, "a pull of one key").await?;
        Ok(pulled.vals::<i64>()?.first().copied().unwrap_or(0))
    }

    /// Checks a read of the own key against the adds made: exact, except that adds a
    /// server died under may each have landed.
    fn check_own(&mut self, what: &str, got: i64, want: i64) -> Result<(), BoxError> {
        self.checks += 1;
        let slack = self.adds_uncertain;
        if got < want || got > want + slack {
            return Err(format!("{what}: read {got}, expected {want} (+{slack} uncertain)").into());
        }
        self.adds = got;
        self.adds_uncertain = 0;
        Ok(())
    }

    /// What `rounds` push rounds add on server `s`: `rank + 1` each onto its shared keys and 1
    /// each onto this worker's count key there.
    fn rounds_onto(&self, s: usize, rounds: i64) -> Vec<(u64, i64)> {
        let weight = i64::from(self.rank) + 1;
        let mut pairs: Vec<(u64, i64)> = self.keys.shared[s]
            .iter()
            .map(|&k| (k, weight * rounds))
            .collect();
        pairs.push((self.keys.counts[s], rounds));
        pairs
    }

    async fn push_round(&mut self) -> Result<(), BoxError> {
        for s in 0..self.acked.len() {
            let (keys, vals) = sorted(self.rounds_onto(s, 1));
            let sent = self.kv.push(&keys, &vals, None, 0).await;
            match sent {
                Ok(id) => match self.answer(id, "a push round").await {
                    Ok(_) => self.acked[s] += 1,
                    Err(e) => {
                        self.uncertain[s] += 1;
                        self.recover(e).await?;
                    }
                },
                Err(e) => self.recover(e).await?,
            }
        }
        Ok(())
    }

    async fn own_round(&mut self, add: bool) -> Result<(), BoxError> {
        let own = self.keys.own;
        let result = if add {
            match self.kv.push_pull(&[own], &[1], None, 0).await {
                Ok(id) => self.answer(id, "a push-pull of the own key").await,
                Err(e) => Err(e),
            }
        } else {
            match self.pull_sorted(&[own]).await {
                Ok(id) => self.answer(id, "a pull of the own key").await,
                Err(e) => Err(e),
            }
        };
        match result {
            Ok(pairs) => {
                let got = pairs.vals::<i64>()?.first().copied().unwrap_or(0);
                let want = self.adds + i64::from(add);
                // The read may have reached the own key's server just after it came back
                // empty (the notice on its way): put back what it lost and count the add
                // (which did land there) instead of calling the read a loss.
                if got < want {
                    let before = self.adds;
                    self.adds = want; // the server acknowledged the add
                    if self
                        .refill_restarted()
                        .await?
                        .contains(&self.keys.own_server)
                    {
                        return Ok(());
                    }
                    self.adds = before;
                }
                let what = if add {
                    "own key after push-pull"
                } else {
                    "own key after pull"
                };
                self.check_own(what, got, want)
            }
            Err(e) => {
                if add {
                    self.adds_uncertain += 1;
                }
                self.recover(e).await
            }
        }
    }

    async fn run(mut self, o: &Options) -> Result<(), BoxError> {
        let deadline = deadline(o);
        let (mut round, mut last_said, mut last_tick) = (0u64, Instant::now(), Instant::now());
        while SystemTime::now() < deadline {
            if o.ticks && last_tick.elapsed() >= Duration::from_millis(250) {
                last_tick = Instant::now();
                println!("SOAK-TICK {round}");
            }
            let _refilled = self.refill_restarted().await?;
            match round % 3 {
                0 => self.push_round().await?,
                1 => self.own_round(false).await?,
                _ => self.own_round(true).await?,
            }
            round += 1;
            if last_said.elapsed() >= Duration::from_secs(10) {
                last_said = Instant::now();
                println!(
                    "vans-soak: worker {}: {round} rounds, acked {:?}",
                    self.rank, self.acked
                );
            }
        }
        self.finish(o, round).await
    }

    /// Every worker done: check each server's shared keys against all count keys, and this
    /// worker's counts against what it knows it sent.
    async fn finish(mut self, o: &Options, round: u64) -> Result<(), BoxError> {
        let _refilled = self.refill_restarted().await?;
        self.po.barrier(node_ids::WORKER_GROUP).await?;
        let servers = self.acked.len();
        let mut lost = 0i64;
        let mut duplicated = 0i64;
        let mut updates = 0i64;
        for s in 0..servers {
            let counts: Vec<u64> = (0..o.workers)
                .map(|w| Keys::new(self.po, w, o).counts[s])
                .collect();
            let counts = self.pull(&counts).await?;
            let want: i64 = (1i64..).zip(&counts).map(|(weight, n)| weight * n).sum();
            let shared = self.keys.shared[s].clone();
            for (key, got) in shared.iter().zip(self.pull(&shared).await?) {
                self.checks += 1;
                if got != want {
                    return Err(format!(
                        "server {s} shared key {key}: {got}, but the counts {counts:?} make {want}"
                    )
                    .into());
                }
            }
            let mine = counts[self.rank as usize];
            let (low, high) = (self.acked[s], self.acked[s] + self.uncertain[s]);
            self.checks += 1;
            lost += (low - mine).max(0);
            duplicated += (mine - high).max(0);
            updates += mine * (shared.len() as i64 + 1);
        }
        let own = self.pull(&[self.keys.own]).await?[0];
        self.check_own("own key at the end", own, self.adds)?;
        updates += own;
        let stats = self.po.resend_stats().unwrap_or_default();
        println!(
            "SOAK-WORKER {}: rounds {round} updates {updates} checks {} lost {lost} duplicated \
             {duplicated} uncertain {} resent {} duplicates-dropped {} stale-dropped {}",
            self.rank,
            self.checks,
            self.uncertain.iter().sum::<i64>(),
            stats.resent,
            stats.duplicates,
            stats.stale
        );
        if lost != 0 || duplicated != 0 {
            return Err(
                format!("worker {}: lost {lost}, duplicated {duplicated}", self.rank).into(),
            );
        }
        Ok(())
    }
}

/// Keys sorted (as a request needs them) with their values.
fn sorted(mut pairs: Vec<(u64, i64)>) -> (Vec<u64>, Vec<i64>) {
    pairs.sort_unstable();
    pairs.into_iter().unzip()
}

/// When the workers stop: `--until-ms` (milliseconds since the epoch, set by the driver so
/// that a restarted worker stops with the others), else `--seconds` from now.
fn deadline(o: &Options) -> SystemTime {
    match o.until_ms {
        Some(ms) => UNIX_EPOCH + Duration::from_millis(ms),
        None => SystemTime::now() + Duration::from_secs_f64(o.seconds),
    }
}
