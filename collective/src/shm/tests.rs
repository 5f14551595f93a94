//! The shared-memory all-reduce on real segments and futexes: one thread per rank, each with
//! its own mapping of one memfd (rank 0's, opened by the others through `/proc`, as ranks in
//! other processes do).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::group::{layout, Group};
use super::signal::{self, Spin};
use super::*;
use crate::element::Element;

/// Slots of 64 KiB: chunks above `SMALL_BYTES` take the per-share path.
const SLOT: usize = 64 << 10;

/// `n` groups on one segment, rank 0's first.
fn groups(n: usize, spin: Spin) -> Vec<Group> {
    let (_, total) = layout(n, SLOT).unwrap();
    let pids = vec![std::process::id() as i32; n];
    let first = Group::new(
        Segment::create("test", total).unwrap(),
        0,
        n,
        SLOT,
        pids.clone(),
        spin,
    )
    .unwrap();
    first.write_header(7);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&first.segment.fd());
    let mut all = vec![first];
    for r in 1..n {
        let segment = open_peer(i64::from(std::process::id()), i64::from(fd)).unwrap();
        let group = Group::new(segment, r, n, SLOT, pids.clone(), spin).unwrap();
        group.check_header(7).unwrap();
        all.push(group);
    }
    all
}

/// Rank `rank`'s element `i`: magnitudes from 1e-3 to 1e5, so another order of summing
/// gives other bits.
fn value(rank: usize, i: usize) -> f64 {
    let scale = [1e5, 1e-3, 7.0, 3e3, 0.25][rank % 5];
    scale * (1.0 + ((i * 7 + rank * 13) % 101) as f64 / 97.0)
}

/// Every rank's result must be the fold in rank order, bit for bit.
fn check<T: Element>(
    n: usize,
    len: usize,
    op: ReduceOp,
    got: &[T],
    make: impl Fn(usize, usize) -> T,
) {
    for (i, v) in got.iter().enumerate() {
        let total = (1..n).fold(make(0, i), |acc, k| acc.combine(make(k, i), op));
        let want = if op == ReduceOp::Mean {
            total.divide(n)
        } else {
            total
        };
        assert_eq!(
            *v,
            want,
            "{} {op:?}, {n} ranks, len {len}, element {i}",
            T::NAME
        );
    }
}

fn run(n: usize, spin: Spin) {
    // One element, fewer than the ranks, a prime, a small chunk, then several 64 KiB chunks
    // plus a remainder of each kind.
    let lengths = [1, 3, 1009, 2048, 3 * 8192 + 7, 2 * 8192 + 3000];
    let groups: Vec<Arc<Group>> = groups(n, spin).into_iter().map(Arc::new).collect();
    let threads: Vec<_> = groups
        .iter()
        .map(|g| {
            let g = Arc::clone(g);
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(60);
                let alive = || Ok(());
                let r = g.rank;
                for len in lengths {
                    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
                        let mut f: Vec<f64> = (0..len).map(|i| value(r, i)).collect();
                        assert!(reduce::allreduce(&g, &mut f, op, deadline, &alive).is_ok());
                        check(n, len, op, &f, value);
                        let mut h: Vec<f32> = (0..len).map(|i| value(r, i) as f32).collect();
                        assert!(reduce::allreduce(&g, &mut h, op, deadline, &alive).is_ok());
                        check(n, len, op, &h, |k, i| value(k, i) as f32);
                    }
                    let mut ints: Vec<i64> = (0..len).map(|i| (r * 1000 + i) as i64).collect();
                    assert!(
                        reduce::allreduce(&g, &mut ints, ReduceOp::Sum, deadline, &alive).is_ok()
                    );
                    check(n, len, ReduceOp::Sum, &ints, |k, i| (k * 1000 + i) as i64);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn every_rank_gets_the_rank_order_total_bit_for_bit() {
    for n in 2..=5 {
        run(n, Spin::Busy(Duration::ZERO));
    }
}

#[test]
fn spinning_and_yielding_waits_give_the_same_bits() {
    run(2, Spin::Busy(Duration::from_micros(200)));
    run(5, Spin::Yield(Duration::from_micros(200)));
}

#[test]
fn an_abort_stops_every_waiter() {
    let groups = groups(3, Spin::Busy(Duration::ZERO));
    let deadline = Instant::now() + Duration::from_secs(60);
    let started = Instant::now();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let mut buf = vec![1f32; 100];
            reduce::allreduce(&groups[1], &mut buf, ReduceOp::Sum, deadline, &|| Ok(()))
        });
        std::thread::sleep(Duration::from_millis(50));
        groups[2].abort(Some(0));
        assert!(matches!(
            waiter.join().unwrap(),
            Err(signal::Stopped::Aborted(Some(0)))
        ));
    });
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_wait_past_its_deadline_names_the_rank_it_waited_for() {
    let groups = groups(2, Spin::Busy(Duration::ZERO));
    let deadline = Instant::now() + Duration::from_millis(100);
    let mut buf = vec![1f64; 10];
    match reduce::allreduce(&groups[1], &mut buf, ReduceOp::Sum, deadline, &|| Ok(())) {
        Err(signal::Stopped::TimedOut(rank)) => assert_eq!(rank, 0),
        _ => panic!("expected a timeout"),
    }
}

#[test]
fn a_failed_liveness_check_ends_the_wait() {
    let groups = groups(2, Spin::Busy(Duration::ZERO));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut buf = vec![1f64; 10];
    let dead = || Err(crate::CollectiveError::InvalidArgument("gone".into()));
    let result = reduce::allreduce(&groups[0], &mut buf, ReduceOp::Sum, deadline, &dead);
    assert!(matches!(result, Err(signal::Stopped::Failed(_))));
}

#[test]
fn a_killed_process_is_gone_and_a_live_one_is_not() {
    assert!(!process_gone(std::process::id() as i32));
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    assert!(!process_gone(pid));
    child.kill().unwrap();
    // Not yet reaped: a zombie counts as gone.
    let start = Instant::now();
    while !process_gone(pid) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the zombie was not seen"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait().unwrap();
    assert!(process_gone(pid));
}

#[test]
fn a_segment_of_another_token_or_size_is_refused() {
    let groups = groups(2, Spin::Busy(Duration::ZERO));
    assert!(groups[1].check_header(8).is_err());
    let (_, total) = layout(3, SLOT).unwrap();
    let wrong = Group::new(
        Segment::create("test", total).unwrap(),
        0,
        2,
        SLOT,
        vec![],
        Spin::Busy(Duration::ZERO),
    );
    assert!(wrong.is_err());
}
