//! An orderly stop loses nothing it flushed, even while the peer reads slowly and its own
//! frames are still arriving unread: closing a TCP socket with unread input makes Linux reset the connection and drop
//! what its send queue still holds, so a stream van must wait for its data to be acknowledged
//! before it closes.

use std::time::Duration;

use super::{check_numbered, connect, expect_message, numbered, send, start, within, WAIT};
use crate::van::{Event, Van};

/// A (made by `make`) sends `FRAMES` frames of 64 KiB to B (made by `make_reader`) and stops
/// (flushing) while B floods A, whose inbox nobody reads (so A's socket holds unread input
/// when it closes). B must receive every one of A's frames, in order, before it learns A is
/// gone.
///
/// The check bites only if A's kernel still holds unsent frames when A has written its last
/// one: B must stop reading its socket while its inbox is full, as the TCP van does. A van
/// that reads everything into memory at once (the io_uring van's batches can hold thousands of
/// frames) is tested as A with a TCP van as B.
pub async fn flushed_frames_survive_unread_input<V: Van + 'static, R: Van + 'static>(
    make: &impl Fn() -> V,
    make_reader: &impl Fn() -> R,
) {
    const FRAMES: u32 = 1500;
    const LEN: usize = 64 << 10;
    let a = start(make, 9).await;
    let mut b = start(make_reader, 8).await;
    // A van of another kind dials B at its node's primary port (B's stream endpoint), as in a
    // cluster whose nodes run different stream vans.
    b.node.port = super::garbage::address(&b).port();
    connect(&a, &b).await;
    send(&*a.van, numbered(9, 8, 0, LEN)).await;
    check_numbered(&expect_message(&mut b.inbox).await, 9, 0);
    // B floods A until the test ends; A never reads its inbox.
    let flood_van = b.van.clone();
    let flood = tokio::spawn(async move {
        let mut seq = 0;
        loop {
            seq += 1;
            if flood_van.send(numbered(8, 9, seq, LEN)).await.is_err() {
                return;
            }
        }
    });
    // B reads what A sends while A sends it.
    let mut inbox = b.inbox;
    let receiver = tokio::spawn(async move {
        let mut next = 1;
        while next < FRAMES {
            match tokio::time::timeout(WAIT, inbox.recv()).await {
                Ok(Some(Event::Message(msg))) => {
                    assert_eq!(msg.meta.request_id, next as i32, "out of order");
                    next += 1;
                    // A slow reader: A's last frames wait in its kernel send queue when it
                    // has flushed and stops.
                    tokio::time::sleep(Duration::from_micros(300)).await;
                }
                Ok(Some(Event::PeerLost(lost))) => {
                    return Err(format!(
                        "A's connection ended after {next} of {FRAMES} frames ({}): flushed \
                         frames were lost",
                        lost.reason
                    ))
                }
                other => return Err(format!("after {next} of {FRAMES} frames: {other:?}")),
            }
        }
        Ok(())
    });
    for seq in 1..FRAMES {
        send(&*a.van, numbered(9, 8, seq, LEN)).await;
    }
    within(a.van.stop(), "stop").await;
    match receiver.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{e}"),
        Err(e) => panic!("receiver: {e}"),
    }
    flood.abort();
    let _ = tokio::time::timeout(Duration::from_secs(1), flood).await;
}

/// A peer writes numbered frames until the van stops taking them (its inbox, which nobody
/// reads, is full), then resets the connection. The frames the van's kernel had acknowledged
/// are in its socket and must all reach the inbox, in order, before the peer is reported lost.
pub async fn received_frames_survive_a_reset<V: Van + 'static>(make: &impl Fn() -> V) {
    frames_before_a_reset(make, false).await;
}

/// As [`received_frames_survive_a_reset`], but the van writes to the peer after the reset, so
/// its write fails before it has read what the peer sent: a failed write ends the writing,
/// not the reading.
pub async fn received_frames_survive_a_failed_write<V: Van + 'static>(make: &impl Fn() -> V) {
    frames_before_a_reset(make, true).await;
}

async fn frames_before_a_reset<V: Van + 'static>(make: &impl Fn() -> V, write_after: bool) {
    use tokio::io::AsyncWriteExt;
    const LEN: usize = 4 << 10;
    /// The peer stops writing after this much whether or not the van pushed back.
    const CAP: usize = 64 << 20;
    let mut v = start(make, 8).await;
    let mut peer = tokio::net::TcpStream::connect(super::garbage::address(&v))
        .await
        .unwrap_or_else(|e| panic!("connect to the van: {e}"));
    let frame = |seq: u32| {
        crate::wire::encode_to_vec(&numbered(9, 8, seq, LEN), &crate::wire::Limits::default())
            .unwrap_or_else(|e| panic!("encode: {e}"))
    };
    // The first frame tells the van who is on the connection.
    peer.write_all(&frame(0))
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    check_numbered(&expect_message(&mut v.inbox).await, 9, 0);
    // Write until the van stops taking bytes for half a second.
    let (mut written, mut seq) = (0usize, 1u32);
    while written < CAP {
        let bytes = frame(seq);
        match tokio::time::timeout(Duration::from_millis(500), peer.write_all(&bytes)).await {
            Ok(Ok(())) => {
                written += bytes.len();
                seq += 1;
            }
            Ok(Err(e)) => panic!("write: {e}"),
            // A frame may be partly written: only whole acknowledged frames are counted.
            Err(_) => break,
        }
    }
    let unacked = crate::link::stream::unsent_bytes(&peer)
        .unwrap_or_else(|e| panic!("cannot read the peer's send queue: {e}"));
    let acknowledged = (written.saturating_sub(unacked) / frame(1).len()) as u32;
    assert!(
        acknowledged > 0,
        "the van took no frame ({written} bytes written, {unacked} unacknowledged)"
    );
    // Reset the connection (SO_LINGER 0).
    let std_peer = peer.into_std().unwrap_or_else(|e| panic!("into_std: {e}"));
    socket2::SockRef::from(&std_peer)
        .set_linger(Some(Duration::ZERO))
        .unwrap_or_else(|e| panic!("set_linger: {e}"));
    drop(std_peer);
    tokio::time::sleep(Duration::from_millis(100)).await;
    if write_after {
        for seq in 1..=4 {
            // The write may fail here or later in the van; either way the connection is
            // broken.
            let _ = v.van.send(numbered(8, 9, seq, 64 << 10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut next = 1u32;
    loop {
        match tokio::time::timeout(WAIT, v.inbox.recv()).await {
            Ok(Some(Event::Message(msg))) => {
                check_numbered(&msg, 9, next);
                next += 1;
            }
            Ok(Some(Event::PeerLost(lost))) => {
                assert!(
                    next > acknowledged,
                    "the van reported the peer lost ({}) after {} of the {acknowledged} frames \
                     its kernel had acknowledged: received frames were lost",
                    lost.reason,
                    next - 1
                );
                break;
            }
            other => panic!("after {} frames: {other:?}", next - 1),
        }
    }
    within(v.van.stop(), "stop").await;
}
