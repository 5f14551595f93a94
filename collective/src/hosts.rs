//! Where a generation's ranks run: all on this host, on several hosts with the same number
//! of ranks each (the all-reduce then goes hierarchically: through each host's shared
//! memory, and between hosts by messages), or neither.
//!
//! Every rank works the placement out alike, from the node table (each node's host identity,
//! which includes its network namespace, and whether it has a shared-memory endpoint: what
//! the van selection asks of a peer) and the generation's members. Without shared memory
//! compiled in nothing asks.
#![cfg_attr(not(all(feature = "ipc", target_os = "linux")), allow(dead_code))]

use std::sync::Arc;

use node::Postoffice;
use van_core::{NodeId, VanKind};

/// Where a generation's ranks run.
#[derive(Clone, Debug)]
pub(crate) enum Placement {
    /// Every rank shares this host's memory.
    OneHost,
    /// Several hosts, each with the same number (2 or more) of ranks sharing its memory.
    Hosts(Arc<Hosts>),
    /// Neither (why, for the log): collectives go by messages.
    Apart(String),
}

/// A generation's ranks by host.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Hosts {
    /// Each host's ranks in rank order; the hosts in the order of their lowest rank.
    pub(crate) by_host: Vec<Vec<usize>>,
}

impl Hosts {
    /// The ranks of `rank`'s host (`rank` among them).
    pub(crate) fn local(&self, rank: usize) -> &[usize] {
        self.by_host
            .iter()
            .find(|h| h.contains(&rank))
            .map_or(&[], Vec::as_slice)
    }

    /// The ranks with `rank`'s place on their host, one per host, in host order (`rank`
    /// among them): they all-reduce that place's share between the hosts.
    pub(crate) fn across(&self, rank: usize) -> Vec<usize> {
        let place = self.local(rank).iter().position(|&q| q == rank);
        place.map_or_else(Vec::new, |i| {
            self.by_host
                .iter()
                .filter_map(|h| h.get(i).copied())
                .collect()
        })
    }
}

/// The ranks `0..n` grouped by `host[rank]` (an empty identity is a host of its own): each
/// group in rank order, the groups in the order of their lowest rank.
pub(crate) fn group_by_host(host: &[&str]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (rank, id) in host.iter().enumerate() {
        let same = groups
            .iter_mut()
            .find(|g| !id.is_empty() && g.first().is_some_and(|&q| host[q] == *id));
        match same {
            Some(g) => g.push(rank),
            None => groups.push(vec![rank]),
        }
    }
    groups
}

/// The placement of ranks grouped as `by_host` (see [`group_by_host`]).
pub(crate) fn of_groups(by_host: Vec<Vec<usize>>) -> Placement {
    let per_host = by_host.first().map_or(0, Vec::len);
    match by_host.len() {
        0 => Placement::Apart("no ranks".into()),
        1 if per_host >= 2 => Placement::OneHost,
        1 => Placement::Apart("one rank".into()),
        hosts if per_host < 2 => Placement::Apart(format!("{hosts} hosts with one rank each")),
        hosts if by_host.iter().any(|h| h.len() != per_host) => Placement::Apart(format!(
            "{hosts} hosts with {:?} ranks: not the same number on each",
            by_host.iter().map(Vec::len).collect::<Vec<_>>()
        )),
        _ => Placement::Hosts(Arc::new(Hosts { by_host })),
    }
}

/// The placement of `members` as this node's table has it; `Apart` when shared memory is
/// off, or a member has no shared-memory endpoint (or is not in the table).
pub(crate) fn placement(po: &Postoffice, members: &[NodeId]) -> Placement {
    if !po.config().enable_ipc {
        return Placement::Apart("shared memory is disabled".into());
    }
    let nodes = po.nodes();
    let mut host = Vec::with_capacity(members.len());
    for &m in members {
        match nodes.iter().find(|n| n.id == Some(m)) {
            Some(n) if n.endpoint(VanKind::Ipc).is_some() => host.push(n.host_identity.as_str()),
            Some(_) => return Placement::Apart(format!("node {m} has no shared-memory endpoint")),
            None => return Placement::Apart(format!("node {m} is not in the node table")),
        }
    }
    of_groups(group_by_host(&host))
}

/// How many of `members` run on this machine, whatever their network namespace: those
/// whose host identity begins with this node's boot id (the same kernel), so share its
/// cores (network namespaces made as test hosts on one machine, containers without their
/// own cores). A member missing from the table counts as elsewhere.
pub(crate) fn on_this_machine(po: &Postoffice, members: &[NodeId]) -> usize {
    let nodes = po.nodes();
    let boot = |id: NodeId| {
        let node = nodes.iter().find(|n| n.id == Some(id))?;
        let identity = node.host_identity.as_str();
        Some(identity.split('/').next().unwrap_or(identity).to_owned())
    };
    let mine = boot(po.my_id());
    members
        .iter()
        .filter(|&&m| mine.is_some() && boot(m) == mine)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(p: Placement) -> Arc<Hosts> {
        match p {
            Placement::Hosts(h) => h,
            other => panic!("expected hosts, got {other:?}"),
        }
    }

    #[test]
    fn ranks_group_by_host_in_rank_order() {
        let g = group_by_host(&["b", "a", "b", "a", "c", "c"]);
        assert_eq!(g, vec![vec![0, 2], vec![1, 3], vec![4, 5]]);
        let h = hosts(of_groups(g));
        assert_eq!(h.local(3), &[1, 3]);
        assert_eq!(h.across(3), vec![2, 3, 5]);
        assert_eq!(h.across(4), vec![0, 1, 4]);
        assert_eq!(h.local(9), &[] as &[usize]);
        assert!(h.across(9).is_empty());
    }

    #[test]
    fn only_even_hosts_of_two_or_more_go_hierarchically() {
        assert!(matches!(
            of_groups(group_by_host(&["a", "a", "a"])),
            Placement::OneHost
        ));
        for apart in [
            vec!["a"],
            vec!["a", "b"],
            vec!["a", "a", "b"],
            vec!["a", "", ""],
            vec![],
        ] {
            let p = of_groups(group_by_host(&apart));
            assert!(matches!(p, Placement::Apart(_)), "{apart:?}: {p:?}");
        }
        let h = hosts(of_groups(group_by_host(&["a", "a", "b", "b", "c", "c"])));
        assert_eq!(h.by_host, vec![vec![0, 1], vec![2, 3], vec![4, 5]]);
    }
}
