//! One process of a collective cluster (`allreduce-bench node MODE`, role from `DMLC_ROLE`):
//! the scheduler and servers only join and finalize; workers run MODE.

use std::time::{Duration, Instant};

use collective::{bf16, Communicator, ReduceOp};
use examples::raw::BoxError;
use ps::{Config, Postoffice, Role};

use crate::options::NodeMode;

/// Joins the cluster described by the environment and runs `mode` on a worker.
pub(crate) async fn run(mode: &NodeMode) -> Result<(), BoxError> {
    let po = Postoffice::start(Config::from_env()?).await?;
    if po.role() == Role::Worker {
        let result = match mode {
            NodeMode::Check => check(&po).await,
            NodeMode::Mismatch { what } => mismatch(&po, what).await,
            NodeMode::Select { sizes, collectives } => select(&po, sizes, collectives).await,
            NodeMode::Elastic {
                steps,
                len,
                step_ms,
                die_at_step,
                die_rank,
            } => {
                let pause = Duration::from_millis(*step_ms);
                let die = die_at_step.map(|step| (step, *die_rank));
                elastic(&po, *steps, *len, pause, die).await
            }
            NodeMode::Bench {
                sizes,
                collectives,
                iters,
                alloc,
            } => bench(&po, sizes, collectives, *iters, *alloc).await,
        };
        if let Err(e) = result {
            po.stop().await;
            return Err(e);
        }
    }
    // Only an elastic run replaces a worker that died; otherwise waiting for one is waiting
    // for nothing.
    let replaced = matches!(mode, NodeMode::Elastic { .. });
    if let Err(e) = all_done(&po, replaced).await {
        po.stop().await;
        return Err(e);
    }
    po.finalize().await?;
    Ok(())
}

/// A barrier of every node, tried again, when `replaced`, while members that died come back
/// (a worker killed in an elastic run is replaced by a new process with its id): the
/// scheduler and the server wait here from the start, the workers when they are done.
async fn all_done(po: &Postoffice, replaced: bool) -> Result<(), BoxError> {
    loop {
        match po.barrier(ps::ALL_GROUPS).await {
            Ok(()) => return Ok(()),
            Err(ps::NodeError::BarrierFailed { dead, .. }) if replaced => {
                for node in dead {
                    po.wait_alive(node, Duration::from_secs(120)).await?;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Each of `collectives` once at each of `sizes` (bytes of f32, the whole buffer), printing
/// the algorithm the communicator took, as `--explain` names it.
async fn select(po: &Postoffice, sizes: &[usize], collectives: &[String]) -> Result<(), BoxError> {
    let mut comm = Communicator::new(po).await?;
    let n = comm.size();
    for name in collectives {
        let collective: collective::Collective = name.parse()?;
        for &size in sizes {
            let len = size / 4;
            if len % n != 0 {
                return Err(format!("{size} B is not a whole f32 per rank of {n}").into());
            }
            let mut buf = vec![1f32; len];
            match collective {
                collective::Collective::AllReduce => {
                    comm.allreduce(&mut buf, ReduceOp::Sum).await?;
                }
                collective::Collective::ReduceScatter => {
                    comm.reduce_scatter(&mut buf, ReduceOp::Sum).await?;
                }
                collective::Collective::AllGather => {
                    let input = vec![1f32; len / n];
                    comm.all_gather(&input, &mut buf).await?;
                }
                collective::Collective::Broadcast => comm.broadcast(&mut buf, 0).await?,
                other => return Err(format!("{other}: not timed here").into()),
            }
            let took = comm
                .last_algorithm()
                .ok_or_else(|| format!("{collective} of {size} B recorded no algorithm"))?;
            println!("took {collective} {size} {took}");
        }
    }
    Ok(())
}

/// Rank 1 runs another call than the others (`what`: `length`, `dtype` or `collective`);
/// every rank prints `mismatch after S s: ERROR`, or fails if it got none.
async fn mismatch(po: &Postoffice, what: &str) -> Result<(), BoxError> {
    let mut comm = Communicator::new(po).await?;
    let odd = comm.rank() == Some(1);
    let started = Instant::now();
    let result = match (odd, what) {
        (true, "length") => comm.allreduce(&mut vec![1f32; 1200], ReduceOp::Sum).await,
        (true, "dtype") => comm.allreduce(&mut vec![1f64; 1000], ReduceOp::Sum).await,
        (true, _) => {
            let mut out = vec![0f32; 1000 * comm.size()];
            comm.all_gather(&[1f32; 1000], &mut out).await
        }
        (false, _) => comm.allreduce(&mut vec![1f32; 1000], ReduceOp::Sum).await,
    };
    match result {
        Ok(()) => Err(format!("rank {:?}: no error for a {what} mismatch", comm.rank()).into()),
        Err(e) => {
            println!(
                "mismatch after {:.1} s: {e}",
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
    }
}

/// Every collective once, each result checked exactly.
async fn check(po: &Postoffice) -> Result<(), BoxError> {
    let mut comm = Communicator::new(po).await?;
    let (r, n) = (comm.rank().unwrap_or(usize::MAX), comm.size());
    let fail = |what: &str| -> BoxError { format!("rank {r}: wrong {what}").into() };
    // A length no rank count divides, over several slices with the default slice size.
    let len = 300_007;
    let mut a: Vec<i64> = (0..len).map(|i| (r * 1_000_000 + i) as i64).collect();
    comm.allreduce(&mut a, ReduceOp::Sum).await?;
    let ranks: i64 = (0..n as i64).sum();
    if a.iter()
        .enumerate()
        .any(|(i, v)| *v != ranks * 1_000_000 + (n * i) as i64)
    {
        return Err(fail("i64 sum"));
    }
    // Larger than a socket takes at once (8 MiB): frames go partly queued and land in parts,
    // and between hosts a share's last frames must be written before the shared-memory phase.
    let big = 2 << 20;
    let mut e: Vec<f32> = (0..big).map(|i| (i % 1000 + r) as f32).collect();
    for _ in 0..2 {
        comm.allreduce(&mut e, ReduceOp::Max).await?;
    }
    if e.iter()
        .enumerate()
        .any(|(i, v)| *v != (i % 1000 + n - 1) as f32)
    {
        return Err(fail("8 MiB f32 max"));
    }
    // A buffer from `Postoffice::alloc`: over shared memory, in the IPC van's arena, whose
    // chunks the other ranks read where they lie. A length no rank count divides.
    let mut shared = po.alloc(150_001 * 8);
    let z: &mut [f64] = bytemuck::try_cast_slice_mut(shared.as_mut_slice())
        .map_err(|e| format!("a buffer from Postoffice::alloc: {e}"))?;
    z.iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = (i % 1000 * (r + 1)) as f64);
    comm.allreduce(z, ReduceOp::Sum).await?;
    let factor: usize = (1..=n).sum();
    if z.iter()
        .enumerate()
        .any(|(i, v)| *v != (i % 1000 * factor) as f64)
    {
        return Err(fail("f64 sum of a buffer from Postoffice::alloc"));
    }
    let mut f: Vec<f32> = (0..1001).map(|i| i as f32 * (r + 1) as f32).collect();
    comm.allreduce(&mut f, ReduceOp::Max).await?;
    if f.iter().enumerate().any(|(i, v)| *v != (i * n) as f32) {
        return Err(fail("f32 max"));
    }
    // Sums that round: every rank must end with the same bits (all-gathered and compared),
    // and near the exact sum. A length no rank count divides, over several slices.
    let mut g: Vec<f32> = (0..100_003)
        .map(|i| (r + 1) as f32 * 0.1 + i as f32 * 1e-3)
        .collect();
    comm.allreduce(&mut g, ReduceOp::Sum).await?;
    let bits = g.iter().fold(0u64, |h, v| {
        examples::splitmix64(h ^ u64::from(v.to_bits()))
    });
    let mut everyone = vec![0i64; n];
    comm.all_gather(&[bits as i64], &mut everyone).await?;
    if everyone.iter().any(|&b| b != bits as i64) {
        return Err(fail("f32 sum: ranks hold different bits"));
    }
    let near = g.iter().enumerate().all(|(i, v)| {
        let exact: f64 = (0..n)
            .map(|q| f64::from((q + 1) as f32 * 0.1 + i as f32 * 1e-3))
            .sum();
        (f64::from(*v) - exact).abs() <= exact.abs() * 1e-5
    });
    if !near {
        return Err(fail("f32 sum: far from the exact sum"));
    }
    let mut d: Vec<f64> = vec![r as f64; 17];
    comm.allreduce(&mut d, ReduceOp::Mean).await?;
    if d.iter().any(|v| *v != ranks as f64 / n as f64) {
        return Err(fail("f64 mean"));
    }
    // An integer mean truncates once: odd ranks 0, even ranks r + 1.
    let mut im: Vec<i64> = vec![if r % 2 == 0 { r as i64 + 1 } else { 0 }; 9];
    comm.allreduce(&mut im, ReduceOp::Mean).await?;
    let total: i64 = (0..n as i64).filter(|q| q % 2 == 0).map(|q| q + 1).sum();
    if im.iter().any(|v| *v != total / n as i64) {
        return Err(fail("i64 mean"));
    }
    let mut m: Vec<i32> = vec![r as i32; 5];
    comm.allreduce(&mut m, ReduceOp::Min).await?;
    if m != [0; 5] {
        return Err(fail("i32 min"));
    }
    let mut h: Vec<bf16> = vec![bf16::from_f32(r as f32 + 1.0); 3];
    comm.allreduce(&mut h, ReduceOp::Sum).await?;
    if h.iter().any(|v| v.to_f32() != (n * (n + 1) / 2) as f32) {
        return Err(fail("bf16 sum"));
    }
    let mut empty: Vec<f64> = Vec::new();
    comm.allreduce(&mut empty, ReduceOp::Sum).await?;
    let mut rs: Vec<i32> = (0..11).collect();
    let mine = comm.reduce_scatter(&mut rs, ReduceOp::Sum).await?;
    if mine != collective::ring::chunk(11, n, r)
        || mine.clone().any(|i| rs[i] != i as i32 * n as i32)
    {
        return Err(fail("reduce_scatter"));
    }
    let input = [r as i64; 3];
    let mut out = vec![0i64; 3 * n];
    comm.all_gather(&input, &mut out).await?;
    if out.chunks(3).enumerate().any(|(k, b)| b != [k as i64; 3]) {
        return Err(fail("all_gather"));
    }
    let mut b: Vec<f64> = if r == 0 {
        vec![2.5; 70_001]
    } else {
        vec![0.0; 70_001]
    };
    comm.broadcast(&mut b, 0).await?;
    if b.iter().any(|v| *v != 2.5) {
        return Err(fail("broadcast"));
    }
    comm.barrier().await?;
    // A barrier holds every rank until the last comes: here the last rank comes 200 ms
    // late. The check compares clocks, not how long each rank waited: ranks leave the
    // barrier above at moments apart (a segment lost between hosts delays one by a
    // retransmission), so a wait alone says little. Every rank must leave the next barrier
    // after the last rank entered it, within `SKEW` (clocks of different machines differ).
    const SKEW: Duration = Duration::from_millis(100);
    let left_before = since_epoch()?;
    if r == n - 1 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let entered = since_epoch()?;
    comm.barrier().await?;
    let left = since_epoch()?;
    let mut times = vec![0i64; 3 * n];
    comm.all_gather(&[left_before, entered, left], &mut times)
        .await?;
    let last_entered = times[3 * (n - 1) + 1];
    let early = (0..n).find(|&q| times[3 * q + 2] + (SKEW.as_micros() as i64) < last_entered);
    if let Some(q) = early {
        let each: Vec<String> = times
            .chunks(3)
            .enumerate()
            .map(|(q, t)| {
                format!(
                    "rank {q} left the first at {} µs, entered the second at {} µs, left at {} µs",
                    t[0] - last_entered,
                    t[1] - last_entered,
                    t[2] - last_entered
                )
            })
            .collect();
        return Err(fail(&format!(
            "barrier: rank {q} left before the last rank came ({})",
            each.join("; ")
        )));
    }
    // The rounded sum's digest, so that runs can be compared (under loss, without).
    println!("collective check f32 sum bits: {bits:016x}");
    println!("collective check ok: rank {r} of {n}");
    Ok(())
}

/// Microseconds since the Unix epoch: a clock every process of the machine shares.
fn since_epoch() -> Result<i64, BoxError> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    Ok(i64::try_from(now.as_micros())?)
}

/// What `node`'s value `i` is at `step`.
fn contribution(step: u64, node: i32, i: usize) -> i64 {
    (step as i64 + 1) * i64::from(node) * 1000 + i as i64
}

/// A training loop of `steps` all-reduces that survives failures and joins: after a failed
/// collective it settles, and every new generation starts by broadcasting rank 0's step (as
/// an elastic job restores its state). Each completed step is checked exactly against the
/// generation's members.
async fn elastic(
    po: &Postoffice,
    steps: u64,
    len: usize,
    pause: Duration,
    die: Option<(u64, usize)>,
) -> Result<(), BoxError> {
    let mut comm = Communicator::new(po).await?;
    let first = comm.generation().number;
    let mut step = 0u64;
    let mut sync = true;
    let (mut interrupted, mut checked) = (0u64, 0u64);
    let mut sizes = Vec::new();
    let settle = Duration::from_secs(60);
    let started = Instant::now();
    let mut last_report = Instant::now();
    loop {
        let generation = comm.generation();
        if sync {
            let mut shared = [step as i64];
            if let Err(e) = comm.broadcast(&mut shared, 0).await {
                interrupted += 1;
                println!("sync after generation {}: {e}", generation.number);
                let g = comm.settle(settle).await?;
                println!("generation {} members {:?}", g.number, g.members);
                continue;
            }
            step = u64::try_from(shared[0]).map_err(|_| "negative step from rank 0")?;
            sync = false;
            sizes.push(generation.size());
            println!(
                "generation {} size {} at step {step}",
                generation.number,
                generation.size()
            );
        }
        if step >= steps {
            break;
        }
        // Only in the first generation: the next one's rank of that number lives on.
        let dies = |&(at, rank): &(u64, usize)| {
            at == step && comm.rank() == Some(rank) && generation.number == first
        };
        if let Some((_, rank)) = die.filter(dies) {
            println!("rank {rank} (node {}) dies at step {step}", comm.node());
            // Mid-way through the all-reduce below, where the others wait on each other.
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(3));
                let me = rustix::process::getpid();
                let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
            });
        }
        let me = comm.node();
        let mut values: Vec<i64> = (0..len).map(|i| contribution(step, me, i)).collect();
        match comm.allreduce(&mut values, ReduceOp::Sum).await {
            Ok(()) => {
                for (i, v) in values.iter().enumerate() {
                    let expected: i64 = generation
                        .members
                        .iter()
                        .map(|&m| contribution(step, m, i))
                        .sum();
                    if *v != expected {
                        return Err(format!(
                            "step {step}, generation {}: element {i} is {v}, expected {expected}",
                            generation.number
                        )
                        .into());
                    }
                }
                checked += 1;
                step += 1;
                if last_report.elapsed() >= Duration::from_secs(1) {
                    println!("step {step} generation {}", generation.number);
                    last_report = Instant::now();
                }
                tokio::time::sleep(pause).await;
            }
            Err(e) => {
                interrupted += 1;
                println!("step {step}: {e}");
                let g = comm.settle(settle).await?;
                println!("generation {} members {:?}", g.number, g.members);
                sync = true;
            }
        }
    }
    comm.barrier().await?;
    println!(
        "elastic ok: {steps} steps, {checked} checked here, {interrupted} interrupted, \
         generation sizes {sizes:?}, {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Times each collective (f32; sums) at each size; rank 0 (a broadcast's last rank, which
/// receives) prints one JSON line per case. With `alloc`, all-reduce buffers come from
/// `Postoffice::alloc`.
async fn bench(
    po: &Postoffice,
    sizes: &[usize],
    collectives: &[String],
    iters: usize,
    alloc: bool,
) -> Result<(), BoxError> {
    let mut comm = Communicator::new(po).await?;
    let (r, n) = (comm.rank().unwrap_or(usize::MAX), comm.size());
    warm_up(&mut comm, r).await?;
    for name in collectives {
        for &bytes in sizes {
            // All-gather and reduce-scatter move whole blocks of one per rank.
            let len = match name.as_str() {
                "allgather" | "reducescatter" => bytes / 4 / n * n,
                _ => bytes / 4,
            };
            let mut shared = (alloc && name == "allreduce").then(|| po.alloc(len * 4));
            if shared.as_ref().is_some_and(|b| b.van().is_none()) && r == 0 {
                eprintln!("allreduce-bench: no shared buffer of {bytes} bytes: the heap's");
            }
            let mut heap = match shared {
                Some(_) => Vec::new(),
                None => vec![1.0f32; len],
            };
            let buf: &mut [f32] = match shared.as_mut() {
                Some(shared) => {
                    let buf = bytemuck::try_cast_slice_mut(shared.as_mut_slice())
                        .map_err(|e| format!("a buffer from Postoffice::alloc: {e}"))?;
                    buf.fill(1.0);
                    buf
                }
                None => &mut heap,
            };
            let input = vec![1.0f32; len / n];
            // Fewer rounds for large buffers, at least 5.
            let rounds = (iters * (1 << 20) / bytes.max(1 << 20)).max(5);
            let mut times = Vec::with_capacity(rounds);
            comm.barrier().await?;
            let mut all = Instant::now();
            for round in 0..rounds + 2 {
                // Two rounds of warm-up, then the timed ones.
                if round == 2 {
                    comm.barrier().await?;
                    all = Instant::now();
                }
                let t = Instant::now();
                match name.as_str() {
                    "allgather" => comm.all_gather(&input, buf).await?,
                    "reducescatter" => {
                        comm.reduce_scatter(buf, ReduceOp::Sum).await?;
                    }
                    "broadcast" => comm.broadcast(buf, 0).await?,
                    _ => comm.allreduce(buf, ReduceOp::Sum).await?,
                }
                if round >= 2 {
                    times.push(t.elapsed().as_secs_f64());
                }
            }
            let total = all.elapsed().as_secs_f64();
            times.sort_by(f64::total_cmp);
            // A broadcast's root is done once its buffer is on its way: a receiver reports.
            let reporter = if name == "broadcast" { n - 1 } else { 0 };
            if r == reporter {
                let line = format!(
                    "{{\"impl\":\"vans\",\"op\":\"{name}\",\"ranks\":{n},\"bytes\":{},\
                     \"rounds\":{rounds},\"mean_s\":{},\"p50_s\":{}}}\n",
                    len * 4,
                    total / rounds as f64,
                    times[times.len() / 2]
                );
                report(&line)?;
            }
        }
    }
    Ok(())
}

/// How long a cluster runs 4 KiB all-reduces before the timed ones, so that its start
/// (connections, the mesh and the shared segments forming, first page faults) is not timed,
/// as OSU's benchmarks skip their first rounds. Open MPI's side warms up alike.
const WARM_UP: Duration = Duration::from_millis(200);

/// 4 KiB all-reduces for [`WARM_UP`] by rank 0's clock (every rank runs as many: rank 0's
/// verdict goes out in a max all-reduce after every ten).
async fn warm_up(comm: &mut Communicator, rank: usize) -> Result<(), BoxError> {
    let started = Instant::now();
    let mut buf = vec![1.0f32; 1024];
    loop {
        for _ in 0..10 {
            comm.allreduce(&mut buf, ReduceOp::Sum).await?;
        }
        let mut more = [i32::from(rank == 0 && started.elapsed() < WARM_UP)];
        comm.allreduce(&mut more, ReduceOp::Max).await?;
        if more[0] == 0 {
            return Ok(());
        }
    }
}

/// Appends a result line to the driver's file ([`OUT_ENV`](crate::OUT_ENV)), or prints it.
fn report(line: &str) -> Result<(), BoxError> {
    use std::io::Write;
    match std::env::var_os(crate::OUT_ENV) {
        Some(path) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(|e| format!("cannot write results to {path:?}: {e}").into()),
        None => {
            print!("{line}");
            Ok(())
        }
    }
}
