//! Frames over real loopback sockets.

use std::net::{TcpListener, TcpStream};

use bytes::Bytes;

use super::peer::{Data, Head, Peer};

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
        b.read(4 << 20, &mut Vec::new, |h, data| got.push((h, data)))
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
        match b.read(999, &mut Vec::new, |_, _| {
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
        match d.read(100, &mut Vec::new, |_, _| {}) {
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
        b.read(size, &mut take, |h, data| got.push((h, data)))
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
