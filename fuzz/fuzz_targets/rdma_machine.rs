//! The RDMA van's protocol state machine (`van_rdma::machine`) under arbitrary event
//! sequences: frames of any length, completions right or wrong, headers decoded from raw peer
//! bytes, credits, announcements, replies and writes with arbitrary words, the peer's end, a
//! stop. The machine must never panic, must keep its bounds after every step
//! (`Machine::check`: credits within the peer's depth, slots, receives, send queue and
//! announced frames within theirs), must close at most once and stay silent afterwards.
//!
//! The first bytes choose the sizes; then each byte picks an event. Most events are ones the
//! hardware could deliver (the oldest send or write piece completing, the next posted receive
//! filling, a reply to a frame we announced), so that inputs get deep into the protocol; the
//! others take their words from the input.
#![no_main]

use std::collections::VecDeque;

use libfuzzer_sys::fuzz_target;
use van_rdma::machine::{Action, Config, Event, Incoming, Machine};
use van_rdma::protocol::{Header, Kind};

/// The input, read front to back; zeros once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }
}

type M = Machine<u32, u32>;

/// What the machine posted and has not seen complete, and what it asked for.
#[derive(Default)]
struct Harness {
    sends: VecDeque<usize>,
    pieces: VecDeque<(u32, bool)>,
    receives: VecDeque<usize>,
    reserves: VecDeque<(u32, usize)>,
    decodes: VecDeque<u32>,
    /// Large frames we announced: (id, length).
    starts: Vec<(u32, u64)>,
    /// Ids the peer used lately.
    ids: Vec<u32>,
    closed: bool,
    /// Answer `Reserve` and `Decode` at once, as the engine does.
    at_once: bool,
    counter: u32,
}

impl Harness {
    fn next(&mut self) -> u32 {
        self.counter = self.counter.wrapping_add(1);
        self.counter
    }

    /// Takes the machine's actions, answering as the engine would when `at_once`.
    fn run(&mut self, m: &mut M) {
        while let Some(action) = m.poll() {
            assert!(!self.closed, "an action after the close: {action:?}");
            match action {
                Action::PostReceive { slot } => self.receives.push_back(slot),
                Action::Send { slot, header, .. } => {
                    self.sends.push_back(slot);
                    if let Kind::Start { len } = header.kind {
                        self.starts.push((header.id, len));
                    }
                }
                Action::BeginWrite { .. } | Action::EndWrite { .. } | Action::Deliver(_) => {}
                Action::Write { id, last, .. } => self.pieces.push_back((id, last)),
                Action::Reserve { id, .. } if self.at_once => {
                    let addr = u64::from(id) << 32;
                    m.handle(Event::Reserved { id, addr, rkey: id });
                }
                Action::Reserve { id, len } => self.reserves.push_back((id, len)),
                Action::Decode { id, .. } if self.at_once => {
                    let message = self.next();
                    m.handle(Event::Decoded { id, message });
                }
                Action::Decode { id, .. } => self.decodes.push_back(id),
                Action::Close(_) => self.closed = true,
            }
        }
        if let Err(broken) = m.check() {
            panic!("the machine broke a bound: {broken}");
        }
        assert_eq!(m.is_closed(), self.closed);
    }

    /// The next posted receive, or one the input names.
    fn receive(&mut self, input: &mut Input<'_>) -> usize {
        if input.byte() < 224 {
            if let Some(slot) = self.receives.pop_front() {
                return slot;
            }
        }
        usize::from(input.byte() % 20)
    }

    /// An id the peer used lately, or one the input names.
    fn id(&mut self, input: &mut Input<'_>) -> u32 {
        let pick = input.byte();
        match self.ids.get(usize::from(pick) % 8) {
            Some(id) if pick < 192 => *id,
            _ => u32::from(input.byte() % 16),
        }
    }

    fn received(&mut self, slot: usize, credits: u16, incoming: Incoming<u32>) -> Event<u32, u32> {
        if let Incoming::Start { id, .. } = incoming {
            self.ids.insert(0, id);
            self.ids.truncate(8);
        }
        Event::Received {
            slot,
            credits,
            incoming,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let flags = input.byte();
    let config = Config {
        rx_depth: 4 + u32::from(input.byte() % 13),
        peer_rx_depth: 4 + u32::from(input.byte() % 13),
        send_bytes: usize::from(input.u16() % 2048),
        start_depth: u32::from(input.byte() % 6),
        send_queue: u32::from(input.byte() % 24),
        max_message: usize::from(input.u16()),
        max_frame: u64::from(input.u32()),
    };
    let mut m: M = Machine::new(config);
    let mut h = Harness {
        at_once: flags & 1 == 0,
        ..Harness::default()
    };
    while !input.0.is_empty() {
        let closed = m.is_closed();
        let op = input.byte();
        match op % 18 {
            0 | 1 => {
                let len = if op & 0x80 == 0 {
                    usize::from(input.u16() % 4096)
                } else {
                    input.u32() as usize
                };
                let frame = h.next();
                m.handle(Event::Frame { frame, len });
            }
            2 => m.handle(if op < 128 {
                Event::Finish
            } else {
                Event::PeerClosed
            }),
            3 | 4 => m.pump(),
            5 => {
                let slot = match h.sends.pop_front() {
                    Some(slot) if op < 200 => slot,
                    _ => usize::from(input.byte() % 20),
                };
                m.handle(Event::Sent { slot });
            }
            6 => {
                let (id, last) = match h.pieces.pop_front() {
                    Some(piece) if op < 200 => piece,
                    _ => (u32::from(input.byte() % 8), input.byte() & 1 == 1),
                };
                m.handle(Event::Wrote { id, last });
            }
            7 | 8 => {
                // A header from raw peer bytes.
                let len = usize::from(input.byte() % 48);
                let bytes = input.bytes(len);
                if let Ok((header, _)) = Header::decode(&bytes) {
                    let message = h.next();
                    if let Ok(incoming) = Incoming::new(&header, || Ok::<_, ()>(message)) {
                        let slot = h.receive(&mut input);
                        let event = h.received(slot, header.credits, incoming);
                        m.handle(event);
                    }
                }
            }
            9 | 10 => {
                let slot = h.receive(&mut input);
                let credits = u16::from(input.byte() % 8);
                let event = h.received(slot, credits, Incoming::Credit);
                m.handle(event);
            }
            11 => {
                let slot = h.receive(&mut input);
                let message = h.next();
                let event = h.received(slot, 0, Incoming::Data(message));
                m.handle(event);
            }
            12 => {
                let slot = h.receive(&mut input);
                let id = u32::from(input.byte() % 16);
                let len = u64::from(input.u16()) << (input.byte() % 24);
                let event = h.received(slot, 0, Incoming::Start { id, len });
                m.handle(event);
            }
            13 => {
                // A reply to a frame we announced (or to one we did not), words from the input.
                let (id, len) = match h.starts.pop() {
                    Some(start) if op < 200 => start,
                    _ => (u32::from(input.byte() % 8), u64::from(input.u16())),
                };
                let addr = if input.byte() < 240 {
                    u64::from(input.u32())
                } else {
                    input.u64()
                };
                let rkey = input.u32();
                let slot = h.receive(&mut input);
                let credits = u16::from(input.byte() % 4);
                let incoming = Incoming::Reply {
                    id,
                    len,
                    addr,
                    rkey,
                };
                let event = h.received(slot, credits, incoming);
                m.handle(event);
            }
            14 | 15 => {
                let slot = h.receive(&mut input);
                let id = h.id(&mut input);
                let len = usize::from(input.u16());
                m.handle(Event::Written { slot, id, len });
            }
            16 => {
                let (id, _) = match h.reserves.pop_front() {
                    Some(reserve) if op < 200 => reserve,
                    _ => (h.id(&mut input), 0),
                };
                let addr = input.u64();
                m.handle(Event::Reserved { id, addr, rkey: 1 });
            }
            _ => {
                let id = match h.decodes.pop_front() {
                    Some(id) if op < 200 => id,
                    _ => h.id(&mut input),
                };
                let message = h.next();
                m.handle(Event::Decoded { id, message });
            }
        }
        h.run(&mut m);
        if closed {
            assert!(m.is_closed(), "a closed machine opened again");
        }
    }
});
