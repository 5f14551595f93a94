//! The machine alone, driven through its public calls: credits and their return, the
//! reserved credit, the large-frame rendezvous on both sides, ordering, the start limit, the
//! send queue, the flush, the peer's end, and every protocol violation it names. Then a
//! property: arbitrary event sequences never panic and never break the machine's bounds.

use super::*;
use proptest::prelude::*;

type M = Machine<u32, u32>;
type A = Action<u32, u32>;

fn config() -> Config {
    Config {
        rx_depth: 4,
        peer_rx_depth: 4,
        send_bytes: 256,
        start_depth: 2,
        send_queue: 7,
        max_message: 100,
        max_frame: 1 << 20,
    }
}

fn machine() -> M {
    Machine::new(config())
}

/// What the machine asks, in order.
fn actions(m: &mut M) -> Vec<A> {
    std::iter::from_fn(|| m.poll()).collect()
}

fn handle(m: &mut M, event: Event<u32, u32>) -> Vec<A> {
    m.handle(event);
    let out = actions(m);
    assert_eq!(m.check(), Ok(()));
    out
}

fn pump(m: &mut M) -> Vec<A> {
    m.pump();
    let out = actions(m);
    assert_eq!(m.check(), Ok(()));
    out
}

fn frame(tag: u32, len: usize) -> Event<u32, u32> {
    Event::Frame { frame: tag, len }
}

fn send(slot: usize, kind: Kind, credits: u16, id: u32, frame: Option<u32>) -> A {
    Action::Send {
        slot,
        header: Header { kind, credits, id },
        frame,
    }
}

fn data(slot: usize, credits: u16, message: u32) -> Event<u32, u32> {
    Event::Received {
        slot,
        credits,
        incoming: Incoming::Data(message),
    }
}

fn credit(slot: usize, credits: u16) -> Event<u32, u32> {
    Event::Received {
        slot,
        credits,
        incoming: Incoming::Credit,
    }
}

fn lost(actions: &[A]) -> String {
    match actions.last() {
        Some(Action::Close(End::Lost(reason))) => reason.clone(),
        other => panic!("expected the connection to end, got {other:?}"),
    }
}

#[test]
fn announced_large_frames_stay_below_the_peers_receive_depth() {
    // The peer refuses an announcement once it holds `rx_depth` of them.
    assert_eq!(start_limit(16, 128), 16);
    assert_eq!(start_limit(128, 128), 127);
    assert_eq!(start_limit(4096, 4), 3);
    assert_eq!(start_limit(0, 4), 1);
    assert_eq!(start_limit(16, 0), 1);
}

#[test]
fn a_small_frame_is_one_send_and_its_completion_frees_the_slot() {
    let mut m = machine();
    assert!(m.wants_frame() && m.is_flushed());
    assert_eq!(m.credits(), 4);
    // 240 bytes and the 16-byte header fill the peer's 256-byte buffer exactly.
    let out = handle(&mut m, frame(7, 240));
    assert_eq!(out, vec![send(0, Kind::Data, 0, 0, Some(7))]);
    assert_eq!((m.credits(), m.send_queue_used()), (3, 1));
    assert!(!m.is_flushed());
    assert_eq!(handle(&mut m, Event::Sent { slot: 0 }), vec![]);
    assert_eq!((m.credits(), m.send_queue_used()), (3, 0));
    assert!(m.is_flushed());
    // The freed slot is used again first.
    let out = handle(&mut m, frame(8, 1));
    assert_eq!(out, vec![send(0, Kind::Data, 0, 0, Some(8))]);
}

#[test]
fn the_last_credit_is_kept_for_returning_credits() {
    let mut m = machine();
    for tag in 0..3 {
        assert_eq!(handle(&mut m, frame(tag, 10)).len(), 1);
    }
    assert_eq!(m.credits(), 1);
    // A fourth frame waits: one credit is kept back.
    assert_eq!(handle(&mut m, frame(3, 10)), vec![]);
    assert!(!m.wants_frame());
    assert_eq!(pump(&mut m), vec![]);
    // Two receives reposted are half our ring: a credit-only message may use the last one.
    let out = handle(&mut m, data(0, 0, 100));
    assert_eq!(
        out,
        vec![Action::Deliver(100), Action::PostReceive { slot: 0 }]
    );
    handle(&mut m, data(1, 0, 101));
    assert_eq!(m.owed(), 2);
    assert_eq!(pump(&mut m), vec![send(3, Kind::Credit, 2, 0, None)]);
    assert_eq!((m.credits(), m.owed()), (0, 0));
}

#[test]
fn owed_credits_ride_on_the_next_header() {
    let mut m = machine();
    handle(&mut m, data(0, 0, 1));
    // One owed is below the threshold (half of 4): no credit-only message...
    assert_eq!(pump(&mut m), vec![]);
    // ...but the next frame carries it.
    let out = handle(&mut m, frame(9, 10));
    assert_eq!(out, vec![send(0, Kind::Data, 1, 0, Some(9))]);
    assert_eq!(m.owed(), 0);
}

#[test]
fn returned_credits_release_a_waiting_frame() {
    let mut m = machine();
    for tag in 0..4 {
        handle(&mut m, frame(tag, 10));
    }
    assert_eq!(m.credits(), 1);
    let out = handle(&mut m, credit(0, 3));
    assert_eq!(out, vec![Action::PostReceive { slot: 0 }]);
    assert_eq!(m.credits(), 4);
    // Posting waits for the round's pump; the header returns the reposted buffer.
    assert_eq!(pump(&mut m), vec![send(3, Kind::Data, 1, 0, Some(3))]);
    assert!(m.wants_frame());
}

#[test]
fn a_peer_returning_too_many_credits_or_sending_without_one_is_refused() {
    let mut m = machine();
    let out = handle(&mut m, credit(0, 1));
    assert_eq!(lost(&out), "peer returned more credits than it has buffers");
    assert!(m.is_closed());
    assert_eq!(handle(&mut m, frame(1, 10)), vec![]);

    // We never returned a credit: the peer has used all four.
    let mut m = machine();
    for slot in 0..4 {
        handle(&mut m, data(slot, 0, slot as u32));
    }
    assert_eq!((m.owed(), m.posted_receives()), (4, 4));
    let out = handle(&mut m, data(0, 0, 9));
    assert_eq!(lost(&out), "peer sent without a credit");
}

#[test]
fn a_large_frame_is_announced_then_written_in_pieces_after_the_reply() {
    let mut m = machine();
    // 241 bytes do not fit with the header: announced.
    let out = handle(&mut m, frame(7, 250));
    assert_eq!(out, vec![send(0, Kind::Start { len: 250 }, 0, 0, None)]);
    assert_eq!(m.announced(), 1);
    let reply = Incoming::Reply {
        id: 0,
        len: 250,
        addr: 0x1000,
        rkey: 9,
    };
    let out = handle(
        &mut m,
        Event::Received {
            slot: 2,
            credits: 0,
            incoming: reply,
        },
    );
    assert_eq!(out, vec![Action::PostReceive { slot: 2 }]);
    let write = |offset: usize, len: usize, last: bool| Action::Write {
        id: 0,
        offset,
        len,
        remote_addr: 0x1000 + offset as u64,
        rkey: 9,
        last,
    };
    let out = pump(&mut m);
    assert_eq!(
        out,
        vec![
            Action::BeginWrite {
                id: 0,
                frame: 7,
                len: 250
            },
            write(0, 100, false),
            write(100, 100, false),
            write(200, 50, true),
        ]
    );
    // The START and the write each took a credit; every piece a send-queue entry.
    assert_eq!((m.credits(), m.send_queue_used(), m.announced()), (2, 4, 0));
    handle(&mut m, Event::Finish);
    handle(&mut m, Event::Sent { slot: 0 });
    for last in [false, false] {
        assert_eq!(handle(&mut m, Event::Wrote { id: 0, last }), vec![]);
    }
    assert!(!m.is_flushed());
    let out = handle(&mut m, Event::Wrote { id: 0, last: true });
    assert_eq!(out, vec![Action::EndWrite { id: 0 }]);
    assert!(m.is_flushed());
    assert_eq!(pump(&mut m), vec![Action::Close(End::Flushed)]);
}

#[test]
fn the_receiver_reserves_replies_and_delivers_a_large_frame_in_its_place() {
    let mut m = machine();
    let start = Incoming::Start { id: 5, len: 300 };
    let out = handle(
        &mut m,
        Event::Received {
            slot: 0,
            credits: 0,
            incoming: start,
        },
    );
    assert_eq!(
        out,
        vec![
            Action::Reserve { id: 5, len: 300 },
            Action::PostReceive { slot: 0 }
        ]
    );
    // A small frame behind the unwritten large one waits for it.
    assert_eq!(
        handle(&mut m, data(1, 0, 1)),
        vec![Action::PostReceive { slot: 1 }]
    );
    let reserved = Event::Reserved {
        id: 5,
        addr: 0xa000,
        rkey: 3,
    };
    assert_eq!(handle(&mut m, reserved), vec![]);
    let reply = Kind::Reply {
        len: 300,
        addr: 0xa000,
        rkey: 3,
    };
    assert_eq!(pump(&mut m), vec![send(0, reply, 2, 5, None)]);
    let written = Event::Written {
        slot: 2,
        id: 5,
        len: 44,
    };
    let out = handle(&mut m, written);
    assert_eq!(
        out,
        vec![
            Action::Decode { id: 5, len: 300 },
            Action::PostReceive { slot: 2 }
        ]
    );
    let out = handle(&mut m, Event::Decoded { id: 5, message: 50 });
    assert_eq!(out, vec![Action::Deliver(50), Action::Deliver(1)]);
    // Nothing waits now: the next frame goes straight through.
    assert_eq!(
        handle(&mut m, data(3, 0, 2)),
        vec![Action::Deliver(2), Action::PostReceive { slot: 3 }]
    );
}

#[test]
fn large_frames_in_flight_stop_at_the_start_limit() {
    let mut m = Machine::new(Config {
        peer_rx_depth: 8,
        send_queue: 10,
        ..config()
    });
    assert_eq!(handle(&mut m, frame(0, 500)).len(), 1);
    assert_eq!(handle(&mut m, frame(1, 500)).len(), 1);
    // Two announced: the third waits, and so does everything behind it.
    assert_eq!(handle(&mut m, frame(2, 500)), vec![]);
    assert!(!m.wants_frame());
    let reply = Incoming::Reply {
        id: 0,
        len: 500,
        addr: 0,
        rkey: 1,
    };
    handle(
        &mut m,
        Event::Received {
            slot: 0,
            credits: 0,
            incoming: reply,
        },
    );
    // Once the first is posted in full, the third is announced.
    let out = pump(&mut m);
    assert!(matches!(
        out.first(),
        Some(Action::BeginWrite { id: 0, .. })
    ));
    assert_eq!(
        out.last(),
        Some(&send(2, Kind::Start { len: 500 }, 1, 2, None))
    );
    assert_eq!(m.announced(), 2);
}

#[test]
fn writes_wait_for_room_in_the_send_queue() {
    let mut m = Machine::new(Config {
        send_queue: 3,
        ..config()
    });
    handle(&mut m, frame(0, 250));
    let reply = Incoming::Reply {
        id: 0,
        len: 250,
        addr: 0,
        rkey: 1,
    };
    handle(
        &mut m,
        Event::Received {
            slot: 0,
            credits: 0,
            incoming: reply,
        },
    );
    // The START holds one entry: two pieces fit.
    let out = pump(&mut m);
    assert_eq!(out.len(), 3);
    assert!(matches!(out[2], Action::Write { last: false, .. }));
    assert_eq!(pump(&mut m), vec![]);
    handle(&mut m, Event::Sent { slot: 0 });
    let out = pump(&mut m);
    assert!(matches!(
        out[..],
        [Action::Write {
            offset: 200,
            last: true,
            ..
        }]
    ));
}

#[test]
fn a_finish_closes_once_every_send_completed() {
    let mut m = machine();
    assert_eq!(
        handle(&mut m, Event::Finish),
        vec![Action::Close(End::Flushed)]
    );

    let mut m = machine();
    handle(&mut m, frame(0, 10));
    assert_eq!(handle(&mut m, Event::Finish), vec![]);
    assert!(!m.wants_frame());
    assert_eq!(pump(&mut m), vec![]);
    // The completion alone does not close: the round's pump does, after what it posts.
    assert_eq!(handle(&mut m, Event::Sent { slot: 0 }), vec![]);
    assert_eq!(pump(&mut m), vec![Action::Close(End::Flushed)]);
    assert!(m.is_closed());
    assert_eq!(handle(&mut m, data(0, 0, 1)), vec![]);
}

#[test]
fn after_the_peer_closed_nothing_is_posted_and_what_arrived_is_delivered() {
    let mut m = machine();
    for tag in 0..4 {
        handle(&mut m, frame(tag, 10));
    }
    handle(&mut m, Event::PeerClosed);
    assert!(!m.wants_frame());
    // Delivered, not reposted, and the credits post nothing.
    assert_eq!(handle(&mut m, data(0, 3, 9)), vec![Action::Deliver(9)]);
    assert_eq!(pump(&mut m), vec![]);
    assert_eq!(m.posted_receives(), 3);
    assert!(!m.is_closed());
}

/// A machine that announced one large frame (id 0, 250 bytes) and received one (id 5).
fn busy_machine() -> M {
    let mut m = machine();
    handle(&mut m, frame(0, 250));
    let start = Incoming::Start { id: 5, len: 300 };
    handle(
        &mut m,
        Event::Received {
            slot: 0,
            credits: 0,
            incoming: start,
        },
    );
    handle(
        &mut m,
        Event::Reserved {
            id: 5,
            addr: 0,
            rkey: 0,
        },
    );
    m
}

fn received(slot: usize, incoming: Incoming<u32>) -> Event<u32, u32> {
    Event::Received {
        slot,
        credits: 0,
        incoming,
    }
}

#[test]
fn every_violation_ends_the_connection_with_its_reason() {
    let reply = |id, len, addr| Incoming::Reply {
        id,
        len,
        addr,
        rkey: 0,
    };
    let cases: Vec<(Event<u32, u32>, &str)> = vec![
        (
            received(1, reply(3, 250, 0)),
            "replied to a large message we never",
        ),
        (received(1, reply(0, 251, 0)), "wrong size"),
        (received(1, reply(0, 250, u64::MAX - 9)), "invalid address"),
        (
            received(
                1,
                Incoming::Start {
                    id: 6,
                    len: 2 << 20,
                },
            ),
            "limit 1048576",
        ),
        (
            received(1, Incoming::Start { id: 6, len: 31 }),
            "31-byte frame",
        ),
        (received(1, Incoming::Start { id: 5, len: 300 }), "id twice"),
        (
            Event::Written {
                slot: 1,
                id: 6,
                len: 10,
            },
            "never announced",
        ),
        (
            Event::Written {
                slot: 1,
                id: 5,
                len: 301,
            },
            "301 bytes for a message announced as 300",
        ),
        (data(9, 0, 1), "buffer 9 completed that was not posted"),
        (
            Event::Sent { slot: 1 },
            "slot 1 completed that was not posted",
        ),
        (Event::Wrote { id: 0, last: true }, "not posted"),
        (Event::Wrote { id: 0, last: false }, "not posted"),
        (
            Event::Decoded { id: 5, message: 1 },
            "decoded before it was written",
        ),
        (
            Event::Reserved {
                id: 5,
                addr: 0,
                rkey: 0,
            },
            "reserved twice",
        ),
        (
            Event::Reserved {
                id: 6,
                addr: 0,
                rkey: 0,
            },
            "never announced",
        ),
    ];
    for (event, reason) in cases {
        let mut m = busy_machine();
        let out = handle(&mut m, event.clone());
        let got = lost(&out);
        assert!(got.contains(reason), "{event:?}: {got}");
        assert!(m.is_closed());
        assert_eq!(handle(&mut m, Event::Finish), vec![]);
    }
}

#[test]
fn a_peer_announcing_more_than_our_ring_holds_is_refused() {
    let mut m = Machine::new(Config {
        peer_rx_depth: 32,
        ..config()
    });
    for id in 0..4 {
        let out = handle(
            &mut m,
            received(id as usize, Incoming::Start { id, len: 300 }),
        );
        assert_eq!(out[0], Action::Reserve { id, len: 300 });
        let addr = u64::from(id) << 20;
        handle(&mut m, Event::Reserved { id, addr, rkey: 0 });
        // Replies go, and return the credits.
        assert!(!pump(&mut m).is_empty());
    }
    let out = handle(&mut m, received(0, Incoming::Start { id: 4, len: 300 }));
    assert_eq!(lost(&out), "peer announced more large messages than it may");
}

/// One step of an arbitrary run.
#[derive(Debug, Clone)]
enum Step {
    Event(Event<u32, u32>),
    Pump,
}

fn arbitrary_step() -> impl Strategy<Value = Step> {
    let small = 0usize..10;
    let id = 0u32..6;
    let len = prop_oneof![0usize..400, Just(1 << 21)];
    let incoming = prop_oneof![
        (0u32..100).prop_map(Incoming::Data),
        Just(Incoming::Credit),
        (id.clone(), 0u64..1000).prop_map(|(id, len)| Incoming::Start { id, len }),
        (id.clone(), 0u64..1000, any::<u64>(), any::<u32>()).prop_map(|(id, len, addr, rkey)| {
            Incoming::Reply {
                id,
                len,
                addr,
                rkey,
            }
        }),
    ];
    prop_oneof![
        4 => Just(Step::Pump),
        3 => (0u32..100, len.clone()).prop_map(|(frame, len)| Step::Event(Event::Frame { frame, len })),
        1 => Just(Step::Event(Event::Finish)),
        1 => Just(Step::Event(Event::PeerClosed)),
        3 => small.clone().prop_map(|slot| Step::Event(Event::Sent { slot })),
        3 => (id.clone(), any::<bool>()).prop_map(|(id, last)| Step::Event(Event::Wrote { id, last })),
        4 => (small.clone(), 0u16..4, incoming)
            .prop_map(|(slot, credits, incoming)| Step::Event(Event::Received { slot, credits, incoming })),
        2 => (small, id.clone(), len).prop_map(|(slot, id, len)| Step::Event(Event::Written { slot, id, len })),
        2 => (id.clone(), any::<u64>()).prop_map(|(id, addr)| Step::Event(Event::Reserved { id, addr, rkey: 0 })),
        2 => (id, 0u32..100).prop_map(|(id, message)| Step::Event(Event::Decoded { id, message })),
    ]
}

proptest! {
    /// Whatever happens, in whatever order, the machine neither panics nor breaks its
    /// bounds, and once closed it stays closed and silent.
    #[test]
    fn arbitrary_events_never_panic_or_break_the_bounds(
        steps in proptest::collection::vec(arbitrary_step(), 0..200),
        rx_depth in 4u32..9,
        peer_rx_depth in 4u32..9,
        start_depth in 0u32..4,
        send_queue in 0u32..12,
        max_message in 0usize..300,
    ) {
        let mut m: M = Machine::new(Config { rx_depth, peer_rx_depth, start_depth, send_queue, max_message, ..config() });
        for step in steps {
            let closed = m.is_closed();
            match step {
                Step::Event(event) => m.handle(event),
                Step::Pump => m.pump(),
            }
            let out = actions(&mut m);
            prop_assert_eq!(m.check(), Ok(()));
            if closed {
                prop_assert!(out.is_empty());
            }
            let closes = out.iter().filter(|a| matches!(a, Action::Close(_))).count();
            prop_assert!(closes <= 1);
            prop_assert_eq!(closes == 1, m.is_closed() && !closed);
        }
    }
}
