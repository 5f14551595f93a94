//! Garbage on a stream van's socket: peers that write bad bytes to a real socket get their
//! connection closed with a typed, descriptive reason, while the van keeps serving its healthy
//! peers. One line in a stream van's tests runs both checks:
//!
//! ```ignore
//! van_core::stream_van_garbage_tests! {
//!     make: |limits| my_van::MyVan::new(my_van::Options { limits, ..Default::default() }),
//!     kind: van_core::VanKind::Tcp,
//!     connected: |van: &my_van::MyVan| van.connected_peers(),
//! }
//! ```

use std::net::SocketAddr;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{check_numbered, connect, numbered, start, Peer, WAIT};
use crate::message::{Message, NodeId};
use crate::van::{Event, Van, VanKind};
use crate::wire::{self, Limits, HEADER_LEN, MAGIC, VERSION};

/// Generates the garbage checks for a stream van: `make` builds a van from [`Limits`],
/// `kind` is its [`VanKind`], `connected` lists the peers it holds a connection to.
#[macro_export]
macro_rules! stream_van_garbage_tests {
    (make: $make:expr, kind: $kind:expr, connected: $connected:expr $(,)?) => {
        #[test]
        fn garbage_closes_only_the_bad_connection() {
            let make = $make;
            $crate::testkit::run(
                $crate::testkit::garbage::garbage_closes_only_the_bad_connection(
                    &|| make($crate::wire::Limits::default()),
                    $kind,
                    $connected,
                ),
            );
        }

        #[test]
        fn huge_declared_length_is_rejected_before_allocation() {
            let make = $make;
            $crate::testkit::run(
                $crate::testkit::garbage::huge_declared_length_is_rejected_before_allocation(
                    &|| {
                        make($crate::wire::Limits {
                            max_frame: 1 << 40,
                            ..$crate::wire::Limits::default()
                        })
                    },
                ),
            );
        }
    };
}

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

pub(super) fn valid_frame() -> Vec<u8> {
    let msg = Message::to(8, vec![Bytes::from(vec![7u8; 1000])]);
    wire::encode_to_vec(&msg, &Limits::default())
        .unwrap_or_else(|e| panic!("cannot encode a valid frame: {e}"))
}

/// 4 KiB of deterministic pseudo-random bytes (xorshift), not starting with the magic.
fn random_bytes() -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut random: Vec<u8> = (0..4096)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    random[..4].copy_from_slice(b"\x00\x01\x02\x03");
    random
}

/// Each kind of bad input, and the words the van's error must contain.
fn garbage() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let frame = valid_frame();
    let mut bad_meta = header(VERSION, 64, 32, 0);
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
        (
            "length 2^60",
            header(VERSION, 1 << 60, 0, 0),
            "exceeds the limit",
        ),
        (
            "truncated frame",
            frame[..frame.len() / 2].to_vec(),
            "truncated",
        ),
        ("random bytes", random_bytes(), "bad magic"),
        // Fewer bytes than a header: refused at once, not held until 32 bytes arrive.
        ("three bytes", b"GET".to_vec(), "bad magic"),
        ("garbage meta", bad_meta, "bad frame"),
    ]
}

/// Where a stream van listens, from its announced endpoint.
pub(super) fn address<V>(peer: &Peer<V>) -> SocketAddr {
    let endpoint = peer
        .node
        .endpoints
        .first()
        .unwrap_or_else(|| panic!("{} announced no endpoint", peer.node));
    endpoint
        .address
        .parse()
        .unwrap_or_else(|e| panic!("endpoint {} is not host:port: {e}", endpoint.address))
}

async fn dial<V>(peer: &Peer<V>) -> TcpStream {
    TcpStream::connect(address(peer))
        .await
        .unwrap_or_else(|e| panic!("cannot dial {}: {e}", peer.node))
}

/// Reads from `socket` until the van closes it; fails if it stays open.
pub(super) async fn expect_closed(socket: &mut TcpStream, what: &str) {
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
async fn next_message<V>(peer: &mut Peer<V>, kind: VanKind, lost: &mut Vec<String>) -> Message {
    loop {
        match tokio::time::timeout(WAIT, peer.inbox.recv()).await {
            Ok(Some(Event::Message(msg))) => return msg,
            Ok(Some(Event::PeerLost(l))) => {
                assert_eq!(l.kind, kind);
                lost.push(l.reason)
            }
            Ok(None) => panic!("inbox ended"),
            Err(_) => panic!("no message within {WAIT:?}"),
        }
    }
}

/// Every kind of garbage, each on its own connection: the connection is closed, the reason
/// names the fault, and two healthy peers still exchange messages both ways after each.
pub async fn garbage_closes_only_the_bad_connection<V: Van + 'static>(
    make: &impl Fn() -> V,
    kind: VanKind,
    connected: impl Fn(&V) -> Vec<NodeId>,
) {
    let mut a = start(make, 9).await;
    let mut b = start(make, 8).await;
    connect(&a, &b).await;
    connect(&b, &a).await;

    for (seq, (what, bytes, expected)) in (0u32..).zip(garbage()) {
        let mut socket = dial(&b).await;
        socket
            .write_all(&bytes)
            .await
            .unwrap_or_else(|e| panic!("{what}: write: {e}"));
        if what == "truncated frame" {
            socket
                .shutdown()
                .await
                .unwrap_or_else(|e| panic!("{what}: shutdown: {e}"));
        }
        expect_closed(&mut socket, what).await;

        // Both directions between the healthy peers still work.
        super::send(&*a.van, numbered(9, 8, seq, 100)).await;
        let mut lost = Vec::new();
        check_numbered(&next_message(&mut b, kind, &mut lost).await, 9, seq);
        super::send(&*b.van, numbered(8, 9, seq, 100)).await;
        check_numbered(&next_message(&mut a, kind, &mut Vec::new()).await, 8, seq);

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
    assert_eq!(connected(&b.van), vec![9]);
}

/// A frame within the limit but far larger than what is sent: the van must wait for bytes,
/// not allocate the declared size, and report truncation when the peer hangs up. `make`
/// builds a van whose frame limit is at least 2^40.
pub async fn huge_declared_length_is_rejected_before_allocation<V: Van + 'static>(
    make: &impl Fn() -> V,
) {
    let mut b = start(make, 8).await;
    let mut socket = dial(&b).await;
    let mut bytes = header(VERSION, 1 << 39, 0, 0);
    bytes.extend_from_slice(&[0u8; 4096]);
    socket
        .write_all(&bytes)
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    socket
        .shutdown()
        .await
        .unwrap_or_else(|e| panic!("shutdown: {e}"));
    expect_closed(&mut socket, "huge declared length").await;
    match tokio::time::timeout(WAIT, b.inbox.recv()).await {
        Ok(Some(Event::PeerLost(l))) => assert!(l.reason.contains("truncated"), "{}", l.reason),
        other => panic!("expected a lost-peer event, got {other:?}"),
    }
}
