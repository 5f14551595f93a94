//! Two machines against each other over a simulated reliable-connected queue-pair pair, as
//! the engine would drive them, under random interleavings of transmissions,
//! acknowledgements, rounds and frames, with random ring sizes and frame sizes.
//!
//! The simulation is lossless and keeps each direction in posting order, as RC does: a SEND
//! fills the receiver's oldest posted receive buffer (there must be one: none is the
//! receiver-not-ready error a credit exists to prevent), an RDMA WRITE must land inside a
//! buffer the receiver reserved, at the offset it belongs, and its last piece fills a receive
//! buffer too. It checks, besides the machine's own bounds after every round:
//! - every frame is delivered exactly once, in order, with its length: what a side delivered
//!   is a prefix of what its peer sent, all of it when the peer flushed, and all of it at the
//!   end when neither side stopped;
//! - credits, counted here independently, never go below zero or above the peer's depth,
//!   match the machine's, and keep [`RESERVE`] back from everything but credit-only SENDs;
//!   at rest, our credits and what the peer owes us add up to its depth;
//! - send slots, the send queue and receive buffers are never used twice or overfilled;
//!   pieces of a write are posted in order, within the message size, and released after the
//!   last one's completion;
//! - a stop flushes and closes, the peer then drains and ends, and no machine ever ends the
//!   connection with a protocol error.

use std::collections::{HashMap, HashSet, VecDeque};

use proptest::prelude::*;

use super::*;

/// A frame: its number in its sender's sequence, and its length.
type Frame = (u32, usize);

/// What travels from one queue pair to the other.
#[derive(Debug)]
enum Packet {
    Send {
        slot: usize,
        header: Header,
        frame: Option<Frame>,
    },
    Write {
        id: u32,
        frame: Frame,
        offset: usize,
        len: usize,
        remote_addr: u64,
        rkey: u32,
        last: bool,
    },
}

/// A work completion.
#[derive(Debug)]
enum Cqe {
    Sent(usize),
    Wrote(u32, bool),
    Received(usize, Header, Option<Frame>),
    Written(usize, u32, usize),
}

/// A buffer reserved for the peer's large frame.
#[derive(Debug)]
struct Reservation {
    id: u32,
    addr: u64,
    len: usize,
    written: usize,
    frame: Option<Frame>,
}

/// What each side is given.
#[derive(Debug, Clone)]
struct SideSetup {
    rx_depth: u32,
    slot_bytes: usize,
    start_depth: u32,
    /// Below the real `rx_depth + start_depth + 1`, to make writes wait for room.
    send_queue_cut: u32,
    max_message: usize,
    frames: Vec<usize>,
}

#[derive(Debug)]
struct Side {
    machine: Machine<Frame, Frame>,
    config: Config,
    slot_bytes: usize,
    peer_depth: u32,
    frames: Vec<usize>,
    /// Frames the application has queued, and of those, fed to the machine.
    queued: usize,
    fed: usize,
    /// The application stopped: the queue closes after its frames.
    stop: bool,
    receives: VecDeque<usize>,
    slots_busy: HashSet<usize>,
    sq: u32,
    wire: VecDeque<Packet>,
    acks: VecDeque<Cqe>,
    cq: VecDeque<Cqe>,
    /// Large frames prepared for writing: the frame and the bytes posted.
    writing: HashMap<u32, (Frame, usize)>,
    reserved: HashMap<u32, Reservation>,
    next_key: u32,
    credits: i64,
    delivered: Vec<Frame>,
    end: Option<End>,
    /// Steps taken: the simulation runs until none is.
    steps: u64,
}

impl Side {
    fn new(ours: &SideSetup, theirs: &SideSetup) -> Side {
        let send_queue = ours.rx_depth + ours.start_depth + 1;
        let config = Config {
            rx_depth: ours.rx_depth,
            peer_rx_depth: theirs.rx_depth,
            send_bytes: ours.slot_bytes.min(theirs.slot_bytes),
            start_depth: ours.start_depth,
            send_queue: send_queue.saturating_sub(ours.send_queue_cut).max(1),
            max_message: ours.max_message,
            max_frame: 1 << 20,
        };
        Side {
            machine: Machine::new(config),
            config,
            slot_bytes: ours.slot_bytes,
            peer_depth: theirs.rx_depth,
            frames: ours.frames.clone(),
            queued: 0,
            fed: 0,
            stop: false,
            receives: (0..ours.rx_depth as usize).collect(),
            slots_busy: HashSet::new(),
            sq: 0,
            wire: VecDeque::new(),
            acks: VecDeque::new(),
            cq: VecDeque::new(),
            writing: HashMap::new(),
            reserved: HashMap::new(),
            next_key: 1,
            credits: i64::from(theirs.rx_depth),
            delivered: Vec::new(),
            end: None,
            steps: 0,
        }
    }

    /// Spends one of our credits on a SEND or a write, checking the reserve.
    fn spend(&mut self, keep: i64) {
        assert!(
            self.credits > keep,
            "posted with {} credits, keeping {keep}",
            self.credits
        );
        self.credits -= 1;
    }

    fn post(&mut self) {
        self.sq += 1;
        assert!(self.sq <= self.config.send_queue, "send queue overfilled");
    }

    /// Carries out the machine's actions, as the engine does.
    fn execute(&mut self) {
        while let Some(action) = self.machine.poll() {
            self.steps += 1;
            match action {
                Action::PostReceive { slot } => {
                    assert!(slot < self.config.rx_depth as usize);
                    assert!(
                        !self.receives.contains(&slot),
                        "receive {slot} posted twice"
                    );
                    self.receives.push_back(slot);
                }
                Action::Send {
                    slot,
                    header,
                    frame,
                } => {
                    assert!(slot < self.config.rx_depth as usize);
                    assert!(self.slots_busy.insert(slot), "send slot {slot} used twice");
                    self.spend(if header.kind == Kind::Credit { 0 } else { 1 });
                    self.post();
                    assert_eq!(frame.is_some(), header.kind == Kind::Data);
                    self.wire.push_back(Packet::Send {
                        slot,
                        header,
                        frame,
                    });
                }
                Action::BeginWrite { id, frame, len } => {
                    assert_eq!(frame.1, len);
                    self.spend(1);
                    assert!(self.writing.insert(id, (frame, 0)).is_none());
                }
                Action::Write {
                    id,
                    offset,
                    len,
                    remote_addr,
                    rkey,
                    last,
                } => {
                    let (frame, posted) = self.writing.get_mut(&id).expect("write not begun");
                    assert_eq!(offset, *posted, "pieces out of order");
                    assert!(len <= self.config.max_message && offset + len <= frame.1);
                    assert_eq!(last, offset + len == frame.1);
                    *posted += len;
                    let frame = *frame;
                    self.post();
                    self.wire.push_back(Packet::Write {
                        id,
                        frame,
                        offset,
                        len,
                        remote_addr,
                        rkey,
                        last,
                    });
                }
                Action::EndWrite { id } => {
                    let (frame, posted) = self.writing.remove(&id).expect("unknown write");
                    assert_eq!(posted, frame.1, "released before fully posted");
                }
                Action::Reserve { id, len } => {
                    let rkey = self.next_key;
                    self.next_key += 1;
                    let addr = u64::from(rkey) << 32;
                    let r = Reservation {
                        id,
                        addr,
                        len,
                        written: 0,
                        frame: None,
                    };
                    self.reserved.insert(rkey, r);
                    self.machine.handle(Event::Reserved { id, addr, rkey });
                }
                Action::Decode { id, len } => {
                    let key = self
                        .reserved
                        .iter()
                        .find(|(_, r)| r.id == id)
                        .map(|(k, _)| *k)
                        .expect("decode of an unreserved frame");
                    let r = self.reserved.remove(&key).expect("reservation");
                    assert_eq!((r.len, r.written), (len, len), "decoded before written");
                    let message = r.frame.expect("written");
                    assert_eq!(message.1, len);
                    self.machine.handle(Event::Decoded { id, message });
                }
                Action::Deliver(frame) => self.delivered.push(frame),
                Action::Close(End::Lost(reason)) => panic!("a machine ended: {reason}"),
                Action::Close(End::Flushed) => {
                    assert!(self.stop && self.end.is_none());
                    self.end = Some(End::Flushed);
                }
            }
        }
    }

    /// The machine's event for a completion, checked against what was posted.
    fn event(&mut self, cqe: Cqe) -> Event<Frame, Frame> {
        match cqe {
            Cqe::Sent(slot) => {
                assert!(self.slots_busy.remove(&slot));
                self.sq -= 1;
                Event::Sent { slot }
            }
            Cqe::Wrote(id, last) => {
                self.sq -= 1;
                Event::Wrote { id, last }
            }
            Cqe::Received(slot, header, frame) => {
                self.credits += i64::from(header.credits);
                let incoming = Incoming::new(&header, || frame.ok_or(()));
                Event::Received {
                    slot,
                    credits: header.credits,
                    incoming: incoming.expect("DATA carries its frame"),
                }
            }
            Cqe::Written(slot, id, len) => Event::Written { slot, id, len },
        }
    }

    /// One round of the engine: up to `n` completions, the pump, then frames from the queue.
    fn round(&mut self, n: usize, peer_ended: bool) {
        if self.end.is_some() {
            return;
        }
        if peer_ended {
            // The side channel closed: deliver what arrived, then end.
            self.machine.handle(Event::PeerClosed);
            while let Some(cqe) = self.cq.pop_front() {
                if matches!(cqe, Cqe::Received(..) | Cqe::Written(..)) {
                    let event = self.event(cqe);
                    self.machine.handle(event);
                    self.execute();
                }
            }
            self.end = Some(End::Lost("the peer closed the connection".into()));
            self.steps += 1;
            return;
        }
        for _ in 0..n.min(self.cq.len()) {
            let Some(cqe) = self.cq.pop_front() else {
                break;
            };
            let event = self.event(cqe);
            self.machine.handle(event);
            self.steps += 1;
            self.execute();
        }
        self.machine.pump();
        self.execute();
        while self.machine.wants_frame() {
            if self.fed < self.queued {
                let frame = (self.fed as u32, self.frames[self.fed]);
                self.fed += 1;
                self.machine.handle(Event::Frame {
                    frame,
                    len: frame.1,
                });
            } else if self.stop {
                self.machine.handle(Event::Finish);
            } else {
                break;
            }
            self.steps += 1;
            self.execute();
        }
        assert_eq!(self.machine.check(), Ok(()));
        assert_eq!(i64::from(self.machine.credits()), self.credits);
        assert!(self.credits >= 0 && self.credits <= i64::from(self.peer_depth));
    }

    /// The application stops: its remaining frames are queued, then the queue closes.
    fn stop(&mut self) {
        self.queued = self.frames.len();
        self.stop = true;
    }
}

/// Moves the oldest packet from `from` into `to`.
fn transmit(from: &mut Side, to: &mut Side) {
    let Some(packet) = from.wire.pop_front() else {
        return;
    };
    from.steps += 1;
    if to.end.is_some() {
        return;
    }
    match packet {
        Packet::Send {
            slot: sent,
            header,
            frame,
        } => {
            let len = match header.kind {
                Kind::Data => Header::LEN + frame.map_or(0, |f| f.1),
                Kind::Credit => Header::LEN,
                _ => Header::CONTROL_LEN,
            };
            assert!(
                len <= to.slot_bytes,
                "{len} bytes sent into a smaller buffer"
            );
            let slot = to
                .receives
                .pop_front()
                .expect("SEND without a posted receive");
            to.cq.push_back(Cqe::Received(slot, header, frame));
            from.acks.push_back(Cqe::Sent(sent));
        }
        Packet::Write {
            id,
            frame,
            offset,
            len,
            remote_addr,
            rkey,
            last,
        } => {
            let r = to
                .reserved
                .get_mut(&rkey)
                .expect("write with an unknown key");
            assert_eq!(r.id, id);
            assert_eq!(
                remote_addr,
                r.addr + offset as u64,
                "write at the wrong place"
            );
            assert_eq!(offset, r.written, "pieces out of order");
            assert!(offset + len <= r.len, "write past the buffer");
            assert!(r.frame.is_none_or(|f| f == frame));
            r.written += len;
            r.frame = Some(frame);
            if last {
                assert_eq!(r.written, r.len, "last piece before the frame is whole");
                let slot = to
                    .receives
                    .pop_front()
                    .expect("WRITE_WITH_IMM without a receive");
                to.cq.push_back(Cqe::Written(slot, id, len));
            }
            from.acks.push_back(Cqe::Wrote(id, last));
        }
    }
}

/// The two sides, and a run of them.
#[derive(Debug)]
struct Pair {
    sides: [Side; 2],
}

impl Pair {
    fn new(a: &SideSetup, b: &SideSetup) -> Pair {
        Pair {
            sides: [Side::new(a, b), Side::new(b, a)],
        }
    }

    /// Side `i` and its peer.
    fn split(&mut self, i: usize) -> (&mut Side, &mut Side) {
        let [a, b] = &mut self.sides;
        if i == 0 {
            (a, b)
        } else {
            (b, a)
        }
    }

    fn round(&mut self, i: usize, n: usize) {
        let (side, peer) = self.split(i);
        side.round(n, peer.end.is_some());
    }

    fn transmit(&mut self, i: usize) {
        let (side, peer) = self.split(i);
        transmit(side, peer);
    }

    fn ack(&mut self, i: usize) {
        let side = &mut self.sides[i];
        if let Some(cqe) = side.acks.pop_front() {
            side.cq.push_back(cqe);
            side.steps += 1;
        }
    }

    /// One step of the schedule.
    fn step(&mut self, op: u8, n: u8) {
        let i = usize::from(op % 2);
        match op / 2 {
            0..=6 => self.transmit(i),
            7..=11 => self.ack(i),
            12..=18 => self.round(i, usize::from(n % 8) + 1),
            _ => {
                let side = &mut self.sides[i];
                side.queued = (side.queued + 1).min(side.frames.len());
            }
        }
    }

    fn steps(&self) -> u64 {
        self.sides.iter().map(|s| s.steps).sum()
    }

    /// Queues every frame, and runs every side fairly until nothing moves.
    fn settle(&mut self) {
        for side in &mut self.sides {
            side.queued = side.frames.len();
        }
        for _ in 0..100_000 {
            let before = self.steps();
            for i in 0..2 {
                while !self.sides[i].wire.is_empty() {
                    self.transmit(i);
                }
                while !self.sides[i].acks.is_empty() {
                    self.ack(i);
                }
                self.round(i, usize::MAX);
            }
            if self.steps() == before {
                return;
            }
        }
        panic!("the pair never came to rest");
    }

    /// What must hold once the pair is at rest.
    fn check_at_rest(&self) {
        for i in 0..2 {
            let (side, peer) = (&self.sides[i], &self.sides[1 - i]);
            // Exactly once, in order, with its length.
            for (n, frame) in peer.delivered.iter().enumerate() {
                assert_eq!(*frame, (n as u32, side.frames[n]), "delivered out of order");
            }
            assert!(peer.delivered.len() <= side.frames.len());
            if side.end == Some(End::Flushed) {
                assert_eq!(
                    peer.delivered.len(),
                    side.frames.len(),
                    "flushed, not delivered"
                );
            }
        }
        let stopped = self.sides.iter().any(|s| s.stop);
        if stopped {
            // A stop flushes and closes; the peer then ends.
            assert!(self.sides.iter().any(|s| s.end == Some(End::Flushed)));
            assert!(self.sides.iter().all(|s| s.end.is_some()));
            return;
        }
        for i in 0..2 {
            let (side, peer) = (&self.sides[i], &self.sides[1 - i]);
            assert!(side.end.is_none() && side.machine.is_flushed() && side.machine.wants_frame());
            assert_eq!(
                peer.delivered.len(),
                side.frames.len(),
                "a frame never arrived"
            );
            assert_eq!(
                side.machine.credits() + peer.machine.owed(),
                peer.config.rx_depth,
                "credits lost"
            );
            assert_eq!(side.machine.posted_receives(), side.config.rx_depth);
        }
    }
}

fn side_setup() -> impl Strategy<Value = SideSetup> {
    (
        4u32..=10,
        prop_oneof![Just(256usize), Just(320), Just(512)],
        1u32..=4,
        prop_oneof![3 => Just(0u32), 1 => 0u32..12],
        prop_oneof![Just(64usize), Just(100), Just(1000), Just(1 << 20)],
        proptest::collection::vec(prop_oneof![0usize..300, 200usize..1500], 0..30),
    )
        .prop_map(
            |(rx_depth, slot_bytes, start_depth, send_queue_cut, max_message, frames)| SideSetup {
                rx_depth,
                slot_bytes,
                start_depth,
                send_queue_cut,
                max_message,
                frames,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Two machines over a simulated queue-pair pair: see the module docs for what is
    /// checked.
    #[test]
    fn two_machines_deliver_everything_in_order_within_their_credits(
        a in side_setup(),
        b in side_setup(),
        schedule in proptest::collection::vec((0u8..48, any::<u8>()), 0..600),
        stops in [proptest::option::of(0usize..700), proptest::option::of(0usize..700)],
    ) {
        let mut pair = Pair::new(&a, &b);
        for (at, (op, n)) in schedule.into_iter().enumerate() {
            for (side, stop) in pair.sides.iter_mut().zip(stops) {
                if stop == Some(at) {
                    side.stop();
                }
            }
            pair.step(op, n);
        }
        for (side, stop) in pair.sides.iter_mut().zip(stops) {
            if stop.is_some() {
                side.stop();
            }
        }
        pair.settle();
        pair.check_at_rest();
    }
}

/// A run with every frame large, on the smallest rings: writes, replies and credits all
/// compete for the last credits.
#[test]
fn large_frames_on_tiny_rings_flush() {
    let setup = SideSetup {
        rx_depth: 4,
        slot_bytes: 256,
        start_depth: 4,
        send_queue_cut: 0,
        max_message: 64,
        frames: vec![1000; 40],
    };
    let mut pair = Pair::new(&setup, &setup);
    pair.sides[0].stop();
    pair.settle();
    pair.check_at_rest();
    assert_eq!(pair.sides[1].delivered.len(), 40);
}
