//! An orderly stop loses nothing it flushed, even while the peer reads slowly and its own
//! frames are still arriving unread: closing a TCP socket with unread input makes Linux reset the connection and drop
//! what its send queue still holds, so a stream van must wait for its data to be acknowledged
//! before it closes.

use std::time::Duration;

use super::{check_numbered, connect, expect_message, numbered, send, start, within, WAIT};
use crate::van::{Event, Van};

/// A sends `FRAMES` frames of 64 KiB to B and stops (flushing) while B floods A, whose inbox
/// nobody reads (so A's socket holds unread input when it closes). B must receive every one
/// of A's frames, in order, before it learns A is gone.
pub async fn flushed_frames_survive_unread_input<V: Van + 'static>(make: &impl Fn() -> V) {
    const FRAMES: u32 = 1500;
    const LEN: usize = 64 << 10;
    let a = start(make, 9).await;
    let mut b = start(make, 8).await;
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
