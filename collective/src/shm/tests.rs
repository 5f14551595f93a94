//! The shared-memory all-reduce on real segments and futexes: one thread per rank, each with
//! its own mapping of one memfd (rank 0's, opened by the others through `/proc`, as ranks in
//! other processes do).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::group::{self, layout, Group, Rounds};
use super::run::{open_peer, process_gone};
use super::{gather, reduce, signal};
use crate::element::Element;
use crate::element::ReduceOp;
use crate::spin::Spin;
use van_ipc::Segment;

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
        let segment = open_peer(i64::from(std::process::id()), i64::from(fd), "segment").unwrap();
        let group = Group::new(segment, r, n, SLOT, pids.clone(), spin).unwrap();
        group.check_header(7).unwrap();
        all.push(group);
    }
    all
}

/// All-reduce through `g` as collective `number` (the signature every rank agrees on).
fn allreduce<T: Element>(
    g: &Group,
    number: u64,
    buf: &mut [T],
    op: ReduceOp,
    deadline: Instant,
    alive: &dyn Fn() -> crate::Result<()>,
) -> std::result::Result<(), signal::Stopped> {
    let mut rounds = Rounds::new(
        g,
        group::signature(number, 0, T::TAG, buf.len() as u64),
        deadline.saturating_duration_since(Instant::now()),
        alive,
    );
    reduce::allreduce(&mut rounds, buf, op)
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
                        assert!(allreduce(&g, 1, &mut f, op, deadline, &alive).is_ok());
                        check(n, len, op, &f, value);
                        let mut h: Vec<f32> = (0..len).map(|i| value(r, i) as f32).collect();
                        assert!(allreduce(&g, 2, &mut h, op, deadline, &alive).is_ok());
                        check(n, len, op, &h, |k, i| value(k, i) as f32);
                    }
                    let mut ints: Vec<i64> = (0..len).map(|i| (r * 1000 + i) as i64).collect();
                    assert!(allreduce(&g, 3, &mut ints, ReduceOp::Sum, deadline, &alive).is_ok());
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
            allreduce(&groups[1], 1, &mut buf, ReduceOp::Sum, deadline, &|| Ok(()))
        });
        std::thread::sleep(Duration::from_millis(50));
        groups[2].abort(Some(0));
        // A rank that ends the generation afterwards, not knowing why, keeps the name.
        groups[0].abort(None);
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
    match allreduce(&groups[1], 1, &mut buf, ReduceOp::Sum, deadline, &|| Ok(())) {
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
    let result = allreduce(&groups[0], 1, &mut buf, ReduceOp::Sum, deadline, &dead);
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

#[test]
fn all_gather_reduce_scatter_and_broadcast_give_every_rank_the_right_values() {
    for n in [2, 3, 4] {
        let groups: Vec<Arc<Group>> = groups(n, Spin::Busy(Duration::ZERO))
            .into_iter()
            .map(Arc::new)
            .collect();
        let threads: Vec<_> = groups
            .iter()
            .map(|g| {
                let g = Arc::clone(g);
                std::thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_secs(60);
                    let alive = || Ok(());
                    let r = g.rank;
                    let mut number = 0;
                    let mut next = |kind: u64, len: usize| {
                        number += 1;
                        Rounds::new(
                            &g,
                            group::signature(number, kind, 4, len as u64),
                            deadline.saturating_duration_since(Instant::now()),
                            &alive,
                        )
                    };
                    // Lengths under a slot, over several slots, and none.
                    for m in [1, 5, 3000, 3 * 8192 + 11, 0] {
                        let input: Vec<f64> = (0..m).map(|i| value(r, i)).collect();
                        let mut out = vec![0f64; n * m];
                        let mut rounds = next(2, out.len());
                        gather::all_gather(&mut rounds, &input, &mut out).unwrap();
                        for q in 0..n {
                            for i in 0..m {
                                assert_eq!(out[q * m + i], value(q, i), "gather {n} {m} {q} {i}");
                            }
                        }
                        let len = n * m + 1;
                        let mut buf: Vec<f64> = (0..len).map(|i| value(r, i)).collect();
                        let mut rounds = next(3, len);
                        assert!(
                            gather::reduce_scatter(&mut rounds, &mut buf, ReduceOp::Sum).is_ok()
                        );
                        let mine = crate::ring::chunk(len, n, r);
                        check(n, mine.len(), ReduceOp::Sum, &buf[mine.clone()], |k, i| {
                            value(k, mine.start + i)
                        });
                        for root in 0..n {
                            let mut buf: Vec<f64> = (0..m).map(|i| value(r, i)).collect();
                            let mut rounds = next(1, m);
                            gather::broadcast(&mut rounds, &mut buf, root).unwrap();
                            assert!(buf.iter().enumerate().all(|(i, v)| *v == value(root, i)));
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}

#[test]
fn ranks_running_different_collectives_fail_with_the_rank_named() {
    let groups = groups(2, Spin::Busy(Duration::ZERO));
    let deadline = Instant::now() + Duration::from_secs(60);
    std::thread::scope(|s| {
        let other = s.spawn(|| {
            let mut buf = vec![1f32; 100];
            allreduce(&groups[1], 7, &mut buf, ReduceOp::Sum, deadline, &|| Ok(()))
        });
        let mut buf = vec![1f32; 101];
        let mine = allreduce(&groups[0], 7, &mut buf, ReduceOp::Sum, deadline, &|| Ok(()));
        assert!(matches!(mine, Err(signal::Stopped::Mismatch(1, _))));
        assert!(matches!(
            other.join().unwrap(),
            Err(signal::Stopped::Mismatch(0, _))
        ));
    });
}

/// Bytes of each rank's arena in the tests: room for a 4 KiB offset and the largest buffer.
const ARENA: usize = 1 << 20;
/// Marks slot bytes nobody wrote.
const UNTOUCHED: u8 = 0xab;

/// `n` groups whose ranks with `in_arena` have an arena (every other rank maps it, through
/// `/proc`, as ranks in other processes do), with every slot filled with `UNTOUCHED`.
fn arena_groups(in_arena: &[bool]) -> (Vec<Group>, Vec<Option<Segment>>) {
    let n = in_arena.len();
    let mut groups = groups(n, Spin::Busy(Duration::ZERO));
    let arenas: Vec<Option<Segment>> = in_arena
        .iter()
        .map(|&has| has.then(|| Segment::create("arena", ARENA).unwrap()))
        .collect();
    for g in &mut groups {
        let theirs = arenas
            .iter()
            .enumerate()
            .map(|(q, arena)| {
                let arena = arena.as_ref().filter(|_| q != g.rank)?;
                let fd = std::os::fd::AsRawFd::as_raw_fd(&arena.fd());
                Some(open_peer(i64::from(std::process::id()), i64::from(fd), "arena").unwrap())
            })
            .collect();
        let mine = arenas[g.rank]
            .as_ref()
            .map(|arena| van_core::buf::SharedRegion {
                fd: std::os::fd::AsRawFd::as_raw_fd(&arena.fd()),
                start: arena.as_ptr() as usize,
                len: arena.len(),
            });
        g.arenas = group::Arenas { mine, theirs };
        for parity in 0..2 {
            // SAFETY: the slot is inside the mapping; no rank runs yet.
            unsafe { std::ptr::write_bytes(g.slot(g.rank, parity), UNTOUCHED, SLOT) };
        }
    }
    (groups, arenas)
}

/// `len` elements at 4 KiB into `arena`, or on the heap.
///
/// # Safety
///
/// Nothing else may use those bytes of the arena while the slice lives.
unsafe fn buffer<'a>(arena: Option<&'a Segment>, len: usize) -> Box<dyn AsMut<[f64]> + 'a> {
    struct InArena<'a>(&'a mut [f64]);
    impl AsMut<[f64]> for InArena<'_> {
        fn as_mut(&mut self) -> &mut [f64] {
            self.0
        }
    }
    match arena {
        Some(arena) => {
            assert!(4096 + len * 8 <= arena.len());
            // SAFETY: in bounds and aligned (page-aligned mapping); the caller vouches for
            // exclusive use.
            let at = unsafe { arena.as_ptr().add(4096) } as *mut f64;
            Box::new(InArena(unsafe { std::slice::from_raw_parts_mut(at, len) }))
        }
        None => Box::new(vec![0f64; len]),
    }
}

#[test]
fn buffers_in_an_arena_are_read_in_place_with_the_same_bits() {
    // Ranks 0 and 2 in their arenas, rank 1 not: chunks of each kind meet in every share.
    let in_arena = [true, false, true];
    let n = in_arena.len();
    let (groups, arenas) = arena_groups(&in_arena);
    // Three whole slots and a small remainder; two slots and a large remainder.
    let lengths = [3 * 8192 + 7, 2 * 8192 + 3000];
    std::thread::scope(|s| {
        for g in &groups {
            let arena = arenas[g.rank].as_ref();
            s.spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(60);
                for (number, len) in lengths.into_iter().enumerate() {
                    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
                        // SAFETY: only this thread uses its arena.
                        let mut buf = unsafe { buffer(arena, len) };
                        let buf = buf.as_mut().as_mut();
                        buf.iter_mut()
                            .enumerate()
                            .for_each(|(i, v)| *v = value(g.rank, i));
                        let number = number as u64 + 1;
                        assert!(allreduce(g, number, buf, op, deadline, &|| Ok(())).is_ok());
                        check(n, len, op, buf, value);
                    }
                }
            });
        }
    });
    // A rank in its arena wrote only small chunks (copied in whole) and its reduced shares
    // of the large ones into its slots; the other copied every chunk in.
    for (g, &placed) in groups.iter().zip(&in_arena) {
        let mut written = vec![false; SLOT];
        for len in lengths {
            for part in crate::ring::slices(0..len, SLOT / 8) {
                let m = part.len();
                let bytes = match m * 8 <= reduce::SMALL_BYTES {
                    true => 0..m * 8,
                    false => {
                        let share = crate::ring::chunk(m, n, g.rank);
                        share.start * 8..share.end * 8
                    }
                };
                written[bytes].iter_mut().for_each(|w| *w = true);
            }
        }
        for parity in 0..2 {
            // SAFETY: the slots are inside the mapping; no rank runs now.
            let slot = unsafe { std::slice::from_raw_parts(g.slot(g.rank, parity), SLOT) };
            let untouched = slot
                .iter()
                .zip(&written)
                .all(|(&b, &w)| w || b == UNTOUCHED);
            assert_eq!(untouched, placed, "rank {}'s slot {parity}", g.rank);
        }
    }
}

#[test]
fn a_chunk_published_outside_its_arena_is_refused() {
    let (mut groups, arenas) = arena_groups(&[true, true]);
    // Rank 1 says its arena starts an arena's length earlier than it does: the offsets it
    // publishes lie past the end of the mapping rank 0 reads.
    if let Some(mine) = groups[1].arenas.mine.as_mut() {
        mine.start -= ARENA;
        mine.len += ARENA;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let len = 3 * 8192;
    std::thread::scope(|s| {
        let (first, second) = groups.split_at(1);
        let (arenas0, arenas1) = (arenas[0].as_ref(), arenas[1].as_ref());
        let other = s.spawn(move || {
            // SAFETY: only this thread uses rank 1's arena.
            let mut buf = unsafe { buffer(arenas1, len) };
            allreduce(
                &second[0],
                1,
                buf.as_mut().as_mut(),
                ReduceOp::Sum,
                deadline,
                &|| Ok(()),
            )
        });
        // SAFETY: only this thread uses rank 0's arena.
        let mut buf = unsafe { buffer(arenas0, len) };
        let mine = allreduce(
            &first[0],
            1,
            buf.as_mut().as_mut(),
            ReduceOp::Sum,
            deadline,
            &|| Ok(()),
        );
        assert!(matches!(mine, Err(signal::Stopped::Corrupt(1))), "{mine:?}");
        // What the caller does with it: every waiter stops, naming rank 1.
        first[0].abort(Some(1));
        assert!(matches!(
            other.join().unwrap(),
            Err(signal::Stopped::Aborted(Some(1)))
        ));
    });
}

#[test]
fn a_rank_that_read_a_buffer_of_a_rank_that_gave_up_does_not_use_it() {
    // Rank 1's chunk lies in its arena; rank 1 publishes it and its reduction, then gives
    // up (its caller gets the buffer back). Rank 0's waits all pass, but what it read of
    // rank 1's buffer may be its caller's new bytes: it must fail, not return them.
    let (groups, _arenas) = arena_groups(&[false, true]);
    let len = SLOT / 8;
    let deadline = Instant::now() + Duration::from_secs(60);
    let signature = group::signature(1, 0, f64::TAG, len as u64);
    let alive = || Ok(());
    let timeout = deadline.saturating_duration_since(Instant::now());
    let mut rounds = Rounds::new(&groups[1], signature, timeout, &alive);
    let parity = rounds.next_chunk();
    rounds.publish_from(parity, Some(4096));
    rounds.publish(None);
    groups[1].abort(Some(1));
    let mut buf = vec![1f64; len];
    let mine = allreduce(&groups[0], 1, &mut buf, ReduceOp::Sum, deadline, &alive);
    assert!(
        matches!(mine, Err(signal::Stopped::Aborted(Some(1)))),
        "{mine:?}"
    );
}
