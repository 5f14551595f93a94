//! Which all-reduces of a generation go through shared memory, in what order, and the
//! generation's group once formed.

use std::sync::Arc;

use node::Postoffice;
use tracing::debug;
use van_core::NodeId;

use super::group::Group;
use crate::comm::OpKind;
use crate::hosts::{self, Hosts, Placement};
use crate::options::CommOptions;
use crate::select::{self, Algorithm, Layout};

/// The shared-memory state of the current generation: its tickets, whose turn it is, and
/// its group once formed.
#[derive(Default)]
pub(crate) struct Turns {
    generation: u64,
    /// Where the members run (worked out at the first collective that could take this path).
    placement: Option<Placement>,
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

    /// A ticket for a collective of `kind` on `bytes` of the generation, when it goes
    /// through shared memory: when [`select::choose`] picks `shm` for a generation on this
    /// host alone, or `hier` for one whose hosts each run the same number of ranks (with
    /// those hosts).
    pub(crate) fn ticket(
        &mut self,
        po: &Postoffice,
        members: &[NodeId],
        kind: OpKind,
        options: &CommOptions,
        bytes: usize,
    ) -> Option<(u64, Option<Arc<Hosts>>)> {
        let placement = self.placement.get_or_insert_with(|| {
            let placement = hosts::placement(po, members);
            if let Placement::Apart(why) = &placement {
                debug!("collectives of this generation go by messages: {why}");
            }
            placement
        });
        let collective = kind.collective()?;
        let layout = Layout::of(placement);
        let chosen = select::choose(options, collective, layout, bytes, members.len());
        let hosts = match (placement, chosen) {
            (Placement::OneHost, Algorithm::Shm) => None,
            (Placement::Hosts(hosts), Algorithm::Hier) => Some(Arc::clone(hosts)),
            _ => return None,
        };
        self.issued += 1;
        Some((self.issued - 1, hosts))
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
