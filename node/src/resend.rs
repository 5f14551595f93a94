//! Exactly-once delivery across broken connections (ps-lite's `PS_RESEND`): every message a
//! node sends to another (but acknowledgements and heartbeats) carries a sequence number of
//! that (sender, recipient) pair; the recipient acknowledges each one and drops a copy it
//! has seen; the sender keeps each message until it is acknowledged and sends it again when
//! the acknowledgement is late.
//!
//! So a push that was on its way when its connection broke reaches the server once, over a
//! new connection, and the server counts it once even when the first copy did arrive and only
//! its acknowledgement was lost. A broken connection is then no failure: only the scheduler's
//! heartbeat timeout declares a node dead, and the messages kept for it are dropped.
//!
//! Unlike ps-lite, which remembers a signature of every message ever received, the receiver
//! keeps per sender only the lowest sequence number not yet seen and the few seen above it:
//! memory stays bounded by what is in flight, and a message whose fields repeat an earlier
//! one's (the same request id after the ids wrap) is never mistaken for a duplicate.
//!
//! A node id outlives a process: a node that dies and is started again takes its old id
//! (recovery). So a sequence number's top [`INCARNATION_BITS`] bits are the sending
//! process's *incarnation*, drawn at random when it starts, and the rest count its messages
//! from 1. A receiver that sees a new incarnation starts a new window for it, and drops
//! whatever still arrives from the incarnations it replaced (a dead process's leftovers).
//! Each message also names the recipient's incarnation the sender meant (from the node
//! table, [`Node::incarnation`](van_core::Node::incarnation)): a process that took the
//! recipient's id since drops it unacknowledged, so nothing meant for the process before is
//! applied by its successor, and numbering towards the successor can start again at 1.
//! The resender keeps the incarnation it numbers for itself ([`Resender::retarget`], from
//! the node table), so numbering and the switch to a successor happen under one lock: a
//! message is numbered and kept for exactly one process, and the copies kept for a replaced
//! one are dropped when its successor is known (the applications fail what waited on them).
//! Likewise a message whose sender's incarnation is not the one the table names for that
//! node comes from a replaced process and is dropped.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tracing::warn;
use van_core::{Command, Control, Message, Meta, NodeId, Seq};

/// Bits of a sequence number that hold the sender's incarnation; the rest count messages.
pub(crate) const INCARNATION_BITS: u32 = 24;
const COUNTER_BITS: u32 = 64 - INCARNATION_BITS;
/// Incarnations of one sender remembered as replaced.
const RETIRED: usize = 8;
/// Sequence numbers remembered above a gap, at most: a gap that never fills (a copy dropped
/// for good) must not make the window grow without bound. Beyond this many, the window
/// moves past the oldest gap.
const ABOVE: usize = 1 << 16;

/// A random incarnation number for this process: nonzero, [`INCARNATION_BITS`] wide.
pub(crate) fn new_incarnation() -> u64 {
    let mut raw = [0u8; 8];
    // Without the OS generator, the clock still tells two processes apart.
    let random = match getrandom::fill(&mut raw) {
        Ok(()) => u64::from_le_bytes(raw),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    };
    (random & ((1 << INCARNATION_BITS) - 1)).max(1)
}

/// Sends, acknowledgements and duplicates of one node.
#[derive(Debug)]
pub(crate) struct Resender {
    timeout: Duration,
    /// This process's incarnation, the top bits of every sequence number it gives.
    incarnation: u64,
    state: Mutex<State>,
    resent: AtomicU64,
    duplicates: AtomicU64,
    stale: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Per recipient: the incarnation the node table names for it (absent: not known).
    targets: HashMap<NodeId, u64>,
    /// Per recipient: what was sent and not yet acknowledged.
    outgoing: HashMap<NodeId, Outgoing>,
    /// Per sender: which sequence numbers arrived.
    incoming: HashMap<NodeId, Incoming>,
}

#[derive(Debug)]
struct Outgoing {
    /// The recipient's incarnation these messages are numbered for (0: whoever is there).
    to: u64,
    next: u64,
    unacked: BTreeMap<u64, Unacked>,
}

impl Outgoing {
    fn new(incarnation: u64, to: u64) -> Outgoing {
        Outgoing {
            to,
            next: (incarnation << COUNTER_BITS) | 1,
            unacked: BTreeMap::new(),
        }
    }
}

#[derive(Debug)]
struct Unacked {
    msg: Message,
    sent: Instant,
    /// How often it was sent again.
    resends: u32,
}

/// Resends of one message after which it is logged as a warning (once): its recipient
/// drops it or cannot be reached, and something waits on it.
const RESENDS_WARNED: u32 = 20;

/// The sequence numbers that arrived from one sender's current incarnation: all below
/// `below`, and those in `above` (beyond a gap a resend will fill); and the incarnations it
/// replaced.
#[derive(Debug, Default)]
struct Incoming {
    incarnation: u64,
    below: u64,
    above: BTreeSet<u64>,
    retired: Vec<u64>,
}

impl Incoming {
    /// Records `seq`; false if it had arrived before, or comes from a replaced incarnation.
    fn insert(&mut self, seq: u64) -> bool {
        let incarnation = seq >> COUNTER_BITS;
        if incarnation != self.incarnation {
            if self.retired.contains(&incarnation) {
                // A replaced process's message: dropped (unless fencing is off for a test,
                // when it is taken as new, window untouched).
                return !crate::fencing::enabled();
            }
            // A new process in the sender's place (or the first message from it).
            if self.incarnation != 0 {
                if self.retired.len() == RETIRED {
                    self.retired.remove(0);
                }
                self.retired.push(self.incarnation);
            }
            self.incarnation = incarnation;
            self.below = (incarnation << COUNTER_BITS) | 1;
            self.above.clear();
        }
        if seq < self.below || !self.above.insert(seq) {
            return false;
        }
        if self.above.len() > ABOVE {
            if let Some(&lowest) = self.above.first() {
                self.below = lowest;
            }
        }
        while self.above.remove(&self.below) {
            self.below += 1;
        }
        true
    }
}

/// What the receiver makes of a message.
#[derive(Debug)]
pub(crate) struct Received {
    /// The acknowledgement to send back, if the message carried a sequence number and was
    /// meant for this process.
    pub(crate) ack: Option<Message>,
    /// Whether the message must be dropped: it arrived before, or it was meant for (or sent
    /// by) a process that has been replaced.
    pub(crate) duplicate: bool,
}

impl Resender {
    /// A resender that sends again what is unacknowledged after `timeout`.
    pub(crate) fn new(timeout: Duration, incarnation: u64) -> Resender {
        Resender {
            timeout,
            incarnation,
            state: Mutex::new(State::default()),
            resent: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            stale: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Map operations only: a poisoned lock still holds consistent data.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long an acknowledgement may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The node table names incarnation `to` for `peer`: number what follows for that
    /// process. When a new process took the peer's place, what was kept for the one before
    /// is dropped (its successor would drop it too) and numbering starts again at 1; returns
    /// how many messages were dropped. Learning the incarnation of a peer numbered for as
    /// "whoever is there" (0) keeps what was sent.
    pub(crate) fn retarget(&self, peer: NodeId, to: u64) -> usize {
        let mut state = self.lock();
        if to == 0 || state.targets.insert(peer, to) == Some(to) {
            return 0;
        }
        match state.outgoing.get_mut(&peer) {
            Some(out) if out.to == 0 => {
                out.to = to;
                0
            }
            Some(out) if out.to != to => state
                .outgoing
                .remove(&peer)
                .map_or(0, |out| out.unacked.len()),
            _ => 0,
        }
    }

    /// Gives `msg` its sequence number, addressed to the recipient's incarnation the node
    /// table names ([`retarget`](Self::retarget); 0 while not known), and keeps a copy until
    /// it is acknowledged. Messages without both ends known, acknowledgements and heartbeats
    /// are left alone (a lost heartbeat is not worth a resend: the next one follows).
    pub(crate) fn stamp(&self, msg: &mut Message, now: Instant) {
        let (Some(_), Some(to)) = (msg.meta.sender, msg.meta.recipient) else {
            return;
        };
        if msg.meta.seq.is_some() || !needs_ack(&msg.meta) {
            return;
        }
        let mut state = self.lock();
        let incarnation = self.incarnation;
        let target = state.targets.get(&to).copied().unwrap_or(0);
        let out = state
            .outgoing
            .entry(to)
            .or_insert_with(|| Outgoing::new(incarnation, target));
        let seq = out.next;
        out.next += 1;
        msg.meta.seq = Some(Seq {
            number: seq,
            to: out.to,
        });
        let kept = Unacked {
            msg: msg.clone(),
            sent: now,
            resends: 0,
        };
        out.unacked.insert(seq, kept);
    }

    /// Forgets messages that were numbered but could not be sent for good (the caller is
    /// told of the failure, so they must not arrive later through a resend).
    pub(crate) fn unstamp(&self, sent: &[(NodeId, u64)]) {
        let mut state = self.lock();
        for (peer, seq) in sent {
            if let Some(out) = state.outgoing.get_mut(peer) {
                out.unacked.remove(seq);
            }
        }
    }

    /// `from` acknowledged `seq`.
    pub(crate) fn acked(&self, from: NodeId, seq: u64) {
        if let Some(out) = self.lock().outgoing.get_mut(&from) {
            out.unacked.remove(&seq);
        }
    }

    /// A message arrived at this process (incarnation `mine`) from a node whose table entry
    /// names incarnation `sender` (0: not known): the acknowledgement to send, and whether to
    /// drop it.
    pub(crate) fn received(&self, msg: &Message, mine: u64, sender: u64) -> Received {
        let (Some(Seq { number: seq, to }), Some(from)) = (msg.meta.seq, msg.meta.sender) else {
            return Received {
                ack: None,
                duplicate: false,
            };
        };
        let from_replaced = sender != 0 && seq >> COUNTER_BITS != sender;
        if ((to != 0 && to != mine) || from_replaced) && crate::fencing::enabled() {
            // Meant for the process before this one, or sent by one that has been replaced:
            // not acknowledged (its sender forgets it on learning of the replacement).
            self.stale.fetch_add(1, Ordering::Relaxed);
            return Received {
                ack: None,
                duplicate: true,
            };
        }
        let fresh = self.lock().incoming.entry(from).or_default().insert(seq);
        if !fresh {
            self.duplicates.fetch_add(1, Ordering::Relaxed);
        }
        let ack = Message {
            meta: Meta {
                sender: msg.meta.recipient,
                recipient: Some(from),
                control: Some(Control {
                    msg_sig: seq,
                    ..Control::command(Command::Ack)
                }),
                ..Meta::default()
            },
            data: van_core::Parts::new(),
        };
        Received {
            ack: Some(ack),
            duplicate: !fresh,
        }
    }

    /// The messages whose acknowledgement is overdue at `now`, to send again (their clock
    /// restarts).
    pub(crate) fn due(&self, now: Instant) -> Vec<Message> {
        let mut again = Vec::new();
        let mut stuck = Vec::new();
        let mut state = self.lock();
        for out in state.outgoing.values_mut() {
            let to = out.to;
            for kept in out.unacked.values_mut() {
                if now.saturating_duration_since(kept.sent) >= self.timeout {
                    kept.sent = now;
                    kept.resends += 1;
                    if kept.resends == RESENDS_WARNED {
                        let what = kept.msg.summary();
                        stuck.push(format!("{what}, meant for process {to:x}"));
                    }
                    again.push(kept.msg.clone());
                }
            }
        }
        drop(state);
        for what in stuck {
            warn!(
                "still unacknowledged after {RESENDS_WARNED} resends (the recipient cannot be \
                 reached or drops it): {what}"
            );
        }
        self.resent.fetch_add(again.len() as u64, Ordering::Relaxed);
        again
    }

    /// Drops what is kept for `peer` (it died) if it was numbered for its incarnation `to`
    /// (0: whichever): what is kept for a process that took its place since stays. What
    /// arrives from it is still told apart by incarnation.
    pub(crate) fn forget(&self, peer: NodeId, to: u64) {
        let mut state = self.lock();
        if to == 0 || state.outgoing.get(&peer).is_some_and(|out| out.to == to) {
            state.outgoing.remove(&peer);
        }
    }

    /// What this node resent, dropped and still keeps.
    pub(crate) fn stats(&self) -> ResendStats {
        ResendStats {
            resent: self.resent.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            stale: self.stale.load(Ordering::Relaxed),
            unacked: self.lock().outgoing.values().map(|o| o.unacked.len()).sum(),
        }
    }
}

/// A node's resend counters ([`Postoffice::resend_stats`](crate::Postoffice::resend_stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResendStats {
    /// Messages sent again because their acknowledgement was late, since the start.
    pub resent: u64,
    /// Copies received and dropped because the message had arrived before, since the start.
    pub duplicates: u64,
    /// Messages dropped because they were meant for, or sent by, a process that has been
    /// replaced (recovery), since the start.
    pub stale: u64,
    /// Messages sent and not yet acknowledged, now.
    pub unacked: usize,
}

/// Whether a message is one the resender numbers: everything but acknowledgements and
/// heartbeats.
fn needs_ack(meta: &Meta) -> bool {
    !matches!(
        meta.control.as_ref().map(|c| c.cmd),
        Some(Command::Ack | Command::Heartbeat)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const INC: u64 = 5;
    /// The receiving process's incarnation in the tests.
    const MINE: u64 = 3;
    /// Sequence number `n` of incarnation `inc`.
    fn seq(inc: u64, n: u64) -> u64 {
        (inc << COUNTER_BITS) | n
    }

    fn data(from: NodeId, to: NodeId) -> Message {
        let mut msg = Message::default();
        (msg.meta.sender, msg.meta.recipient) = (Some(from), Some(to));
        msg
    }

    #[test]
    fn sequence_numbers_count_per_recipient_and_acks_release_the_copies() {
        let r = Resender::new(Duration::from_secs(1), INC);
        let t0 = Instant::now();
        let mut seqs = Vec::new();
        for to in [8, 8, 9, 8] {
            let mut msg = data(10, to);
            r.stamp(&mut msg, t0);
            seqs.push(msg.meta.seq.map(|s| s.number));
        }
        let s = |n| Some(seq(INC, n));
        assert_eq!(seqs, [s(1), s(2), s(1), s(3)]);
        assert_eq!(r.stats().unacked, 4);
        r.acked(8, seq(INC, 2));
        r.acked(9, seq(INC, 1));
        r.acked(9, seq(INC, 7)); // unknown: ignored
        assert_eq!(r.stats().unacked, 2);
        // Nothing is due before the timeout; then the two left, once per timeout.
        assert!(r.due(t0 + Duration::from_millis(999)).is_empty());
        let again = r.due(t0 + Duration::from_secs(1));
        let mut resent: Vec<_> = again.iter().map(|m| m.meta.seq.map(|s| s.number)).collect();
        resent.sort_unstable();
        assert_eq!(resent, [s(1), s(3)]);
        assert!(r.due(t0 + Duration::from_millis(1500)).is_empty());
        assert_eq!(r.due(t0 + Duration::from_secs(2)).len(), 2);
        assert_eq!(r.stats().resent, 4);
        r.forget(8, 0);
        assert_eq!(r.stats().unacked, 0);
    }

    #[test]
    fn acks_and_heartbeats_are_not_numbered() {
        let r = Resender::new(Duration::from_secs(1), INC);
        for cmd in [Command::Ack, Command::Heartbeat] {
            let mut msg = data(10, 1);
            msg.meta.control = Some(Control::command(cmd));
            r.stamp(&mut msg, Instant::now());
            assert_eq!(msg.meta.seq, None);
        }
        let mut barrier = data(10, 1);
        barrier.meta.control = Some(Control::command(Command::Barrier));
        r.stamp(&mut barrier, Instant::now());
        assert_eq!(barrier.meta.seq.map(|s| s.number), Some(seq(INC, 1)));
        // Nor is a message without a sender (a registration before ids exist).
        let mut joining = data(10, 1);
        joining.meta.sender = None;
        r.stamp(&mut joining, Instant::now());
        assert_eq!(joining.meta.seq, None);
    }

    #[test]
    fn the_receiver_acks_every_copy_and_drops_all_but_the_first_in_any_order() {
        let r = Resender::new(Duration::from_secs(1), INC);
        let arrive = |from, seq| {
            let mut msg = data(from, 8);
            msg.meta.seq = Some(Seq { number: seq, to: 0 });
            let got = r.received(&msg, MINE, 0);
            let ack = got.ack.expect("every numbered message is acknowledged");
            assert_eq!(ack.meta.recipient, Some(from));
            assert_eq!(ack.meta.sender, Some(8));
            let control = ack.meta.control.expect("an ack is a control message");
            assert_eq!((control.cmd, control.msg_sig), (Command::Ack, seq));
            got.duplicate
        };
        // Out of order, with a gap filled later, and copies of each.
        let order = [
            (10, 2),
            (10, 1),
            (10, 2),
            (11, 1),
            (10, 4),
            (10, 1),
            (10, 3),
            (10, 4),
        ];
        let dups: Vec<bool> = order.iter().map(|&(f, n)| arrive(f, seq(7, n))).collect();
        assert_eq!(dups, [false, false, true, false, false, true, false, true]);
        assert_eq!(r.stats().duplicates, 3);
        // The window moved past the gap: nothing kept above it.
        let state = r.lock();
        let from_10 = &state.incoming[&10];
        assert_eq!((from_10.below, from_10.above.len()), (seq(7, 5), 0));
        drop(state);
        // A new process in 10's place (incarnation 9) numbers from 1 again: all fresh, even
        // arriving before the old one's last resend, which is then dropped.
        assert!(!arrive(10, seq(9, 2)));
        assert!(!arrive(10, seq(9, 1)));
        assert!(
            arrive(10, seq(7, 5)),
            "a replaced incarnation's leftovers are dropped"
        );
        assert!(arrive(10, seq(9, 1)));
        assert!(!arrive(10, seq(9, 3)));
        // Unnumbered messages pass without an ack.
        let plain = r.received(&data(12, 8), MINE, 0);
        assert!(plain.ack.is_none() && !plain.duplicate);
    }

    #[test]
    fn messages_meant_for_or_sent_by_a_replaced_process_are_dropped_unacknowledged() {
        let r = Resender::new(Duration::from_secs(1), INC);
        let numbered = |from_inc: u64, n: u64, to: u64| {
            let mut msg = data(10, 8);
            msg.meta.seq = Some(Seq {
                number: seq(from_inc, n),
                to,
            });
            msg
        };
        // Meant for this process, or for whoever is there: taken and acknowledged.
        for (n, to) in [(1, MINE), (2, 0)] {
            let got = r.received(&numbered(7, n, to), MINE, 7);
            assert!(got.ack.is_some() && !got.duplicate);
        }
        // Meant for the process before this one: dropped, not acknowledged.
        let stale = r.received(&numbered(7, 3, MINE + 1), MINE, 7);
        assert!(stale.ack.is_none() && stale.duplicate);
        // From a process the table says was replaced (node 10 is now incarnation 9).
        let replaced = r.received(&numbered(7, 3, MINE), MINE, 9);
        assert!(replaced.ack.is_none() && replaced.duplicate);
        assert_eq!(r.stats().stale, 2);
        // The stale ones left the window alone: number 3 of incarnation 7 is still new.
        assert!(!r.received(&numbered(7, 3, MINE), MINE, 7).duplicate);
        // And a message is stamped with the incarnation it is meant for.
        let mut out = data(8, 10);
        r.retarget(10, 9);
        r.stamp(&mut out, Instant::now());
        assert_eq!(out.meta.seq.map(|s| s.to), Some(9));
    }

    #[test]
    fn a_new_process_in_the_recipients_place_gets_its_own_numbering_and_the_old_copies_go() {
        let r = Resender::new(Duration::from_secs(1), INC);
        let now = Instant::now();
        let send = || {
            let mut msg = data(8, 10);
            r.stamp(&mut msg, now);
            msg.meta.seq.map(|s| (s.number, s.to))
        };
        // Numbered for whoever is there until the table names the process; learning its
        // incarnation keeps what was sent.
        assert_eq!(send(), Some((seq(INC, 1), 0)));
        assert_eq!(r.retarget(10, 7), 0);
        assert_eq!(send(), Some((seq(INC, 2), 7)));
        assert_eq!(r.stats().unacked, 2);
        // The same incarnation again (the whole table re-sent): nothing changes.
        assert_eq!(r.retarget(10, 7), 0);
        assert_eq!(send(), Some((seq(INC, 3), 7)));
        // A new process (incarnation 9) took node 10's place: the three copies kept for the
        // old one go, numbering starts at 1 for the new one.
        assert_eq!(r.retarget(10, 9), 3);
        assert_eq!(r.stats().unacked, 0);
        assert_eq!(send(), Some((seq(INC, 1), 9)));
        // The old process's death, learnt late, leaves what is kept for the new one.
        r.forget(10, 7);
        assert_eq!(r.stats().unacked, 1);
        r.forget(10, 9);
        assert_eq!(r.stats().unacked, 0);
    }

    #[test]
    fn a_gap_that_never_fills_does_not_grow_the_window_without_bound() {
        let mut incoming = Incoming::default();
        // Number 1 never arrives; everything after it does.
        for n in 2..(ABOVE as u64 + 10) {
            assert!(incoming.insert(seq(7, n)));
        }
        assert!(incoming.above.len() <= ABOVE);
        // What moved below the window is taken as seen.
        assert!(!incoming.insert(seq(7, 2)));
        assert!(incoming.insert(seq(7, ABOVE as u64 + 10)));
    }
}
