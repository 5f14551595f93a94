//! Frames over real loopback sockets.

use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::peer::{Data, Head, Peer, Target};
use super::{Links, Mesh};
use crate::comm::p2p::{Op, OpKind};
use crate::spin::Spin;

fn pair() -> (Peer, Peer) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    (
        super::form::ready(a).unwrap(),
        super::form::ready(b).unwrap(),
    )
}

fn head(number: u64, len: usize) -> Head {
    Head {
        number,
        hop: 1,
        slice: 2,
        kind: 0,
        tag: 3,
        total: 99,
        len: len as u64,
    }
}

#[test]
fn frames_cross_in_order_whatever_their_size() {
    let (mut a, mut b) = pair();
    let sizes = [0usize, 1, 40, 4096, 3 << 20];
    let mut got = Vec::new();
    let mut sent = 0;
    for (i, &size) in sizes.iter().enumerate() {
        let payload: Vec<u8> = (0..size).map(|k| (k * 7 + i) as u8).collect();
        a.send(
            &head(i as u64, size),
            Data::Owned(Bytes::from(payload)),
            |_| panic!("owned bytes are queued as they are"),
        )
        .unwrap();
    }
    // Both sides progress without blocking until every frame arrived.
    let start = std::time::Instant::now();
    while got.len() < sizes.len() {
        a.flush().unwrap();
        b.read(4 << 20, &mut Vec::new, None, |h, data| {
            got.push((h, data.unwrap()))
        })
        .unwrap();
        assert!(
            start.elapsed().as_secs() < 30,
            "frames stuck: {} of {}",
            got.len(),
            sizes.len()
        );
        sent += 1;
    }
    assert!(sent > 0);
    for (i, (h, data)) in got.iter().enumerate() {
        assert_eq!(*h, head(i as u64, sizes[i]));
        assert!(data
            .iter()
            .enumerate()
            .all(|(k, &v)| v == (k * 7 + i) as u8));
    }
}

#[test]
fn a_frame_longer_than_allowed_or_a_closed_peer_is_an_error() {
    let (mut a, mut b) = pair();
    a.send(
        &head(1, 1000),
        Data::Borrowed(&[0u8; 1000]),
        Bytes::copy_from_slice,
    )
    .unwrap();
    while a.flush().unwrap() {}
    let start = std::time::Instant::now();
    let err = loop {
        match b.read(999, &mut Vec::new, None, |_, _| {
            panic!("delivered an over-long frame")
        }) {
            Ok(_) => assert!(start.elapsed().as_secs() < 10),
            Err(e) => break e,
        }
    };
    assert!(err.to_string().contains("at most 999"), "{err}");
    let (c, mut d) = pair();
    drop(c);
    let start = std::time::Instant::now();
    let err = loop {
        match d.read(100, &mut Vec::new, None, |_, _| {}) {
            Ok(_) => assert!(start.elapsed().as_secs() < 10),
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
}

#[test]
fn borrowed_bytes_the_socket_cannot_take_at_once_are_copied_before_send_returns() {
    let (mut a, mut b) = pair();
    // Larger than a loopback socket takes without its reader (a few MiB at most).
    let size = 16 << 20;
    let pattern = |frame: usize, k: usize| (k * 13 + frame * 5) as u8;
    let mut copied = Vec::new();
    for frame in 0..2 {
        let mut source: Vec<u8> = (0..size).map(|k| pattern(frame, k)).collect();
        a.send(&head(frame as u64, size), Data::Borrowed(&source), |rest| {
            copied.push(rest.len());
            Bytes::copy_from_slice(rest)
        })
        .unwrap();
        // The caller may reuse its buffer at once: what the peer reads must not change.
        source.fill(0xee);
    }
    // The first frame went partly straight from the caller's memory; the second, queued
    // behind it, was copied whole.
    assert_eq!(copied.len(), 2, "{copied:?}");
    assert!(copied[0] > 0 && copied[0] < size, "{copied:?}");
    assert_eq!(copied[1], size);
    let mut got = Vec::new();
    let mut fresh = 0;
    let start = std::time::Instant::now();
    while got.len() < 2 {
        a.flush().unwrap();
        let mut take = || {
            fresh += 1;
            Vec::new()
        };
        b.read(size, &mut take, None, |h, data| {
            got.push((h, data.unwrap()))
        })
        .unwrap();
        assert!(start.elapsed().as_secs() < 30, "frames stuck");
    }
    assert_eq!(fresh, 2, "one buffer per frame from the pool");
    for (frame, (h, data)) in got.iter().enumerate() {
        assert_eq!(*h, head(frame as u64, size));
        assert_eq!(data.len(), size);
        let wrong = data
            .iter()
            .enumerate()
            .position(|(k, &v)| v != pattern(frame, k));
        assert_eq!(wrong, None, "frame {frame} differs");
    }
    assert!(!a.has_output());
}

#[test]
fn the_awaited_frame_lands_in_the_receivers_memory_and_others_in_buffers() {
    let (mut a, mut b) = pair();
    let size = 3 << 20;
    let payload =
        |number: u64| -> Vec<u8> { (0..size).map(|k| (k as u64 * 3 + number) as u8).collect() };
    // Frame 1 before the awaited frame 2; frame 3 after it has the same hop and slice
    // but another number.
    for number in [1, 2, 3] {
        let data = Bytes::from(payload(number));
        a.send(&head(number, size), Data::Owned(data), |_| unreachable!())
            .unwrap();
    }
    let mut memory = vec![0u8; size];
    let mut target = Target {
        head: head(2, size),
        buf: &mut memory,
    };
    let (mut buffered, mut landed) = (Vec::new(), Vec::new());
    let start = std::time::Instant::now();
    while buffered.len() + landed.len() < 3 {
        a.flush().unwrap();
        b.read(
            size,
            &mut Vec::new,
            Some(&mut target),
            |h, data| match data {
                Some(data) => buffered.push((h.number, data)),
                None => landed.push(h.number),
            },
        )
        .unwrap();
        assert!(start.elapsed().as_secs() < 30, "frames stuck");
    }
    assert_eq!(landed, [2]);
    assert_eq!(buffered.len(), 2);
    assert_eq!(buffered[0], (1, payload(1)));
    assert_eq!(buffered[1], (3, payload(3)));
    assert!(memory == payload(2), "the landed frame differs");
    assert!(!b.landing());
    // A frame whose header differs from the target's in anything (here its length, then
    // its element tag) does not land: it comes in a buffer, and the memory stays as it was.
    let mut other_tag = head(5, 100);
    other_tag.tag += 1;
    for (sent, expected) in [(head(4, 100), head(4, 99)), (other_tag, head(5, 100))] {
        a.send(&sent, Data::Borrowed(&[7; 100]), Bytes::copy_from_slice)
            .unwrap();
        let mut memory = vec![0u8; expected.len as usize];
        let mut target = Target {
            head: expected,
            buf: &mut memory,
        };
        let mut got = None;
        while got.is_none() {
            b.read(size, &mut Vec::new, Some(&mut target), |_, data| {
                got = Some(data)
            })
            .unwrap();
            assert!(start.elapsed().as_secs() < 30, "frame stuck");
        }
        assert_eq!(got, Some(Some(vec![7; 100])));
        assert!(memory.iter().all(|&v| v == 0));
    }
}

#[test]
fn headers_round_trip() {
    let h = Head {
        number: u64::MAX - 3,
        hop: 7,
        slice: u32::MAX,
        kind: 5,
        tag: 6,
        total: 1 << 40,
        len: 12345,
    };
    assert_eq!(Head::decode(&h.encode()), h);
}

/// Rank `me` of two, its one connection `stream` to the other.
fn mesh(me: usize, stream: TcpStream, max_payload: usize) -> Mesh {
    let watch = vec![(1 - me, stream.try_clone().unwrap())];
    let mut peers = vec![None, None];
    peers[1 - me] = Some(super::form::ready(stream).unwrap());
    Mesh {
        members: vec![10, 11],
        generation: 1,
        spin: Spin::Busy(Duration::from_micros(50)),
        max_payload,
        pool: Arc::default(),
        links: Mutex::new(Links {
            peers,
            early: HashMap::new(),
        }),
        watch,
    }
}

/// Collective `number` of two ranks, `total` bytes, as rank `rank`.
fn op(number: u64, rank: usize, total: usize) -> Op {
    Op {
        kind: OpKind::AllReduce,
        generation: 1,
        members: vec![10, 11],
        ranks: vec![0, 1],
        rank,
        number,
        tag: 7,
        total,
        bytes: total,
        shm_ticket: None,
        hosts: None,
    }
}

#[test]
fn concurrent_collectives_land_their_own_frames_and_nothing_else() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    let slice = 512 << 10;
    let (sender, receiver) = (Arc::new(mesh(0, a, slice)), Arc::new(mesh(1, b, slice)));
    let (collectives, slices) = (4u64, 6);
    let total = slice * slices;
    let value = |number: u64, k: usize| (k as u64 * 31 + number * 7) as u8;
    let deadline = Instant::now() + Duration::from_secs(60);
    // Each collective on a thread of its own on both ranks, as the embedded API runs them;
    // odd collectives receive into their buffers, even ones take the frames' buffers.
    let senders: Vec<_> = (1..=collectives)
        .map(|number| {
            let sender = Arc::clone(&sender);
            std::thread::spawn(move || {
                let op = op(number, 0, total);
                let data: Vec<u8> = (0..total).map(|k| value(number, k)).collect();
                for (s, part) in data.chunks(slice).enumerate() {
                    sender.send(&op, 1, 0, s, Data::Borrowed(part)).unwrap();
                }
                sender.flush(deadline, &|| Ok(())).unwrap();
            })
        })
        .collect();
    let receivers: Vec<_> = (1..=collectives)
        .map(|number| {
            let receiver = Arc::clone(&receiver);
            std::thread::spawn(move || {
                let op = op(number, 1, total);
                let mut got = vec![0u8; total];
                for (s, part) in got.chunks_mut(slice).enumerate() {
                    let len = part.len();
                    let into = (number % 2 == 1).then_some(&mut *part);
                    let came = receiver.recv(&op, 0, (0, s, len), into, deadline, &|| Ok(()));
                    if let Some(data) = came.unwrap() {
                        part.copy_from_slice(&data);
                    }
                }
                (number, got)
            })
        })
        .collect();
    for t in senders {
        t.join().unwrap();
    }
    for t in receivers {
        let (number, got) = t.join().unwrap();
        let wrong = got
            .iter()
            .enumerate()
            .position(|(k, &v)| v != value(number, k));
        assert_eq!(wrong, None, "collective #{number} differs");
    }
    let links = receiver.lock();
    assert!(links.early.is_empty(), "frames left over");
    assert!(links
        .peers
        .iter()
        .flatten()
        .all(|p| !p.landing() && p.broken.is_none()));
}

#[test]
fn shutting_a_mesh_ends_a_landing_frame_without_waiting_for_its_lock() {
    use std::io::Write;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut raw = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    let total = 1 << 20;
    let receiver = Arc::new(mesh(1, b, total));
    // Half a frame: the receiver lands it and holds the mesh for the rest.
    let head = Head {
        number: 1,
        hop: 0,
        slice: 0,
        kind: OpKind::AllReduce as i32,
        tag: 7,
        total: total as u64,
        len: total as u64,
    };
    raw.write_all(&head.encode()).unwrap();
    raw.write_all(&vec![1u8; total / 2]).unwrap();
    let landing = {
        let receiver = Arc::clone(&receiver);
        std::thread::spawn(move || {
            let mut memory = vec![0u8; total];
            let deadline = Instant::now() + Duration::from_secs(60);
            let into = Some(&mut memory[..]);
            let op = op(1, 1, total);
            receiver
                .recv(&op, 0, (0, 0, total), into, deadline, &|| Ok(()))
                .map(|_| ())
        })
    };
    let start = Instant::now();
    while receiver.links.try_lock().is_ok() {
        assert!(start.elapsed() < Duration::from_secs(10), "never landing");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The generation ends (as `Shared::changed` shuts it, holding the generation's lock,
    // which the landing call asks between its sleeps): the shut must not wait for the frame.
    let shut = Instant::now();
    receiver.shut();
    assert!(
        shut.elapsed() < Duration::from_secs(5),
        "shut waited for the lock"
    );
    let err = landing.join().unwrap().unwrap_err();
    assert!(
        matches!(err, crate::CollectiveError::RankFailed { rank: 0, .. }),
        "{err}"
    );
    drop(raw);
}

#[test]
fn a_rank_that_runs_something_else_as_the_same_call_is_a_mismatch() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    let (sender, receiver) = (mesh(0, a, 4096), mesh(1, b, 4096));
    let hier = crate::comm::p2p::HIER_OP;
    // What rank 0 sends as call #5, call #6 and call #7 (its 4096 bytes as one slice).
    let mut gather = op(5, 0, 4096);
    gather.kind = OpKind::AllGather;
    let longer = op(hier | 6, 0, 8192);
    let next = op(8, 0, 4096);
    for sent in [&gather, &longer, &next] {
        sender
            .send(sent, 1, 0, 0, Data::Borrowed(&[1u8; 4096]))
            .unwrap();
    }
    sender
        .flush(Instant::now() + Duration::from_secs(10), &|| Ok(()))
        .unwrap();
    let wait = |number: u64, millis: u64| {
        let started = Instant::now();
        let deadline = started + Duration::from_millis(millis);
        let mut into = vec![0u8; 4096];
        let got = receiver.recv(
            &op(number, 1, 4096),
            0,
            (0, 0, 4096),
            Some(&mut into),
            deadline,
            &|| Ok(()),
        );
        (got, started.elapsed())
    };
    // Rank 1 runs call #5 as a hierarchical all-reduce's exchange: rank 0's all-gather is
    // named at once, not after the timeout.
    match wait(hier | 5, 30_000) {
        (Err(crate::CollectiveError::Mismatch { rank, reason, .. }), took) => {
            assert_eq!(rank, 0);
            assert!(reason.contains("all_gather of 4096"), "{reason}");
            assert!(reason.contains("hierarchical"), "{reason}");
            assert!(took < Duration::from_secs(5), "{took:?}");
        }
        (other, _) => panic!("expected a mismatch, got {other:?}"),
    }
    // Call #6 between hosts with another length, where this rank runs it among all ranks.
    match wait(6, 30_000) {
        (Err(crate::CollectiveError::Mismatch { reason, .. }), _) => {
            assert!(reason.contains("of 8192 elements"), "{reason}");
        }
        (other, _) => panic!("expected a mismatch, got {other:?}"),
    }
    // A frame of a later call is no mismatch: call #7 waits out its deadline.
    assert!(matches!(
        wait(7, 200).0,
        Err(crate::CollectiveError::RankFailed { rank: 0, .. })
    ));
}
