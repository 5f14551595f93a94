//! Point-to-point messaging between the ranks of a generation: the data messages that carry
//! a collective's slices (and the application's own sends and receives), and the mailbox that
//! holds them until their receiver asks.
//!
//! A data message is identified by its [`Key`]: generation, collective (or point-to-point)
//! number, sender, hop and slice. Every rank numbers the collectives of a generation alike, so
//! a receiver knows the key of the message it waits for before the message arrives; the
//! message also carries the collective's kind, element type and size, checked on receipt
//! ([`Op::check`]) because every rank must call the same collectives in the same order.
//! Point-to-point messages are numbered by the pair of ranks and the tag instead, so they meet
//! whatever collectives run meanwhile. The [`Mailbox`] holds the messages and counters of one
//! generation: when the next forms, its numbering starts again and the leftovers of the last
//! are dropped.

use std::collections::HashMap;

use bytes::Bytes;
use van_core::{Message, Meta, NodeId};

use super::generation::{Generation, APP_ID, FIRST_DATA_KIND};
use crate::error::{CollectiveError, Result};

/// Data messages: this plus the [`OpKind`].
const KIND_DATA: i32 = FIRST_DATA_KIND;

/// The `op` numbers of point-to-point messages: above every collective's.
const P2P_OP: u64 = 1 << 63;

/// The `op` numbers of a hierarchical all-reduce's exchanges between hosts: this plus the
/// collective's number (apart from the collectives' and the point-to-point messages', and
/// from the forming exchanges', which set bit 61 or 62).
pub(crate) const HIER_OP: u64 = 1 << 60;

/// The collective call an exchange numbered `number` belongs to: its number, for the
/// collectives' own exchanges and a hierarchical all-reduce's between hosts; `None` for the
/// forming exchanges and point-to-point messages.
pub(crate) fn call_of(number: u64) -> Option<u64> {
    (number >> 61 == 0).then_some(number & !HIER_OP)
}

/// Which collective a data message belongs to (checked on receipt: every rank must call
/// the same collectives in the same order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum OpKind {
    AllReduce = 0,
    Broadcast = 1,
    AllGather = 2,
    ReduceScatter = 3,
    Barrier = 4,
    AllToAll = 5,
    /// A point-to-point message ([`Mailbox::begin_p2p`]).
    PointToPoint = 6,
}

impl OpKind {
    fn from_head(head: i32) -> Option<OpKind> {
        Some(match head - KIND_DATA {
            0 => OpKind::AllReduce,
            1 => OpKind::Broadcast,
            2 => OpKind::AllGather,
            3 => OpKind::ReduceScatter,
            4 => OpKind::Barrier,
            5 => OpKind::AllToAll,
            6 => OpKind::PointToPoint,
            _ => return None,
        })
    }

    /// The kind a frame's header names, if any.
    pub(crate) fn from_frame(kind: i32) -> Option<OpKind> {
        OpKind::from_head(kind.checked_add(KIND_DATA)?)
    }

    /// The collective a call of this kind is, for the selection table (`None`: all-to-all
    /// and point-to-point messages have one way each).
    pub(crate) fn collective(self) -> Option<van_core::config::CollectiveKind> {
        use van_core::config::CollectiveKind as C;
        Some(match self {
            OpKind::AllReduce => C::AllReduce,
            OpKind::ReduceScatter => C::ReduceScatter,
            OpKind::AllGather => C::AllGather,
            OpKind::Broadcast => C::Broadcast,
            OpKind::Barrier => C::Barrier,
            OpKind::AllToAll | OpKind::PointToPoint => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "allreduce",
            OpKind::Broadcast => "broadcast",
            OpKind::AllGather => "all_gather",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::Barrier => "barrier",
            OpKind::AllToAll => "all_to_all",
            OpKind::PointToPoint => "send/recv",
        }
    }
}

/// A collective in progress on this node: its generation, members and number.
#[derive(Clone)]
pub(crate) struct Op {
    pub(crate) kind: OpKind,
    pub(crate) generation: u64,
    pub(crate) members: Vec<NodeId>,
    /// The generation rank of each member: `0..n` for the generation's own collectives; a
    /// part of them for an exchange among some ranks ([`Op::among`]), whose errors still
    /// name generation ranks.
    pub(crate) ranks: Vec<usize>,
    /// This node's place in `members`.
    pub(crate) rank: usize,
    pub(crate) number: u64,
    /// The element type's [`Element::TAG`](crate::Element::TAG).
    pub(crate) tag: u64,
    /// Elements in the whole buffer (the same on every rank; checked).
    pub(crate) total: usize,
    /// Bytes in the whole buffer.
    pub(crate) bytes: usize,
    /// An all-reduce's turn among those through shared memory (`crate::shm`), if it takes
    /// that path.
    pub(crate) shm_ticket: Option<u64>,
    /// With a ticket: the generation's ranks by host when they span several hosts, so the
    /// all-reduce goes through each host's shared memory and between hosts by messages
    /// (`crate::hosts`); `None` when they all share this host.
    #[cfg_attr(not(all(feature = "ipc", target_os = "linux")), allow(dead_code))]
    pub(crate) hosts: Option<std::sync::Arc<crate::hosts::Hosts>>,
}

impl Op {
    /// Collective `number` of `kind` in `generation`, where this node has `rank`.
    pub(super) fn new(kind: OpKind, generation: &Generation, rank: usize, number: u64) -> Op {
        Op {
            kind,
            generation: generation.number,
            members: generation.members.clone(),
            ranks: (0..generation.members.len()).collect(),
            rank,
            number,
            tag: 0,
            total: 0,
            bytes: 0,
            shm_ticket: None,
            hosts: None,
        }
    }

    /// An all-reduce of the same generation and ranks numbered `number`, outside the
    /// collectives' numbering (for exchanges a collective makes of its own accord, which
    /// every rank makes at the same point).
    #[cfg_attr(not(all(feature = "ipc", target_os = "linux")), allow(dead_code))]
    pub(crate) fn internal(&self, number: u64) -> Op {
        Op {
            kind: OpKind::AllReduce,
            number,
            tag: 0,
            total: 0,
            bytes: 0,
            shm_ticket: None,
            hosts: None,
            ..self.clone()
        }
    }

    /// An exchange numbered `number` among the ranks `ranks` of this op's generation (this
    /// node among them, each once, in the order given: the sub-op's rank `i` is
    /// `ranks[i]`), with this op's kind; `None` when this node is not among them.
    #[cfg_attr(not(all(feature = "ipc", target_os = "linux")), allow(dead_code))]
    pub(crate) fn among(&self, ranks: &[usize], number: u64) -> Option<Op> {
        let rank = ranks.iter().position(|&q| q == self.ranks[self.rank])?;
        let place = |q: usize| self.ranks.iter().position(|&p| p == q);
        let members = ranks
            .iter()
            .map(|&q| place(q).map(|i| self.members[i]))
            .collect::<Option<Vec<_>>>()?;
        Some(Op {
            members,
            ranks: ranks.to_vec(),
            rank,
            number,
            shm_ticket: None,
            hosts: None,
            ..self.clone()
        })
    }

    pub(crate) fn size(&self) -> usize {
        self.members.len()
    }

    /// The collective carries `total` elements of `T`.
    pub(crate) fn carrying<T: crate::Element>(mut self, total: usize) -> Op {
        self.tag = T::TAG;
        self.total = total;
        self.bytes = total.saturating_mul(std::mem::size_of::<T>());
        self
    }

    /// The key of the slice `slice` of hop `hop` the member of rank `from` sends.
    pub(super) fn key(&self, from: usize, hop: usize, slice: usize) -> Key {
        Key {
            generation: self.generation,
            op: self.number,
            from: self.members[from],
            hop: hop as i32,
            slice: slice as i32,
        }
    }

    /// The message from `me` that carries `data`, slice `slice` of hop `hop`, to the member of
    /// rank `to` (as the communicator `customer_id`).
    pub(super) fn message(
        &self,
        me: NodeId,
        customer_id: i32,
        to: usize,
        hop: usize,
        slice: usize,
        data: Bytes,
    ) -> Message {
        Message {
            meta: Meta {
                app_id: APP_ID,
                customer_id,
                sender: Some(me),
                recipient: Some(self.members[to]),
                head: KIND_DATA + self.kind as i32,
                key: self.generation,
                addr: self.number,
                request_id: hop as i32,
                option: slice as i32,
                priority: self.tag as i32,
                val_len: self.total as u64,
                data_types: [van_core::DataType::U8].into_iter().collect(),
                ..Meta::default()
            },
            data: [data].into_iter().collect(),
        }
    }

    /// A member the van cannot reach (its connection gone, refused, unknown) failed as far
    /// as this collective goes: named like a member the postoffice declared failed.
    pub(super) fn send_failed(&self, to: usize, error: node::NodeError) -> CollectiveError {
        use van_core::VanError;
        let failed = |reason: String| CollectiveError::RankFailed {
            node: self.members[to],
            rank: self.ranks[to],
            generation: self.generation,
            reason,
        };
        match error {
            node::NodeError::NodeFailed { reason, .. } => failed(reason),
            node::NodeError::Van(
                e @ (VanError::PeerGone { .. }
                | VanError::Connect { .. }
                | VanError::UnknownPeer { .. }),
            ) => failed(e.to_string()),
            other => other.into(),
        }
    }

    /// The error of a wait for the member of rank `from` that lasted `waited`.
    pub(super) fn timed_out(&self, from: usize, waited: std::time::Duration) -> CollectiveError {
        CollectiveError::RankFailed {
            node: self.members[from],
            rank: self.ranks[from],
            generation: self.generation,
            reason: format!(
                "no message of {} #{} within {waited:?} (VANS_COLLECTIVE_TIMEOUT)",
                self.kind.name(),
                self.number,
            ),
        }
    }

    /// The bytes of a slice received from rank `rank`, checked to be `len` bytes of this
    /// collective's kind, element type and total.
    pub(super) fn check(&self, rank: usize, len: usize, msg: Message) -> Result<Bytes> {
        let (head, tag, total) = (msg.meta.head, msg.meta.priority as u32, msg.meta.val_len);
        // Wrapping: a peer's garbage `head` is a mismatch, not an overflow.
        let data = msg.data.into_iter().next().unwrap_or_default();
        self.check_frame(rank, len, head.wrapping_sub(KIND_DATA), tag, total, data)
    }

    /// [`check`](Self::check) of what a frame from member `from` says: its kind (an
    /// [`OpKind`] number), element tag, total elements and payload.
    pub(crate) fn check_frame(
        &self,
        from: usize,
        len: usize,
        kind: i32,
        tag: u32,
        total: u64,
        data: impl Into<Bytes>,
    ) -> Result<Bytes> {
        let (node, rank) = (self.members[from], self.ranks[from]);
        let mismatch = |reason: String| CollectiveError::Mismatch { rank, node, reason };
        if OpKind::from_frame(kind) != Some(self.kind) {
            let theirs = OpKind::from_frame(kind).map_or("an unknown collective", OpKind::name);
            return Err(mismatch(format!(
                "it runs {theirs} as #{} where this rank runs {}",
                self.number,
                self.kind.name()
            )));
        }
        if u64::from(tag) != self.tag {
            return Err(mismatch(format!(
                "its {} of {total} elements is of {}, this rank's of {}",
                self.kind.name(),
                crate::element::tag_name(tag.into()),
                crate::element::tag_name(self.tag)
            )));
        }
        if total != self.total as u64 {
            return Err(mismatch(format!(
                "its {} buffer has {total} elements, this rank's {}",
                self.kind.name(),
                self.total
            )));
        }
        let data = data.into();
        if data.len() != len {
            return Err(mismatch(format!(
                "a slice of {} bytes where {len} were expected",
                data.len()
            )));
        }
        Ok(data)
    }
}

/// Identifies one data message: generation, collective, sender, hop and slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Key {
    generation: u64,
    op: u64,
    from: NodeId,
    hop: i32,
    slice: i32,
}

/// The data messages of a generation not yet taken, and the numbering of its collectives and
/// point-to-point messages.
#[derive(Default)]
pub(super) struct Mailbox {
    /// The generation the numbering is of.
    generation: u64,
    next_op: u64,
    /// Point-to-point messages of this generation begun, by (peer, tag, sending): the next
    /// one's sequence number. Both ends count alike, so the n-th send of a tag to a peer
    /// meets that peer's n-th receive of it, whatever else runs meanwhile.
    p2p: HashMap<(NodeId, i32, bool), u64>,
    /// Data messages not yet taken, by key.
    messages: HashMap<Key, Message>,
}

impl Mailbox {
    /// The mailbox as of `generation`, the current one: once a later generation forms, the
    /// numbering starts again and messages of earlier generations are dropped.
    pub(super) fn of(&mut self, generation: u64) -> &mut Mailbox {
        if generation > self.generation {
            self.generation = generation;
            self.next_op = 0;
            self.p2p.clear();
            self.messages.retain(|key, _| key.generation >= generation);
        }
        self
    }

    /// The number of the next collective.
    pub(super) fn begin_collective(&mut self) -> u64 {
        let number = self.next_op;
        self.next_op += 1;
        number
    }

    /// The number of the next point-to-point message with `peer` under `tag` (sending or
    /// receiving): counted per pair, not with the collectives, since the other ranks take no
    /// part.
    pub(super) fn begin_p2p(&mut self, peer: NodeId, tag: i32, sending: bool) -> u64 {
        let count = self.p2p.entry((peer, tag, sending)).or_insert(0);
        let number = P2P_OP | *count;
        *count += 1;
        number
    }

    /// Keeps a data message from `from` until its receiver takes it, unless it is of an
    /// earlier generation than this mailbox's.
    pub(super) fn put(&mut self, from: NodeId, msg: Message) {
        if msg.meta.key < self.generation {
            return;
        }
        let key = Key {
            generation: msg.meta.key,
            op: msg.meta.addr,
            from,
            hop: msg.meta.request_id,
            slice: msg.meta.option,
        };
        self.messages.insert(key, msg);
    }

    /// The message with `key`, if it has arrived.
    pub(super) fn take(&mut self, key: &Key) -> Option<Message> {
        self.messages.remove(key)
    }
}
