//! The SPSC ring under load, under back-pressure, against garbage, and across processes.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use van_ipc::ring::{create_ring, layout, Consumer, Producer, FIRST, LAST, WRAP};
use van_ipc::{IpcError, Segment, WaitResult};

/// Longest any single wait may take before the test declares a lost wake-up or a hang.
const WAIT: Duration = Duration::from_secs(20);
/// A small ring, so that wrap-around and back-pressure happen constantly.
const SMALL_RING: usize = 64 << 10;
/// Environment variable that turns `child_echo` into the child side of the echo test: the
/// numbers of the two segment descriptors the child inherits, `<inbound>,<outbound>`.
const CHILD_ENV: &str = "VAN_IPC_RING_TEST_CHILD";
/// Messages the child echoes.
const CHILD_MESSAGES: usize = 1000;

fn pair(capacity: usize) -> (Arc<Segment>, Producer, Consumer) {
    let segment = create_ring("test", capacity).unwrap();
    let producer = Producer::new(Arc::clone(&segment), false).unwrap();
    let consumer = Consumer::new(Arc::clone(&segment), false).unwrap();
    (segment, producer, consumer)
}

/// Sends one message of any length as `parts`, waiting for space as needed.
fn send(producer: &mut Producer, parts: &[&[u8]], spins: u32) {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut offset = 0;
    loop {
        match producer.try_push_message(parts, offset).unwrap() {
            Some(next) => {
                offset = next;
                if offset == total {
                    break;
                }
            }
            None => {
                producer.wake_consumer();
                let want = (total - offset).min(producer.max_record());
                let result = producer.wait_for_space(want, spins, WAIT);
                assert_eq!(
                    result,
                    WaitResult::Ready,
                    "waiting for {want} bytes of space"
                );
            }
        }
    }
    producer.wake_consumer();
}

/// Receives one whole message; `None` when the ring is closed and drained.
fn recv(consumer: &mut Consumer, out: &mut BytesMut, spins: u32) -> Option<Bytes> {
    loop {
        match consumer.try_pop(out).unwrap() {
            Some(flags) if flags & LAST != 0 => return Some(out.split().freeze()),
            Some(_) => {}
            None => match consumer.wait_for_data(spins, WAIT) {
                WaitResult::Ready => {}
                WaitResult::Closed => return None,
                WaitResult::TimedOut => panic!("no data for {WAIT:?}: lost wake-up?"),
            },
        }
    }
}

/// Random messages: mostly small, some around the record limit, some far bigger than the
/// ring (so they travel fragmented), a few empty.
fn messages(seed: u64, count: usize, max_record: usize) -> Vec<Vec<u8>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            let len = match rng.gen_range(0..100) {
                0..=1 => 0,
                2..=79 => rng.gen_range(1..256),
                80..=91 => rng.gen_range(256..max_record),
                92..=96 => rng.gen_range(max_record - 16..max_record + 16),
                _ => rng.gen_range(SMALL_RING..5 * SMALL_RING),
            };
            let mut message = vec![0u8; len];
            rng.fill(&mut message[..]);
            message
        })
        .collect()
}

/// Splits `message` into up to three parts at random points.
fn split_parts<'a>(message: &'a [u8], rng: &mut StdRng) -> Vec<&'a [u8]> {
    let a = rng.gen_range(0..=message.len());
    let b = rng.gen_range(a..=message.len());
    vec![&message[..a], &message[a..b], &message[b..]]
}

fn stream_between_threads(spins: u32, seed: u64) {
    let (_segment, mut producer, mut consumer) = pair(SMALL_RING);
    let all = Arc::new(messages(seed, 10_000, producer.max_record()));
    let sent = Arc::clone(&all);
    let writer = std::thread::spawn(move || {
        let mut rng = StdRng::seed_from_u64(seed ^ 1);
        for message in sent.iter() {
            send(&mut producer, &split_parts(message, &mut rng), spins);
        }
        producer.close();
    });
    let mut out = BytesMut::new();
    for (i, expected) in all.iter().enumerate() {
        let got = recv(&mut consumer, &mut out, spins).expect("closed before the end");
        assert_eq!(got.len(), expected.len(), "message {i}");
        assert!(got[..] == expected[..], "message {i} differs");
    }
    assert_eq!(recv(&mut consumer, &mut out, spins), None);
    writer.join().unwrap();
}

#[test]
fn ten_thousand_messages_between_threads_sleeping() {
    // No spinning: every wait goes through the futex, which is where lost wake-ups show.
    stream_between_threads(0, 7);
}

#[test]
fn ten_thousand_messages_between_threads_spinning() {
    stream_between_threads(2_000, 8);
}

#[test]
fn ping_pong_never_loses_a_wake_up() {
    let (_a, mut ping_tx, mut ping_rx) = pair(SMALL_RING);
    let (_b, mut pong_tx, mut pong_rx) = pair(SMALL_RING);
    const ROUNDS: u32 = 5_000;
    let echo = std::thread::spawn(move || {
        let mut out = BytesMut::new();
        while let Some(message) = recv(&mut ping_rx, &mut out, 0) {
            send(&mut pong_tx, &[&message], 0);
        }
        pong_tx.close();
    });
    let mut out = BytesMut::new();
    for round in 0..ROUNDS {
        let bytes = round.to_le_bytes();
        send(&mut ping_tx, &[&bytes], 0);
        assert_eq!(recv(&mut pong_rx, &mut out, 0).unwrap()[..], bytes);
    }
    ping_tx.close();
    assert_eq!(recv(&mut pong_rx, &mut out, 0), None);
    echo.join().unwrap();
}

#[test]
fn a_full_ring_refuses_without_losing_anything() {
    let (_segment, mut producer, mut consumer) = pair(SMALL_RING);
    let mut pushed = Vec::new();
    let mut n = 0u32;
    loop {
        let message = vec![n as u8; 100 + (n as usize * 37) % 900];
        let free = producer.free_bytes();
        if !producer.try_push(&message, FIRST | LAST).unwrap() {
            assert_eq!(producer.free_bytes(), free, "a refused push wrote nothing");
            break;
        }
        pushed.push(message);
        n += 1;
    }
    assert!(pushed.len() > 50, "only {} messages fit", pushed.len());
    assert_eq!(
        producer.wait_for_space(producer.max_record(), 10, Duration::from_millis(20)),
        WaitResult::TimedOut
    );
    // Drain half, refill, drain everything: order and content intact.
    let mut out = BytesMut::new();
    let mut expected = pushed.into_iter();
    for _ in 0..30 {
        assert_eq!(consumer.try_pop(&mut out).unwrap(), Some(FIRST | LAST));
        assert_eq!(out.split(), expected.next().unwrap()[..]);
    }
    let mut rest: Vec<Vec<u8>> = expected.collect();
    while producer.try_push(&[0xEE; 500], FIRST | LAST).unwrap() {
        rest.push(vec![0xEE; 500]);
    }
    for message in rest {
        assert_eq!(consumer.try_pop(&mut out).unwrap(), Some(FIRST | LAST));
        assert_eq!(out.split(), message[..]);
    }
    assert_eq!(consumer.try_pop(&mut out).unwrap(), None);
    assert_eq!(producer.free_bytes(), producer.capacity());
}

#[test]
fn records_larger_than_the_limit_are_refused() {
    let (_segment, mut producer, _consumer) = pair(SMALL_RING);
    let max = producer.max_record();
    assert_eq!(max, SMALL_RING / 4);
    let big = vec![0u8; max + 1];
    assert!(matches!(
        producer.try_push(&big, FIRST | LAST),
        Err(IpcError::TooLarge { len, max: m }) if len == max + 1 && m == max
    ));
    assert!(matches!(
        producer.try_push_parts(&[&big[..max], &big[max..]]),
        Err(IpcError::TooLarge { .. })
    ));
    assert!(producer.try_push(&big[..max], FIRST | LAST).unwrap());
}

#[test]
fn close_lets_the_consumer_drain_first() {
    let (_segment, mut producer, mut consumer) = pair(SMALL_RING);
    assert!(producer.try_push_parts(&[b"last words"]).unwrap());
    producer.close();
    assert!(consumer.is_closed() && producer.is_closed());
    assert_eq!(consumer.wait_for_data(0, Duration::ZERO), WaitResult::Ready);
    let mut out = BytesMut::new();
    assert_eq!(
        recv(&mut consumer, &mut out, 0).unwrap(),
        &b"last words"[..]
    );
    assert_eq!(consumer.wait_for_data(0, WAIT), WaitResult::Closed);
    assert_eq!(producer.wait_for_space(8, 0, WAIT), WaitResult::Closed);
}

#[test]
fn close_wakes_a_sleeping_consumer() {
    let (_segment, producer, consumer) = pair(SMALL_RING);
    let waiter = std::thread::spawn(move || {
        let start = Instant::now();
        (consumer.wait_for_data(0, WAIT), start.elapsed())
    });
    std::thread::sleep(Duration::from_millis(50));
    producer.close();
    let (result, waited) = waiter.join().unwrap();
    assert_eq!(result, WaitResult::Closed);
    assert!(waited < WAIT / 2, "woken by close, not by the timeout");
}

#[test]
fn waiting_for_data_times_out() {
    let (_segment, _producer, consumer) = pair(SMALL_RING);
    let start = Instant::now();
    assert_eq!(
        consumer.wait_for_data(100, Duration::from_millis(30)),
        WaitResult::TimedOut
    );
    assert!(start.elapsed() >= Duration::from_millis(30));
}

// ---- garbage from the peer ------------------------------------------------------------------

/// Writes a u64 into the segment at `offset`.
fn poke(segment: &Segment, offset: usize, value: u64) {
    assert!(offset % 8 == 0 && offset + 8 <= segment.len());
    // SAFETY: in bounds and aligned (checked above, mapping page-aligned); the test's ring
    // ends do not run concurrently with this write.
    unsafe {
        segment
            .as_ptr()
            .add(offset)
            .cast::<u64>()
            .write_volatile(value)
    };
}

fn record(len: u32, flags: u32) -> u64 {
    u64::from(len) | (u64::from(flags) << 32)
}

/// Reads a u64 from the segment at `offset`.
fn peek(segment: &Segment, offset: usize) -> u64 {
    assert!(offset % 8 == 0 && offset + 8 <= segment.len());
    // SAFETY: in bounds and aligned (checked above, mapping page-aligned); the test's ring
    // ends do not run concurrently with this read.
    unsafe { segment.as_ptr().add(offset).cast::<u64>().read_volatile() }
}

fn expect_corrupt(consumer: &mut Consumer, what: &str) {
    match consumer.try_pop(&mut BytesMut::new()) {
        Err(IpcError::Corrupt { reason }) => assert!(!reason.is_empty()),
        other => panic!("{what}: expected Corrupt, got {other:?}"),
    }
}

#[test]
fn bad_cursors_and_records_are_corrupt() {
    let cases: Vec<(&str, Vec<(usize, u64)>)> = vec![
        (
            "head beyond the ring",
            vec![(layout::HEAD_OFFSET, SMALL_RING as u64 + 8)],
        ),
        (
            "head behind tail",
            vec![(layout::HEAD_OFFSET, u64::MAX - 7)],
        ),
        ("unaligned head", vec![(layout::HEAD_OFFSET, 12)]),
        (
            "unknown flags",
            vec![
                (layout::DATA_OFFSET, record(0, 8)),
                (layout::HEAD_OFFSET, 8),
            ],
        ),
        (
            "wrap combined with first",
            vec![
                (layout::DATA_OFFSET, record(0, WRAP | FIRST)),
                (layout::HEAD_OFFSET, 8),
            ],
        ),
        (
            "record longer than published",
            vec![
                (layout::DATA_OFFSET, record(64, FIRST | LAST)),
                (layout::HEAD_OFFSET, 16),
            ],
        ),
        (
            "record longer than the ring",
            vec![
                (layout::DATA_OFFSET, record(u32::MAX, FIRST | LAST)),
                (layout::HEAD_OFFSET, SMALL_RING as u64),
            ],
        ),
        (
            "wrap record not ending the ring",
            vec![
                (layout::DATA_OFFSET, record(64, WRAP)),
                (layout::HEAD_OFFSET, 72),
            ],
        ),
        (
            "wrap record longer than published",
            vec![
                (layout::DATA_OFFSET, record(SMALL_RING as u32 - 8, WRAP)),
                (layout::HEAD_OFFSET, 64),
            ],
        ),
        (
            "continuation without a first record",
            vec![
                (layout::DATA_OFFSET, record(0, LAST)),
                (layout::HEAD_OFFSET, 8),
            ],
        ),
    ];
    for (what, writes) in cases {
        let (segment, _producer, mut consumer) = pair(SMALL_RING);
        for (offset, value) in writes {
            poke(&segment, offset, value);
        }
        expect_corrupt(&mut consumer, what);
    }
}

#[test]
fn a_record_straddling_the_end_is_corrupt() {
    let (segment, mut producer, mut consumer) = pair(SMALL_RING);
    // Move both cursors to 64 bytes before the end with honest records.
    let mut out = BytesMut::new();
    let max = producer.max_record();
    for len in [max - 8, max - 8, max - 8, max - 8 - 64] {
        assert!(producer.try_push(&vec![0; len], FIRST | LAST).unwrap());
        consumer.try_pop(&mut out).unwrap().unwrap();
    }
    let tail = peek(&segment, layout::TAIL_OFFSET);
    assert_eq!(tail, (SMALL_RING - 64) as u64);
    // A 120-byte record 64 bytes before the end would cross it.
    poke(
        &segment,
        layout::DATA_OFFSET + tail as usize,
        record(120, FIRST | LAST),
    );
    poke(&segment, layout::HEAD_OFFSET, tail + 128);
    expect_corrupt(&mut consumer, "record crossing the end");
}

#[test]
fn a_message_over_the_limit_is_corrupt() {
    let (_segment, mut producer, mut consumer) = pair(SMALL_RING);
    consumer.set_max_message(20_000);
    let big = vec![1u8; 30_000];
    let mut out = BytesMut::new();
    assert_eq!(producer.try_push_message(&[&big], 0).unwrap(), Some(16_384));
    assert_eq!(consumer.try_pop(&mut out).unwrap(), Some(FIRST));
    assert_eq!(
        producer.try_push_message(&[&big], 16_384).unwrap(),
        Some(30_000)
    );
    assert!(matches!(
        consumer.try_pop(&mut out),
        Err(IpcError::Corrupt { .. })
    ));
}

#[test]
fn fragments_out_of_order_are_corrupt() {
    let (_segment, mut producer, mut consumer) = pair(SMALL_RING);
    let mut out = BytesMut::new();
    assert!(producer.try_push(b"a", FIRST).unwrap());
    assert!(producer.try_push(b"b", FIRST | LAST).unwrap());
    assert_eq!(consumer.try_pop(&mut out).unwrap(), Some(FIRST));
    assert!(matches!(
        consumer.try_pop(&mut out),
        Err(IpcError::Corrupt { .. })
    ));
}

#[test]
fn a_bad_consumer_cursor_is_corrupt_for_the_producer() {
    let (segment, mut producer, _consumer) = pair(SMALL_RING);
    while producer.try_push(&[0; 1000], FIRST | LAST).unwrap() {}
    poke(&segment, layout::TAIL_OFFSET, 1 << 40);
    assert!(matches!(
        producer.try_push(&[0; 1000], FIRST | LAST),
        Err(IpcError::Corrupt { .. })
    ));
    assert_eq!(producer.free_bytes(), 0);
    // A corrupt cursor ends the wait at once so that the next push reports it.
    assert_eq!(producer.wait_for_space(1000, 0, WAIT), WaitResult::Ready);
}

#[test]
fn bad_headers_are_bad_segments() {
    let cases: [(&str, usize, u64); 5] = [
        ("magic", layout::MAGIC_OFFSET, 0),
        ("version", layout::VERSION_OFFSET, 2),
        ("capacity", layout::CAPACITY_OFFSET, SMALL_RING as u64 + 8),
        ("capacity", layout::CAPACITY_OFFSET, 2 * SMALL_RING as u64),
        ("cursors", layout::HEAD_OFFSET, 3),
    ];
    for (what, offset, value) in cases {
        let segment = create_ring("bad-header", SMALL_RING).unwrap();
        poke(&segment, offset, value);
        let err = Consumer::new(Arc::clone(&segment), false).unwrap_err();
        assert!(matches!(err, IpcError::BadSegment { .. }), "{what}: {err}");
        assert!(err.to_string().contains(what), "{what}: {err}");
        assert!(matches!(
            Producer::new(segment, false),
            Err(IpcError::BadSegment { .. })
        ));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random cursors and record words never make the consumer panic, read out of bounds or
    /// return more than a record's worth of bytes.
    #[test]
    fn garbage_never_panics_the_consumer(
        warmup in 0usize..40,
        // How far the scribbled head is ahead of the tail: anything, a plausible distance,
        // or a small one that is often misaligned.
        head_ahead in prop_oneof![
            any::<u64>(),
            (1u64..=(SMALL_RING as u64 / 8)).prop_map(|k| k * 8),
            0u64..4096,
        ],
        words in proptest::collection::vec(
            prop_oneof![
                any::<u64>(),
                (0u32..2048, 0u32..8).prop_map(|(len, flags)| record(len, flags)),
                (0u32..(SMALL_RING as u32), Just(WRAP)).prop_map(|(len, flags)| record(len, flags)),
            ],
            0..64,
        ),
    ) {
        let (segment, mut producer, mut consumer) = pair(SMALL_RING);
        let mut out = BytesMut::new();
        // Move the cursors somewhere arbitrary with honest traffic first.
        for i in 0..warmup {
            let message = vec![i as u8; 1 + i * 997 % 3000];
            prop_assert!(producer.try_push(&message, FIRST | LAST).unwrap());
            prop_assert!(consumer.try_pop(&mut out).unwrap().is_some());
        }
        // Scribble where the consumer will read next.
        let start = peek(&segment, layout::TAIL_OFFSET) as usize % producer.capacity();
        let base = producer.capacity();
        for (i, word) in words.iter().enumerate() {
            let offset = (start + 8 * i) % base;
            poke(&segment, layout::DATA_OFFSET + offset, *word);
        }
        let tail = peek(&segment, layout::TAIL_OFFSET);
        poke(&segment, layout::HEAD_OFFSET, tail.wrapping_add(head_ahead));
        for _ in 0..128 {
            let before = out.len();
            match consumer.try_pop(&mut out) {
                Ok(Some(_)) => prop_assert!(out.len() - before <= producer.max_record()),
                Ok(None) => break,
                Err(IpcError::Corrupt { .. }) => break,
                Err(other) => prop_assert!(false, "unexpected error {other}"),
            }
        }
    }

    /// Random header bytes are either accepted or refused as a bad segment, never a panic.
    #[test]
    fn garbage_headers_never_panic(
        words in proptest::collection::vec((0usize..48, any::<u64>()), 0..8),
        keep_magic in any::<bool>(),
    ) {
        let segment = create_ring("garbage-header", SMALL_RING).unwrap();
        for (slot, value) in words {
            let offset = slot * 8;
            if keep_magic && offset == layout::MAGIC_OFFSET {
                continue;
            }
            poke(&segment, offset, value);
        }
        for result in [
            Consumer::new(Arc::clone(&segment), false).map(|c| c.capacity()),
            Producer::new(Arc::clone(&segment), false).map(|p| p.capacity()),
        ] {
            match result {
                Ok(capacity) => prop_assert!(layout::HEADER_BYTES + capacity <= segment.len()),
                Err(IpcError::BadSegment { .. }) => {}
                Err(other) => prop_assert!(false, "unexpected error {other}"),
            }
        }
    }
}

// ---- segments ------------------------------------------------------------------------------

#[test]
fn open_rejects_an_unsealed_memfd() {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create("unsealed", MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&fd, 1 << 20).unwrap();
    let err = Segment::open(fd).unwrap_err();
    assert!(matches!(err, IpcError::BadSegment { .. }), "{err}");

    // Sealable but not sealed against shrinking: refused too.
    let fd = rustix::fs::memfd_create("sealable", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .unwrap();
    rustix::fs::ftruncate(&fd, 1 << 20).unwrap();
    rustix::fs::fcntl_add_seals(&fd, SealFlags::GROW).unwrap();
    let err = Segment::open(fd).unwrap_err();
    assert!(err.to_string().contains("F_SEAL_SHRINK"), "{err}");
}

#[test]
fn a_received_segment_carries_the_ring() {
    let segment = create_ring("shared", SMALL_RING).unwrap();
    let received = Arc::new(Segment::open(segment.fd().try_clone_to_owned().unwrap()).unwrap());
    let mut producer = Producer::new(segment, false).unwrap();
    let mut consumer = Consumer::new(received, false).unwrap();
    assert!(producer
        .try_push_parts(&[b"through ", b"another ", b"mapping"])
        .unwrap());
    let mut out = BytesMut::new();
    assert_eq!(consumer.try_pop(&mut out).unwrap(), Some(FIRST | LAST));
    assert_eq!(&out[..], b"through another mapping");
}

// ---- across processes ----------------------------------------------------------------------

/// Kills the child if the test fails before reaping it.
struct ChildGuard(Option<std::process::Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The child side of `echo_through_a_child_process`; does nothing in a normal test run.
#[test]
fn child_echo() {
    let Ok(fds) = std::env::var(CHILD_ENV) else {
        return;
    };
    let fds: Vec<RawFd> = fds.split(',').map(|fd| fd.parse().unwrap()).collect();
    let [inbound_fd, outbound_fd] = fds[..] else {
        panic!("{CHILD_ENV} names {fds:?}, not two descriptors");
    };
    for fd in [inbound_fd, outbound_fd] {
        let link = std::fs::symlink_metadata(format!("/proc/self/fd/{fd}"));
        assert!(link.is_ok(), "fd {fd} not inherited");
    }
    // SAFETY: the parent kept the two memfds open across exec at these numbers (it cleared
    // their close-on-exec flags in the child), and nothing in this process opened or owns
    // them.
    let (inbound, outbound) = unsafe {
        (
            OwnedFd::from_raw_fd(inbound_fd),
            OwnedFd::from_raw_fd(outbound_fd),
        )
    };
    let mut consumer = Consumer::new(Arc::new(Segment::open(inbound).unwrap()), false).unwrap();
    let mut producer = Producer::new(Arc::new(Segment::open(outbound).unwrap()), false).unwrap();
    let mut out = BytesMut::new();
    let mut echoed = 0;
    while let Some(message) = recv(&mut consumer, &mut out, 100) {
        send(&mut producer, &[&message], 100);
        echoed += 1;
    }
    producer.close();
    assert_eq!(echoed, CHILD_MESSAGES);
}

#[test]
fn echo_through_a_child_process() {
    let to_child = create_ring("to-child", SMALL_RING).unwrap();
    let from_child = create_ring("from-child", SMALL_RING).unwrap();
    let (inbound_fd, outbound_fd) = (to_child.fd().as_raw_fd(), from_child.fd().as_raw_fd());
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "child_echo", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{inbound_fd},{outbound_fd}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the forked child before exec and only clears close-on-exec
    // on the two segment descriptors with fcntl(F_SETFD), a plain system call through rustix:
    // async-signal-safe, no allocation, no lock. Both are open there: `to_child` and
    // `from_child` outlive `spawn`, and fork copied the descriptor table. The flag changes in
    // the child's table only, so exactly these two survive its exec.
    unsafe {
        command.pre_exec(move || {
            for fd in [inbound_fd, outbound_fd] {
                rustix::io::fcntl_setfd(BorrowedFd::borrow_raw(fd), rustix::io::FdFlags::empty())?;
            }
            Ok(())
        });
    }
    let mut guard = ChildGuard(Some(command.spawn().unwrap()));

    let mut producer = Producer::new(to_child, false).unwrap();
    let mut consumer = Consumer::new(from_child, false).unwrap();
    let all = Arc::new(messages(42, CHILD_MESSAGES, producer.max_record()));
    let sent = Arc::clone(&all);
    let writer = std::thread::spawn(move || {
        let mut rng = StdRng::seed_from_u64(43);
        for message in sent.iter() {
            send(&mut producer, &split_parts(message, &mut rng), 100);
        }
        producer.close();
    });
    let mut out = BytesMut::new();
    for (i, expected) in all.iter().enumerate() {
        let got = recv(&mut consumer, &mut out, 100).expect("child closed early");
        assert!(got[..] == expected[..], "echo {i} differs");
    }
    assert_eq!(
        recv(&mut consumer, &mut out, 100),
        None,
        "child closes after the last echo"
    );
    writer.join().unwrap();
    let output = guard.0.take().unwrap().wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "child failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("1 passed"));
}

// ---- measurement ---------------------------------------------------------------------------

/// Round-trip latency and one-way throughput; run with
/// `cargo test --release -p van-ipc --test ring -- --ignored --nocapture measure`.
#[test]
#[ignore = "a measurement, not a test"]
fn measure() {
    const SPINS: u32 = 20_000;
    let (_a, mut ping_tx, mut ping_rx) = pair(van_ipc::ring::DEFAULT_RING_BYTES);
    let (_b, mut pong_tx, mut pong_rx) = pair(van_ipc::ring::DEFAULT_RING_BYTES);
    let echo = std::thread::spawn(move || {
        let mut out = BytesMut::new();
        while let Some(message) = recv(&mut ping_rx, &mut out, SPINS) {
            send(&mut pong_tx, &[&message], SPINS);
        }
    });
    let mut out = BytesMut::new();
    let small = [7u8; 64];
    let rounds = 100_000;
    let start = Instant::now();
    for _ in 0..rounds {
        send(&mut ping_tx, &[&small], SPINS);
        recv(&mut pong_rx, &mut out, SPINS).unwrap();
    }
    let rtt = start.elapsed() / rounds;
    ping_tx.close();
    echo.join().unwrap();
    println!("64 B round trip: {rtt:?}");

    for size in [1usize << 20, 4 << 20] {
        let (_s, mut tx, mut rx) = pair(van_ipc::ring::DEFAULT_RING_BYTES);
        let count = (1usize << 30) / size;
        let payload = vec![1u8; size];
        let reader = std::thread::spawn(move || {
            let mut out = BytesMut::new();
            let mut n = 0;
            while recv(&mut rx, &mut out, SPINS).is_some() {
                n += 1;
            }
            n
        });
        let start = Instant::now();
        for _ in 0..count {
            send(&mut tx, &[&payload], SPINS);
        }
        tx.close();
        assert_eq!(reader.join().unwrap(), count);
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{} KiB messages: {:.1} GB/s",
            size >> 10,
            (count * size) as f64 / secs / 1e9
        );
    }
}
