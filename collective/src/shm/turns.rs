//! Which all-reduces of a generation go through shared memory, in what order, and the
//! generation's group once formed.

use std::sync::Arc;

use node::Postoffice;
use van_core::{NodeId, VanKind};

use super::group::Group;

/// Whether every member of a generation shares this host's memory with this node: the same
/// host identity and a shared-memory endpoint, as the van selection asks of a peer (so
/// every rank decides alike from the node table).
pub(crate) fn eligible(po: &Postoffice, members: &[NodeId]) -> bool {
    if !po.config().enable_ipc || members.len() < 2 {
        return false;
    }
    let nodes = po.nodes();
    let find = |id: NodeId| nodes.iter().find(|n| n.id == Some(id));
    let Some(me) = find(po.my_id()) else {
        return false;
    };
    members.iter().all(|&m| {
        find(m).is_some_and(|peer| {
            van_core::select::same_host(me, peer) && peer.endpoint(VanKind::Ipc).is_some()
        })
    })
}

/// The shared-memory state of the current generation: its tickets, whose turn it is, and
/// its group once formed.
#[derive(Default)]
pub(crate) struct Turns {
    generation: u64,
    /// Whether every member shares this host (worked out at the first all-reduce).
    eligible: Option<bool>,
    issued: u64,
    turn: u64,
    pub(crate) group: Formed,
}

/// A generation's group: not formed yet, formed, or not to be had (and why).
#[derive(Default, Clone)]
pub(crate) enum Formed {
    #[default]
    NotYet,
    Ready(Arc<Group>),
    Unavailable(String),
}

impl Turns {
    /// The state of `generation`, the current one: a later generation starts afresh (and the
    /// last one's group goes once its in-flight collectives let go of it).
    pub(crate) fn of(&mut self, generation: u64) -> &mut Turns {
        if generation > self.generation {
            // The last generation is over: its waiters on every rank of the host stop now.
            if let Formed::Ready(group) = &self.group {
                group.abort(None);
            }
            *self = Turns {
                generation,
                ..Turns::default()
            };
        }
        self
    }

    /// The state of `generation` when it is still this one's (not for a generation that a
    /// later one replaced).
    pub(crate) fn exactly(&mut self, generation: u64) -> Option<&mut Turns> {
        let turns = self.of(generation);
        (turns.generation == generation).then_some(turns)
    }

    /// A ticket for an all-reduce of the generation when its members share this host.
    pub(crate) fn ticket(&mut self, po: &Postoffice, members: &[NodeId]) -> Option<u64> {
        if !*self.eligible.get_or_insert_with(|| eligible(po, members)) {
            return None;
        }
        self.issued += 1;
        Some(self.issued - 1)
    }

    /// Whether it is `ticket`'s turn.
    pub(crate) fn is_turn(&self, ticket: u64) -> bool {
        self.turn == ticket
    }

    /// `ticket` is done: the next may run.
    pub(crate) fn done(&mut self, generation: u64, ticket: u64) {
        if self.generation == generation && self.turn == ticket {
            self.turn += 1;
        }
    }

    /// The group of `generation`, if formed, to stop its waiters.
    pub(crate) fn group(&self, generation: u64) -> Option<&Arc<Group>> {
        match &self.group {
            Formed::Ready(g) if self.generation == generation => Some(g),
            _ => None,
        }
    }
}
