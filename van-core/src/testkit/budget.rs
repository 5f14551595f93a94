//! The byte-budget check for stream vans: a deep queue of large frames to a peer that reads
//! nothing holds at most the budget ahead of a small frame, and the small frame never waits
//! for the budget.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use crate::message::{Node, Role};
use crate::wire::{self, FrameHeader, Limits, HEADER_LEN};
use crate::Van;

use super::{numbered, start, within};

/// Large frames in the check.
const LARGE: usize = 4 << 20;
/// Large frames the check tries to queue; without a budget all of them are.
const DEPTH: usize = 32;

/// Starts a van from `make(budget)`, connects it to a plain TCP listener that reads nothing,
/// queues `DEPTH` frames of 4 MiB from a task, and checks that at most the budget (plus
/// what the sockets' buffers hold) got queued, that an 8-byte frame sent then is queued at
/// once, and that it reaches the peer behind no more large frames than that.
pub async fn check_peer_budget<V: Van + 'static>(make: impl Fn(usize) -> V, budget: usize) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let port = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("local address: {e}"))
        .port();
    let a = start(&|| make(budget), 9).await;
    let slow = Node::new(Role::Server, "127.0.0.1", port).with_id(8);
    within(a.van.connect(&slow), "connect").await;
    let (mut socket, _) = listener
        .accept()
        .await
        .unwrap_or_else(|e| panic!("accept: {e}"));

    // A deep queue of large frames: each send returns once its frame is queued.
    let queued = Arc::new(AtomicUsize::new(0));
    // One payload for all (made once: building 4 MiB per frame would be the slow part).
    let base = numbered(9, 8, 0, LARGE);
    let senders = {
        let (van, queued) = (Arc::clone(&a.van), Arc::clone(&queued));
        tokio::spawn(async move {
            for seq in 0..DEPTH as i32 {
                let mut frame = base.clone();
                frame.meta.request_id = seq;
                if van.send(frame).await.is_err() {
                    break; // the peer closed, at the end of the check
                }
                queued.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The sockets' buffers hold a few MiB (at most 16 MiB: loopback autotuning); the queue
    // holds at most the budget more.
    let ahead = queued.load(Ordering::SeqCst);
    let bound = (budget + (16 << 20)) / LARGE + 1;
    assert!(
        ahead <= bound,
        "{ahead} large frames queued, over the bound of {bound}"
    );
    // A small frame does not wait for the budget.
    match tokio::time::timeout(Duration::from_secs(5), a.van.send(numbered(9, 8, 1000, 8))).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("the small frame was refused: {e}"),
        Err(_) => panic!("a small frame waited behind the budget"),
    }

    // Read the stream: the small frame comes right after the large ones queued before it
    // (bounded: a van that lost the small frame fails here instead of hanging).
    let read = async {
        let mut position = 0;
        let mut header = [0u8; HEADER_LEN];
        loop {
            let read = socket.read_exact(&mut header).await;
            read.unwrap_or_else(|e| panic!("read: {e}"));
            let len = FrameHeader::parse(&header, &Limits::default())
                .unwrap_or_else(|e| panic!("header: {e}"))
                .frame_len as usize;
            let mut rest = vec![0u8; len - HEADER_LEN];
            let read = socket.read_exact(&mut rest).await;
            read.unwrap_or_else(|e| panic!("read: {e}"));
            if len < LARGE {
                let mut frame = header.to_vec();
                frame.extend_from_slice(&rest);
                let msg = wire::decode(frame.into(), &Limits::default())
                    .unwrap_or_else(|e| panic!("decode: {e}"));
                assert_eq!(msg.meta.request_id, 1000);
                return position;
            }
            position += 1;
        }
    };
    let position = tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .unwrap_or_else(|_| panic!("the small frame did not arrive within 60 s"));
    assert!(
        position <= bound,
        "the small frame waited behind {position} large ones"
    );
    drop(socket);
    senders.abort();
}
