//! Registration: nodes join with `AddNode`; once every expected node has, ids are assigned
//! by sorted address and everyone is welcomed with the table. A registration re-sent after
//! that gets the table again.

use std::time::Instant;

use tracing::{debug, info, warn};
use van_core::{node_ids, Command, Control, Node, Role};

use super::output::{reply, Echo};
use super::{Output, Peer, Scheduler};

impl Scheduler {
    pub(super) fn on_add_node(
        &mut self,
        now: Instant,
        control: &Control,
        echo: Echo,
    ) -> Vec<Output> {
        let [node] = control.nodes.as_slice() else {
            warn!(
                nodes = control.nodes.len(),
                "AddNode must carry exactly one node"
            );
            return Vec::new();
        };
        if node.role == Role::Scheduler {
            warn!(%node, "ignoring the registration of another scheduler");
            return Vec::new();
        }
        let same = |known: &Node| {
            known.role == node.role && known.host == node.host && known.port == node.port
        };
        if self.is_ready() {
            if node.is_recovery {
                warn!(%node, "ignoring a recovery registration (not supported)");
                return Vec::new();
            }
            let Some(index) = self.table.iter().skip(1).position(same).map(|i| i + 1) else {
                warn!(%node, "ignoring a registration: the cluster is complete");
                return Vec::new();
            };
            let id = self.table[index].id.unwrap_or_default();
            match self.peers.get_mut(&id) {
                Some(peer) if !peer.dead => {
                    peer.last_seen = peer.last_seen.max(now);
                    peer.gone = false;
                }
                _ => {
                    warn!(%node, "ignoring a registration from a dead node");
                    return Vec::new();
                }
            }
            debug!(id, "registration re-sent; sending the table again");
            return self.welcome(index, echo);
        }
        if self.joining.iter().any(|(known, _)| same(known)) {
            debug!(%node, "duplicate registration ignored");
            return Vec::new();
        }
        let want = self.expected(node.role);
        let have = self
            .joining
            .iter()
            .filter(|(n, _)| n.role == node.role)
            .count();
        if have >= want {
            warn!(%node, want, "ignoring a registration beyond the expected count");
            return Vec::new();
        }
        let mut node = node.clone();
        node.id = None;
        node.is_recovery = false;
        info!(%node, "registered ({})", self.summary());
        self.joining.push((node, echo));
        if self.joining.len()
            < self
                .expected(Role::Server)
                .saturating_add(self.expected(Role::Worker))
        {
            return Vec::new();
        }
        self.assign_ids(now)
    }

    /// Everyone is here: assign ids by sorted address, build the table, welcome everyone.
    fn assign_ids(&mut self, now: Instant) -> Vec<Output> {
        let mut joining = std::mem::take(&mut self.joining);
        // Role orders Server before Worker, so the table comes out in id order.
        joining
            .sort_by_cached_key(|(n, _)| (n.role, n.host.clone(), n.port, n.host_identity.clone()));
        self.table = vec![self.me.clone()];
        let (mut servers, mut workers) = (0u32, 0u32);
        let mut echoes = Vec::with_capacity(joining.len());
        for (mut node, echo) in joining {
            let id = if node.role == Role::Server {
                servers += 1;
                node_ids::server_rank_to_id(servers - 1)
            } else {
                workers += 1;
                node_ids::worker_rank_to_id(workers - 1)
            };
            node.id = Some(id);
            let peer = Peer {
                index: self.table.len(),
                last_seen: now,
                leaving: false,
                gone: false,
                dead: false,
            };
            self.peers.insert(id, peer);
            self.table.push(node);
            echoes.push(echo);
        }
        info!(nodes = self.table.len(), "cluster complete, ids assigned");
        let mut out = Vec::with_capacity(2 * echoes.len());
        for (i, echo) in echoes.into_iter().enumerate() {
            out.extend(self.welcome(i + 1, echo));
        }
        out
    }

    /// Connect to the node at `index` of the table and send it the table.
    fn welcome(&self, index: usize, echo: Echo) -> Vec<Output> {
        let Some(node) = self.table.get(index) else {
            return Vec::new();
        };
        let control = Control {
            cmd: Command::AddNode,
            nodes: self.table.clone(),
            ..Control::default()
        };
        let id = node.id.unwrap_or_default();
        vec![Output::Connect(node.clone()), reply(id, control, echo)]
    }
}
