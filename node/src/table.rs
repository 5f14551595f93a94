//! The node table as a node holds it: one shared allocation and a lookup by id.
//!
//! The scheduler sends the same table to every node. Over a network each node decodes its
//! own copy; in one process (the in-process van moves messages) every node keeps the very
//! table the scheduler built, so 10,000 nodes hold one table, not 10,000 (each of 10,000
//! nodes, 3 GB). A lookup bisects the scheduler's order (scheduler, servers by id, workers
//! by id) instead of building a map per node.

use std::sync::Arc;

use van_core::{node_ids, Node, NodeId, Role};

/// A node table: scheduler, servers by id, workers by id (any order is accepted; lookups in
/// another order scan). Cheap to clone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeTable {
    nodes: Arc<[Node]>,
    /// Whether `nodes` is in the scheduler's order, `(role, id)`, and every id's role is the
    /// one its number says ([`node_ids::role_of`]): then a lookup bisects.
    ordered: bool,
}

impl NodeTable {
    /// The table `nodes`, shared as it is.
    pub fn new(nodes: Arc<[Node]>) -> NodeTable {
        let ordered = nodes.is_sorted_by_key(order)
            && nodes
                .iter()
                .all(|n| n.id.is_some_and(|id| node_ids::role_of(id) == Some(n.role)));
        NodeTable { nodes, ordered }
    }

    /// The node with this id.
    pub fn get(&self, id: NodeId) -> Option<&Node> {
        if self.ordered {
            let role = node_ids::role_of(id)?;
            let at = self
                .nodes
                .binary_search_by_key(&(role, Some(id)), order)
                .ok()?;
            return self.nodes.get(at);
        }
        self.nodes.iter().find(|n| n.id == Some(id))
    }

    /// The nodes, in the table's order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The shared allocation, for a message that carries the table.
    pub fn shared(&self) -> Arc<[Node]> {
        Arc::clone(&self.nodes)
    }

    /// A copy with `node` in place of the entry with its id (a recovery: rare), or added at
    /// its place in the order when the table has none.
    pub fn with(&self, node: Node) -> NodeTable {
        let mut nodes = self.nodes.to_vec();
        match nodes.iter_mut().find(|n| n.id.is_some() && n.id == node.id) {
            Some(known) => *known = node,
            None => {
                let at = nodes.partition_point(|n| order(n) <= order(&node));
                nodes.insert(at, node);
            }
        }
        NodeTable::new(nodes.into())
    }
}

/// The scheduler's order.
fn order(node: &Node) -> (Role, Option<NodeId>) {
    (node.role, node.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(role: Role, id: NodeId) -> Node {
        Node::new(role, "10.0.0.1", 9000 + id as u16).with_id(id)
    }

    fn scheduler_order(servers: u32, workers: u32) -> Vec<Node> {
        let mut nodes = vec![node(Role::Scheduler, node_ids::SCHEDULER)];
        nodes.extend((0..servers).map(|r| node(Role::Server, node_ids::server_rank_to_id(r))));
        nodes.extend((0..workers).map(|r| node(Role::Worker, node_ids::worker_rank_to_id(r))));
        nodes
    }

    #[test]
    fn finds_every_node_of_the_schedulers_order_and_no_other() {
        let table = NodeTable::new(scheduler_order(3, 5).into());
        assert!(table.ordered);
        for n in table.nodes() {
            let id = n.id.unwrap_or_default();
            assert_eq!(table.get(id), Some(n), "node {id}");
        }
        assert_eq!(table.get(node_ids::server_rank_to_id(3)), None);
        assert_eq!(table.get(node_ids::worker_rank_to_id(5)), None);
        assert_eq!(table.get(node_ids::WORKER_GROUP), None);
    }

    #[test]
    fn any_other_order_is_scanned() {
        let mut nodes = scheduler_order(2, 2);
        nodes.reverse();
        // A node whose id says another role than its own.
        nodes.push(node(Role::Server, node_ids::worker_rank_to_id(7)));
        let table = NodeTable::new(nodes.clone().into());
        assert!(!table.ordered);
        for n in &nodes {
            assert_eq!(table.get(n.id.unwrap_or_default()), Some(n));
        }
    }

    #[test]
    fn with_replaces_or_inserts_in_order_and_leaves_the_original() {
        let table = NodeTable::new(scheduler_order(2, 2).into());
        let worker = node_ids::worker_rank_to_id(1);
        let mut moved = node(Role::Worker, worker);
        moved.port = 1;
        let replaced = table.with(moved.clone());
        assert_eq!(replaced.get(worker), Some(&moved));
        assert_ne!(table.get(worker), Some(&moved), "copy on write");
        let new_server = node(Role::Server, node_ids::server_rank_to_id(2));
        let grown = replaced.with(new_server.clone());
        assert!(grown.ordered, "inserted at its place in the order");
        assert_eq!(grown.nodes().len(), 6);
        assert_eq!(grown.get(node_ids::server_rank_to_id(2)), Some(&new_server));
    }
}
