//! Peers that write garbage to a real socket get their connection closed with a typed error,
//! while the van keeps serving its healthy peers.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use van_core::testkit::{self, check_numbered, numbered, Peer};
use van_core::wire::{self, Limits, HEADER_LEN, MAGIC};
use van_core::{Event, Message, Van, VanKind};
use van_uring::{IoUringVan, UringOptions};

const WAIT: Duration = Duration::from_secs(30);

fn header(version: u16, frame_len: u64, meta_len: u32, segments: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_LEN);
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&version.to_le_bytes());
    h.extend_from_slice(&0u16.to_le_bytes());
    h.extend_from_slice(&frame_len.to_le_bytes());
    h.extend_from_slice(&meta_len.to_le_bytes());
    h.extend_from_slice(&segments.to_le_bytes());
    h.extend_from_slice(&[0; 8]);
    h
}

fn valid_frame() -> Vec<u8> {
    let msg = Message::to(8, vec![Bytes::from(vec![7u8; 1000])]);
    wire::encode_to_vec(&msg, &Limits::default()).unwrap()
}

/// Each kind of bad input, and the words the van's error must contain.
fn garbage() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let mut random = vec![0u8; 4096];
    rand::rngs::StdRng::seed_from_u64(7).fill(&mut random[..]);
    random[..4].copy_from_slice(b"\x00\x01\x02\x03");
    let frame = valid_frame();
    let mut bad_meta = header(1, 64, 32, 0);
    bad_meta.extend_from_slice(&[0xff; 32]);
    vec![
        (
            "bad magic",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\0\0\0\0\0".to_vec(),
            "bad magic",
        ),
        (
            "bad version",
            header(99, 32, 0, 0),
            "unsupported wire version 99",
        ),
        ("length 2^60", header(1, 1 << 60, 0, 0), "exceeds the limit"),
        (
            "truncated frame",
            frame[..frame.len() / 2].to_vec(),
            "truncated",
        ),
        ("random bytes", random, "bad magic"),
        ("garbage meta", bad_meta, "bad frame"),
    ]
}

/// Reads from `socket` until the van closes it; fails if it stays open.
async fn expect_closed(socket: &mut TcpStream, what: &str) {
    let mut buf = [0u8; 256];
    let result = tokio::time::timeout(WAIT, async {
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(result.is_ok(), "{what}: the van kept the connection open");
}

/// The next message in `peer`'s inbox, collecting the reasons of lost peers on the way.
async fn next_message(peer: &mut Peer<IoUringVan>, lost: &mut Vec<String>) -> Message {
    loop {
        match tokio::time::timeout(WAIT, peer.inbox.recv()).await {
            Ok(Some(Event::Message(msg))) => return msg,
            Ok(Some(Event::PeerLost(l))) => {
                assert_eq!(l.kind, VanKind::Uring);
                lost.push(l.reason)
            }
            Ok(None) => panic!("inbox ended"),
            Err(_) => panic!("no message within {WAIT:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_closes_only_the_bad_connection() {
    let make = || IoUringVan::new(UringOptions::default()).unwrap();
    let mut a = testkit::start(&make, 9).await;
    let mut b = testkit::start(&make, 8).await;
    testkit::connect(&a, &b).await;
    testkit::connect(&b, &a).await;
    let b_addr = b.van.local_addr().unwrap();

    for (seq, (what, bytes, expected)) in (0u32..).zip(garbage()) {
        let mut socket = TcpStream::connect(b_addr).await.unwrap();
        socket.write_all(&bytes).await.unwrap();
        if what == "truncated frame" {
            socket.shutdown().await.unwrap();
        }
        expect_closed(&mut socket, what).await;

        // Both directions between the healthy peers still work.
        a.van.send(numbered(9, 8, seq, 100)).await.unwrap();
        let mut lost = Vec::new();
        check_numbered(&next_message(&mut b, &mut lost).await, 9, seq);
        b.van.send(numbered(8, 9, seq, 100)).await.unwrap();
        check_numbered(&next_message(&mut a, &mut Vec::new()).await, 8, seq);

        // The bad connection was reported with a typed, descriptive reason.
        if lost.is_empty() {
            // The event may trail the healthy message; wait for it.
            match tokio::time::timeout(WAIT, b.inbox.recv()).await {
                Ok(Some(Event::PeerLost(l))) => lost.push(l.reason),
                other => panic!("{what}: expected a lost-peer event, got {other:?}"),
            }
        }
        assert_eq!(lost.len(), 1, "{what}: {lost:?}");
        assert!(
            lost[0].contains(expected),
            "{what}: reason `{}` does not mention `{expected}`",
            lost[0]
        );
    }
    assert_eq!(b.van.connected_peers(), vec![9]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_declared_length_is_rejected_before_allocation() {
    // A frame within the limit but far larger than what is sent: the van must wait for bytes,
    // not allocate the declared size, and report truncation when the peer hangs up.
    let make = || {
        IoUringVan::new(UringOptions {
            limits: Limits {
                max_frame: 1 << 40,
                ..Limits::default()
            },
            ..UringOptions::default()
        })
        .unwrap()
    };
    let mut b = testkit::start(&make, 8).await;
    let mut socket = TcpStream::connect(b.van.local_addr().unwrap())
        .await
        .unwrap();
    let mut bytes = header(1, 1 << 39, 0, 0);
    bytes.extend_from_slice(&[0u8; 4096]);
    socket.write_all(&bytes).await.unwrap();
    socket.shutdown().await.unwrap();
    expect_closed(&mut socket, "huge declared length").await;
    match tokio::time::timeout(WAIT, b.inbox.recv()).await {
        Ok(Some(Event::PeerLost(l))) => assert!(l.reason.contains("truncated"), "{}", l.reason),
        other => panic!("expected a lost-peer event, got {other:?}"),
    }
}
