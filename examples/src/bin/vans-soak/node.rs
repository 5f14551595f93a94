//! One node of the soak cluster: the scheduler and servers serve; a worker runs rounds of
//! push, pull and push-pull and checks every answer exactly, then checks the shared sums.
//!
//! Each worker owns a key only it adds to: after `n` adds it must read exactly `n`, so a lost
//! or doubled update shows at once. Every worker also adds `rank + 1` to the shared keys each
//! push round; at the end each worker publishes how many such rounds it made, and every
//! shared key must hold exactly the sum of `(rank + 1) × rounds` over the workers.

use std::time::{Duration, Instant};

use ps::{node_ids, Config, KvServer, KvWorker, Postoffice, Role};

use crate::{BoxError, Options};

/// The shared keys: spread over the whole key space, so every server holds some.
fn shared_keys(o: &Options) -> Vec<u64> {
    let step = u64::MAX / o.keys.max(1);
    (0..o.keys.max(1)).map(|i| i * step + 7).collect()
}

/// Worker `rank`'s own key, and the key it publishes its round count under.
fn own_keys(rank: u32, o: &Options) -> (u64, u64) {
    let step = u64::MAX / (u64::from(o.workers) + 1);
    let own = (u64::from(rank) + 1) * step + 1_001;
    (own, own + 1)
}

pub(crate) async fn run(o: &Options) -> Result<(), BoxError> {
    let config = Config::from_env()?;
    let po = Postoffice::start(config).await?;
    let result = match po.role() {
        Role::Scheduler => Ok(()),
        Role::Server => {
            let server = KvServer::<i64>::with_sum(&po, 0, 0, 1).await?;
            let done = po.finalize().await;
            report(&po, &format!("server {}", po.my_rank()));
            drop(server);
            return done.map_err(Into::into);
        }
        Role::Worker => worker(&po, o).await,
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
            "SOAK-NODE {who}: resent {} duplicates-dropped {} unacked {}",
            s.resent, s.duplicates, s.unacked
        );
    }
}

/// The exact checks a worker makes; `lost` and `duplicated` count updates, not messages.
#[derive(Default)]
struct Tally {
    checked: u64,
    lost: i64,
    duplicated: i64,
}

impl Tally {
    fn compare(&mut self, what: &str, got: i64, want: i64) -> Result<(), BoxError> {
        self.checked += 1;
        if got == want {
            return Ok(());
        }
        if got < want {
            self.lost += want - got;
        } else {
            self.duplicated += got - want;
        }
        Err(format!("{what}: read {got}, expected {want}").into())
    }
}

async fn worker(po: &Postoffice, o: &Options) -> Result<(), BoxError> {
    let rank = po.my_rank();
    let kv = KvWorker::<i64>::new(po, 0, 0).await?;
    let shared = shared_keys(o);
    let (own, count_key) = own_keys(rank, o);
    let mut push_keys = shared.clone();
    push_keys.push(own);
    push_keys.sort_unstable();
    let push_vals: Vec<i64> = push_keys
        .iter()
        .map(|&k| if k == own { 1 } else { i64::from(rank) + 1 })
        .collect();
    let deadline = Instant::now() + Duration::from_secs_f64(o.seconds);
    let (mut adds, mut shared_rounds, mut round) = (0i64, 0i64, 0u64);
    let mut tally = Tally::default();
    let mut last_said = Instant::now();
    while Instant::now() < deadline {
        match round % 3 {
            0 => {
                let id = kv.push(&push_keys, &push_vals, None, 0).await?;
                kv.wait(id).await?;
                adds += 1;
                shared_rounds += 1;
            }
            1 => {
                let id = kv.pull(&[own], 0).await?;
                let got = kv.wait(id).await?.vals::<i64>()?.first().copied();
                tally.compare("own key after pull", got.unwrap_or(0), adds)?;
            }
            _ => {
                let id = kv.push_pull(&[own], &[1], None, 0).await?;
                let got = kv.wait(id).await?.vals::<i64>()?.first().copied();
                adds += 1;
                tally.compare("own key after push-pull", got.unwrap_or(0), adds)?;
            }
        }
        round += 1;
        if last_said.elapsed() >= Duration::from_secs(10) {
            last_said = Instant::now();
            eprintln!("vans-soak: worker {rank}: {round} rounds, {adds} adds checked so far");
        }
    }
    // Publish the round count, wait for every worker, then check the shared sums.
    let id = kv.push(&[count_key], &[shared_rounds], None, 0).await?;
    kv.wait(id).await?;
    po.barrier(node_ids::WORKER_GROUP).await?;
    let counts: Vec<u64> = (0..o.workers).map(|w| own_keys(w, o).1).collect();
    let id = kv.pull(&counts, 0).await?;
    let rounds = kv.wait(id).await?.vals::<i64>()?.to_vec();
    if rounds.len() != counts.len() {
        return Err(format!(
            "pulled {} round counts for {} workers",
            rounds.len(),
            counts.len()
        )
        .into());
    }
    let want: i64 = (1i64..).zip(&rounds).map(|(weight, n)| weight * n).sum();
    let id = kv.pull(&shared, 0).await?;
    let sums = kv.wait(id).await?.vals::<i64>()?.to_vec();
    if sums.len() != shared.len() {
        return Err(format!(
            "pulled {} shared sums for {} keys",
            sums.len(),
            shared.len()
        )
        .into());
    }
    for (key, got) in shared.iter().zip(&sums) {
        tally.compare(&format!("shared key {key}"), *got, want)?;
    }
    // Updates this worker's checks covered: its own adds, and its share of the shared adds.
    let updates = adds + shared_rounds * shared.len() as i64;
    let stats = po.resend_stats().unwrap_or_default();
    println!(
        "SOAK-WORKER {rank}: rounds {round} updates {updates} checks {} lost {} duplicated {} \
         resent {} duplicates-dropped {}",
        tally.checked, tally.lost, tally.duplicated, stats.resent, stats.duplicates
    );
    Ok(())
}
