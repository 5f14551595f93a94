//! The scheduler's state machine driven through its public calls on a simulated clock:
//! registration orders, barriers, heartbeats, broken connections, termination, and
//! malformed input.

use super::*;
use proptest::prelude::*;

const TIMEOUT: Duration = Duration::from_secs(10);
const MS: Duration = Duration::from_millis(1);
use Command::{AddNode, Barrier, Heartbeat, NodeFailure, Terminate};

mod finalize;

fn me() -> Node {
    Node::new(Role::Scheduler, "10.0.0.1", 9000)
}

fn fresh(servers: u16, workers: u16, heartbeat_timeout: Option<Duration>) -> Scheduler {
    with_grace(servers, workers, heartbeat_timeout, Duration::ZERO)
}

/// [`fresh`], with a replacement grace for `finalize`'s barrier.
fn with_grace(
    servers: u16,
    workers: u16,
    heartbeat_timeout: Option<Duration>,
    replacement_grace: Duration,
) -> Scheduler {
    let (num_servers, num_workers) = (servers.into(), workers.into());
    let config = SchedulerConfig {
        num_workers,
        num_servers,
        heartbeat_timeout,
        replacement_grace,
    };
    Scheduler::new(config, me())
}

/// Servers then workers; addresses deliberately not in id order.
fn nodes(servers: u16, workers: u16) -> Vec<Node> {
    let make = |role, i: u16| {
        let mut node = Node::new(role, format!("10.0.0.{}", 9 - i % 3), 7000 - i);
        node.host_identity = format!("boot-{}", i % 3);
        node
    };
    let workers = (0..workers).map(|i| make(Role::Worker, 100 + i));
    (0..servers)
        .map(|i| make(Role::Server, i))
        .chain(workers)
        .collect()
}

fn message(sender: Option<NodeId>, cmd: Command, group: i32, nodes: Vec<Node>) -> Message {
    let mut control = Control::command(cmd);
    (control.barrier_group, control.nodes) = (group, nodes.into());
    let mut msg = Message::default();
    (msg.meta.sender, msg.meta.request, msg.meta.control) = (sender, true, Some(control));
    msg
}

fn add_node(node: &Node) -> Message {
    message(None, AddNode, 0, vec![node.clone()])
}

fn request(from: NodeId, cmd: Command, group: i32) -> Message {
    message(Some(from), cmd, group, Vec::new())
}

/// A scheduler whose `servers` and `workers` all joined at `t0`.
fn ready(servers: u16, workers: u16, timeout: Option<Duration>, t0: Instant) -> Scheduler {
    let mut s = fresh(servers, workers, timeout);
    for node in nodes(servers, workers) {
        s.handle(t0, &add_node(&node));
    }
    assert!(s.is_ready());
    s
}

/// (recipient, command, group, ids of control.nodes) of each Send; no Connect allowed.
fn sends(out: &[Output]) -> Vec<(NodeId, Command, i32, Vec<NodeId>)> {
    let summarize = |o: &Output| match o {
        Output::Send(m) => {
            assert_eq!((m.meta.sender, m.meta.request), (Some(1), false));
            let c = m.meta.control.clone().unwrap();
            let ids = c.nodes.iter().map(|n| n.id.unwrap()).collect();
            (m.meta.recipient.unwrap(), c.cmd, c.barrier_group, ids)
        }
        Output::Connect(n) => panic!("unexpected connect to {n}"),
    };
    out.iter().map(summarize).collect()
}

fn barrier(s: &mut Scheduler, now: Instant, from: NodeId, group: i32) -> Vec<Output> {
    s.handle(now, &request(from, Barrier, group))
}

/// Checks the welcome of every node: Connect(node) then the table, in table order.
fn assert_welcomes(out: &[Output], table: &[Node]) {
    assert_eq!(out.len(), 2 * (table.len() - 1));
    for (pair, node) in out.chunks(2).zip(&table[1..]) {
        assert_eq!(pair[0], Output::Connect(node.clone()));
        let Output::Send(m) = &pair[1] else {
            panic!("expected a send")
        };
        assert_eq!(m.meta.recipient, node.id);
        let c = m.meta.control.as_ref().unwrap();
        assert_eq!((c.cmd, &c.nodes[..]), (AddNode, table));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn join_order_does_not_change_ids_or_table(
        order in Just((0..8usize).collect::<Vec<_>>()).prop_shuffle()
    ) {
        let t0 = Instant::now();
        let all = nodes(3, 5);
        let mut s = fresh(3, 5, Some(TIMEOUT));
        for (k, &i) in order.iter().enumerate() {
            let out = s.handle(t0, &add_node(&all[i]));
            if k + 1 < order.len() {
                prop_assert!(out.is_empty() && !s.is_ready() && s.table().is_empty());
            } else {
                assert_welcomes(&out, s.table());
            }
        }
        // Each role sorted by (host, port, host_identity), ids 8, 10, … and 9, 11, ….
        let mut expected = vec![me().with_id(1)];
        for (role, first) in [(Role::Server, 8), (Role::Worker, 9)] {
            let mut group: Vec<Node> = all.iter().filter(|n| n.role == role).cloned().collect();
            group.sort_by_key(|n| (n.host.clone(), n.port, n.host_identity.clone()));
            let ids = (first..).step_by(2);
            expected.extend(group.into_iter().zip(ids).map(|(n, id)| n.with_id(id)));
        }
        prop_assert_eq!(s.table(), expected.as_slice());
    }

    #[test]
    fn arbitrary_control_messages_never_panic(
        cmd in 0usize..7, sender in proptest::option::of(-3i32..20), group in -2i32..10,
        request_flag: bool, with_control: bool, secs in 0u64..30,
    ) {
        let t0 = Instant::now();
        let mut s = ready(2, 2, Some(TIMEOUT), t0);
        let cmds = [Command::Empty, Terminate, AddNode, Barrier, Command::Ack, Heartbeat,
            NodeFailure];
        let mut msg = message(sender, cmds[cmd], group, nodes(1, 1));
        msg.meta.request = request_flag;
        if !with_control { msg.meta.control = None; }
        let now = t0 + Duration::from_secs(secs);
        let _ = s.handle(now, &msg);
        let _ = s.tick(now);
        let _ = s.peer_lost(now, sender.unwrap_or(0), "test");
    }
}

#[test]
fn duplicate_registration_is_idempotent_and_resend_after_ready_gets_the_table() {
    let t0 = Instant::now();
    let mut s = fresh(1, 1, None);
    let all = nodes(1, 1);
    assert!(s.handle(t0, &add_node(&all[0])).is_empty());
    assert!(s.handle(t0, &add_node(&all[0])).is_empty());
    assert!(
        !s.is_ready(),
        "a duplicate must not count as the missing worker"
    );
    assert_welcomes(&s.handle(t0, &add_node(&all[1])), s.table());
    // Re-sent after ready: that node gets Connect + the table again, nobody else.
    let out = s.handle(t0, &add_node(&all[1]));
    assert_eq!(out[0], Output::Connect(s.table()[2].clone()));
    assert_eq!(sends(&out[1..]), [(9, AddNode, 0, vec![1, 8, 9])]);
    // A stranger after ready waits for a place (nobody is dead): no answer yet. A node's
    // own claim to be recovering changes nothing: the scheduler decides.
    let stranger = Node::new(Role::Worker, "x", 1);
    assert!(s.handle(t0, &add_node(&stranger)).is_empty());
    let mut recovering = all[1].clone();
    recovering.is_recovery = true;
    assert_eq!(
        sends(&s.handle(t0, &add_node(&recovering))[1..]),
        [(9, AddNode, 0, vec![1, 8, 9])]
    );
}

/// A registration from process `incarnation`.
fn add_node_from(node: &Node, incarnation: u64) -> Message {
    let mut node = node.clone();
    node.incarnation = incarnation;
    add_node(&node)
}

/// A scheduler of 1 server and 2 workers whose nodes registered as incarnations 100, 101, 102.
fn ready_with_incarnations(t0: Instant) -> Scheduler {
    let mut s = fresh(1, 2, Some(TIMEOUT));
    for (i, node) in nodes(1, 2).iter().enumerate() {
        s.handle(t0, &add_node_from(node, 100 + i as u64));
    }
    assert!(s.is_ready());
    s
}

/// `from`'s heartbeat, naming the process (`incarnation`) that sends it.
fn heartbeat_from(from: NodeId, incarnation: u64) -> Message {
    let mut me = Node::new(Role::Worker, "", 0).with_id(from);
    me.incarnation = incarnation;
    message(Some(from), Heartbeat, 0, vec![me])
}

#[test]
fn requests_of_a_replaced_process_are_ignored_and_keep_nobody_alive() {
    let t0 = Instant::now();
    // Server 8, workers 9 and 11, each its own incarnation.
    let mut s = ready_with_incarnations(t0);
    let [old, server, other] = [9, 8, 11].map(|id| s.node(id).unwrap().incarnation);
    // Worker 9 dies; a new process (incarnation 900) takes its place.
    s.peer_lost(t0, 9, "reset");
    let fresh = Node::new(Role::Worker, "10.0.0.77", 7777);
    s.handle(t0, &add_node_from(&fresh, 900));
    assert!(s.dead().is_empty());
    // The old process's heartbeats (a partition healed, its queue flushed) are no one's:
    // unanswered, and the new process, silent, is declared dead at the timeout.
    let mut now = t0;
    while now < t0 + TIMEOUT {
        now += Duration::from_secs(2);
        assert!(s.handle(now, &heartbeat_from(9, old)).is_empty());
        for (id, incarnation) in [(8, server), (11, other)] {
            assert_eq!(s.handle(now, &heartbeat_from(id, incarnation)).len(), 1);
        }
    }
    let out = s.tick(now + MS);
    assert_eq!(s.dead(), [9], "{out:?}");
    // The new process's own heartbeat, before that, is answered.
    let mut s = ready_with_incarnations(t0);
    s.peer_lost(t0, 9, "reset");
    s.handle(t0, &add_node_from(&fresh, 900));
    assert_eq!(
        sends(&s.handle(t0, &heartbeat_from(9, 900))),
        [(9, Heartbeat, 0, vec![])]
    );
}

/// The recovery notice every live node gets, then the welcome of the recovered node.
fn assert_recovery(out: &[Output], id: NodeId, told: &[NodeId], table: &[Node]) {
    let notices = &out[..told.len()];
    assert_eq!(
        sends(notices),
        told.iter()
            .map(|&to| (to, AddNode, 0, vec![id]))
            .collect::<Vec<_>>()
    );
    for notice in notices {
        let Output::Send(m) = notice else {
            panic!("expected a send")
        };
        let node = &m.meta.control.as_ref().unwrap().nodes[0];
        assert!(node.is_recovery, "the notice marks the node as recovering");
    }
    let entry = table.iter().find(|n| n.id == Some(id)).unwrap();
    assert!(entry.is_recovery);
    assert_eq!(out[told.len()], Output::Connect(entry.clone()));
    assert_eq!(
        sends(&out[told.len() + 1..]),
        [(id, AddNode, 0, vec![1, 8, 9, 11])]
    );
}

#[test]
fn a_new_process_takes_the_place_of_a_dead_node_of_its_role() {
    let t0 = Instant::now();
    let mut s = ready_with_incarnations(t0);
    // Worker 11 dies; the others keep beating.
    s.handle(t0 + TIMEOUT / 2, &request(8, Heartbeat, 0));
    s.handle(t0 + TIMEOUT / 2, &request(9, Heartbeat, 0));
    s.tick(t0 + TIMEOUT);
    assert_eq!(s.dead(), [11]);
    // A new worker process at a new address takes id 11.
    let newcomer = Node::new(Role::Worker, "10.0.0.77", 7777);
    let now = t0 + TIMEOUT + MS;
    let out = s.handle(now, &add_node_from(&newcomer, 555));
    assert_recovery(&out, 11, &[1, 8, 9], s.table());
    assert_eq!(
        s.node(11).map(|n| (n.host.as_str(), n.port)),
        Some(("10.0.0.77", 7777))
    );
    assert!(s.dead().is_empty());
    // It is watched again, and re-sending its registration only gets the table again.
    assert_eq!(s.next_deadline(), Some(t0 + TIMEOUT / 2 + TIMEOUT));
    let again = s.handle(now, &add_node_from(&newcomer, 555));
    assert_eq!(sends(&again[1..]), [(11, AddNode, 0, vec![1, 8, 9, 11])]);
    // A server cannot take a worker's place: it waits.
    let server = Node::new(Role::Server, "10.0.0.78", 7778);
    assert!(s.handle(now, &add_node_from(&server, 556)).is_empty());
}

#[test]
fn a_restart_at_the_same_address_buries_the_old_process_then_recovers() {
    let t0 = Instant::now();
    let mut s = ready_with_incarnations(t0);
    let worker = s.node(9).unwrap().clone();
    // The same process re-sending: the table again, nothing else.
    let incarnation = s.peers[&9].incarnation;
    assert!((100..=102).contains(&incarnation));
    let resent = s.handle(t0, &add_node_from(&worker, incarnation));
    assert_eq!(sends(&resent[1..]), [(9, AddNode, 0, vec![1, 8, 9, 11])]);
    // Another process at worker 9's address: 9 is declared dead (the others told, not the
    // new process), then recovered.
    let out = s.handle(t0, &add_node_from(&worker, 999));
    let (failure, recovery) = out.split_at(3);
    assert_eq!(
        sends(failure),
        [
            (1, NodeFailure, 0, vec![9]),
            (8, NodeFailure, 0, vec![9]),
            (11, NodeFailure, 0, vec![9])
        ]
    );
    assert_recovery(recovery, 9, &[1, 8, 11], s.table());
    assert!(s.dead().is_empty());
}

#[test]
fn a_registration_with_no_place_waits_for_a_node_of_its_role_to_die() {
    let t0 = Instant::now();
    let mut s = ready_with_incarnations(t0);
    let early = Node::new(Role::Worker, "10.0.0.90", 9090);
    assert!(
        s.handle(t0, &add_node_from(&early, 7)).is_empty(),
        "nobody to replace yet"
    );
    assert!(
        s.handle(t0, &add_node_from(&early, 7)).is_empty(),
        "re-sent: still waiting"
    );
    // Worker 9's connection breaks: it is declared dead and the waiting one takes its place.
    let out = s.peer_lost(t0 + MS, 9, "reset");
    let (failure, recovery) = out.split_at(4);
    assert!(sends(failure)
        .iter()
        .all(|(_, cmd, _, dead)| *cmd == NodeFailure && dead == &[9]));
    assert_recovery(recovery, 9, &[1, 8, 11], s.table());
    assert_eq!(s.node(9).map(|n| n.port), Some(9090));
    // Only as many wait as the role has members; more are refused.
    let mut s = ready_with_incarnations(t0);
    for port in 1..=2 {
        assert!(s
            .handle(t0, &add_node_from(&Node::new(Role::Worker, "w", port), 0))
            .is_empty());
    }
    assert!(s
        .handle(t0, &add_node_from(&Node::new(Role::Worker, "w", 3), 0))
        .is_empty());
    assert_eq!(s.waiting.len(), 2);
}

#[test]
fn extra_and_scheduler_registrations_are_ignored() {
    let t0 = Instant::now();
    let mut s = fresh(1, 2, None);
    let all = nodes(2, 2);
    assert!(s.handle(t0, &add_node(&all[0])).is_empty());
    assert!(
        s.handle(t0, &add_node(&all[1])).is_empty(),
        "one server too many"
    );
    let other = Node::new(Role::Scheduler, "10.0.0.2", 9000);
    assert!(s.handle(t0, &add_node(&other)).is_empty());
    assert!(s.handle(t0, &add_node(&all[2])).is_empty());
    assert_eq!(s.handle(t0, &add_node(&all[3])).len(), 6);
    assert_eq!(s.table().len(), 4);
    assert!(
        fresh(0, 0, None).is_ready(),
        "an empty cluster is ready at once"
    );
}

#[test]
fn summary_names_missing_counts_per_role() {
    let t0 = Instant::now();
    let mut s = fresh(2, 3, None);
    let all = nodes(2, 3);
    let nobody = "0/2 servers, 0/3 workers joined; waiting for 2 servers and 3 workers";
    assert_eq!(s.summary(), nobody);
    for node in &all[1..] {
        s.handle(t0, &add_node(node));
    }
    let partial = "1/2 servers, 3/3 workers joined; waiting for 1 server";
    assert_eq!(s.summary(), partial);
    s.handle(t0, &add_node(&all[0]));
    assert_eq!(s.summary(), "2/2 servers, 3/3 workers joined");
    s.peer_lost(t0, 9, "reset");
    assert_eq!(s.summary(), "2/2 servers, 3/3 workers joined; dead: [9]");
}

#[test]
fn barriers_release_only_when_the_last_member_arrives_and_only_to_members() {
    let t0 = Instant::now();
    let mut s = ready(2, 3, Some(TIMEOUT), t0);
    let cases: [(i32, &[NodeId]); 4] = [
        (2, &[8, 10]),
        (4, &[9, 11, 13]),
        (6, &[8, 10, 9, 11, 13]),
        (7, &[1, 8, 10, 9, 11, 13]),
    ];
    for (group, members) in cases {
        let (&last, first) = members.split_last().unwrap();
        for &id in first {
            assert!(barrier(&mut s, t0, id, group).is_empty(), "{group}: {id}");
            assert!(
                barrier(&mut s, t0, id, group).is_empty(),
                "duplicates count once"
            );
        }
        let mut got = sends(&barrier(&mut s, t0, last, group));
        got.sort_unstable_by_key(|(to, ..)| *to);
        let mut want: Vec<_> = members
            .iter()
            .map(|&m| (m, Barrier, group, vec![]))
            .collect();
        want.sort_unstable_by_key(|(to, ..)| *to);
        assert_eq!(got, want);
        // The count was reset: a new round waits again.
        assert!(barrier(&mut s, t0, last, group).is_empty());
    }
}

#[test]
fn invalid_barriers_are_ignored() {
    let t0 = Instant::now();
    assert!(
        barrier(&mut fresh(1, 1, None), t0, 1, 1).is_empty(),
        "before ready"
    );
    let mut s = ready(1, 1, None, t0);
    for group in [0, -1, 8, 9] {
        assert!(barrier(&mut s, t0, 8, group).is_empty(), "group {group}");
    }
    assert!(
        barrier(&mut s, t0, 9, 2).is_empty(),
        "a worker is no server"
    );
    let mut anonymous = request(8, Barrier, 2);
    anonymous.meta.sender = None;
    assert!(s.handle(t0, &anonymous).is_empty());
    assert!(s.barriers.is_empty());
    assert_eq!(
        barrier(&mut s, t0, 8, 2).len(),
        1,
        "a lone server releases itself"
    );
}

#[test]
fn pending_barrier_fails_when_a_member_stops_its_heartbeat() {
    let t0 = Instant::now();
    let mut s = ready(2, 2, Some(TIMEOUT), t0);
    for id in [8, 9, 11] {
        assert!(barrier(&mut s, t0, id, 6).is_empty());
    }
    // Everyone but server 10 keeps beating.
    let mut now = t0;
    while now < t0 + TIMEOUT {
        now += Duration::from_secs(2);
        for id in [8, 9, 11] {
            // Answered (only) to the node that beat.
            assert_eq!(
                sends(&s.handle(now, &request(id, Heartbeat, 0))),
                [(id, Heartbeat, 0, vec![])]
            );
        }
    }
    let notice = |to| (to, NodeFailure, 0, vec![10]);
    let failed = |to| (to, Barrier, 6, vec![10]);
    // The dead node itself is told too (best effort), in table order.
    let want = [
        notice(1),
        notice(8),
        notice(10),
        notice(9),
        notice(11),
        failed(8),
        failed(9),
        failed(11),
    ];
    assert_eq!(sends(&s.tick(now + MS)), want);
    assert_eq!(s.dead(), [10]);
    // A new barrier with the dead member fails at once, to the requester only.
    assert_eq!(sends(&barrier(&mut s, now, 9, 2 | 4)), [failed(9)]);
    assert!(
        barrier(&mut s, now, 11, 4).is_empty(),
        "group 4 has no dead member"
    );
    // The dead stay dead, and are not declared again; a dead node that speaks is told.
    assert_eq!(
        sends(&s.handle(now, &request(10, Heartbeat, 0))),
        [notice(10)]
    );
    let later = sends(&s.tick(now + TIMEOUT));
    assert!(!later.is_empty() && later.iter().all(|(.., dead)| !dead.contains(&10)));
}

#[test]
fn silent_node_is_declared_dead_once_and_only_after_the_timeout() {
    let t0 = Instant::now();
    let mut s = ready(1, 1, Some(TIMEOUT), t0);
    assert_eq!(s.next_deadline(), Some(t0 + TIMEOUT));
    assert!(s.tick(t0 + TIMEOUT - MS).is_empty());
    s.handle(t0 + TIMEOUT - MS, &request(8, Heartbeat, 0));
    let notice = |to, dead| (to, NodeFailure, 0, vec![dead]);
    assert_eq!(
        sends(&s.tick(t0 + TIMEOUT + MS)),
        [notice(1, 9), notice(8, 9), notice(9, 9)]
    );
    assert!(
        s.tick(t0 + 2 * TIMEOUT - 2 * MS).is_empty(),
        "declared once"
    );
    assert_eq!(s.next_deadline(), Some(t0 + 2 * TIMEOUT - MS));
    assert_eq!(
        sends(&s.tick(t0 + 2 * TIMEOUT - MS)),
        [notice(1, 8), notice(8, 8)]
    );
    assert_eq!((s.dead(), s.next_deadline()), (vec![8, 9], None));
}

#[test]
fn heartbeats_and_any_message_keep_nodes_alive_and_no_timeout_never_kills() {
    let t0 = Instant::now();
    let mut s = ready(1, 1, Some(TIMEOUT), t0);
    for step in 1..100u32 {
        let now = t0 + step * TIMEOUT / 3;
        s.handle(now, &request(8, Heartbeat, 0));
        // The worker only ever sends barriers; that is a sign of life too.
        barrier(&mut s, now, 9, 4);
        assert!(s.tick(now + MS).is_empty());
    }
    let mut silent = ready(1, 1, None, t0);
    assert_eq!(silent.next_deadline(), None);
    assert!(silent.tick(t0 + 1000 * TIMEOUT).is_empty());
    assert!(silent.dead().is_empty());
}

#[test]
fn peer_lost_kills_at_once_except_leaving_nodes() {
    let t0 = Instant::now();
    let mut s = ready(1, 2, Some(TIMEOUT), t0);
    let notice = |to| (to, NodeFailure, 0, vec![11]);
    assert_eq!(
        sends(&s.peer_lost(t0, 11, "reset")),
        [notice(1), notice(8), notice(9), notice(11)]
    );
    assert!(s.peer_lost(t0, 11, "again").is_empty(), "dead once");
    assert!(s.peer_lost(t0, 42, "unknown").is_empty());
    assert!(s.peer_lost(t0, 1, "myself").is_empty());
    s.handle(t0, &request(9, Terminate, 0));
    assert!(s.peer_lost(t0, 9, "closed after terminate").is_empty());
    let later = sends(&s.tick(t0 + 2 * TIMEOUT));
    assert_eq!(
        later,
        [(1, NodeFailure, 0, vec![8]), (8, NodeFailure, 0, vec![8])],
        "9 is gone, not dead"
    );
    assert_eq!(s.dead(), [8, 11]);
}

#[test]
fn leaving_node_that_disconnects_no_longer_holds_a_barrier() {
    let t0 = Instant::now();
    let mut s = ready(1, 2, None, t0);
    let mut req = request(9, Barrier, 4);
    (req.meta.customer_id, req.meta.request_id) = (3, 42);
    assert!(s.handle(t0, &req).is_empty());
    s.handle(t0, &request(11, Terminate, 0));
    let out = s.peer_lost(t0, 11, "closed");
    assert_eq!(sends(&out), [(9, Barrier, 4, vec![])]);
    let Output::Send(release) = &out[0] else {
        panic!("expected a send")
    };
    assert_eq!(
        (release.meta.customer_id, release.meta.request_id),
        (3, 42),
        "echoed"
    );
    assert!(s.dead().is_empty());
}

#[test]
fn finished_once_every_node_terminated() {
    let t0 = Instant::now();
    let mut s = ready(2, 2, Some(TIMEOUT), t0);
    for id in [8, 10, 9, 11] {
        assert!(!s.is_finished());
        assert!(s.handle(t0, &request(id, Terminate, 0)).is_empty());
    }
    assert!(!s.is_finished(), "the scheduler itself has not terminated");
    s.handle(t0, &request(1, Terminate, 0));
    assert!(s.is_finished());
    assert!(
        s.tick(t0 + 2 * TIMEOUT).is_empty(),
        "leaving nodes are not failures"
    );
    // A dead node counts as done; dead() tells the difference.
    let mut failed = ready(1, 1, Some(TIMEOUT), t0);
    failed.peer_lost(t0, 9, "killed");
    for id in [8, 1] {
        failed.handle(t0, &request(id, Terminate, 0));
    }
    assert!(failed.is_finished() && failed.dead() == [9]);
}

/// After a failed final barrier the survivors may exit without a goodbye: once the scheduler
/// itself is leaving, a node that closes is gone (no verdict, nobody told), and the scheduler
/// is finished without waiting out its grace. Before it leaves, a close is a death as ever.
#[test]
fn a_node_that_closes_while_the_scheduler_finishes_is_gone_not_dead() {
    let t0 = Instant::now();
    let mut s = ready(1, 2, Some(TIMEOUT), t0);
    assert!(
        !s.peer_lost(t0, 9, "killed").is_empty(),
        "told to the others"
    );
    assert_eq!(s.dead(), [9]);
    s.handle(t0, &request(1, Terminate, 0));
    assert!(!s.is_finished(), "8 and 11 are still there");
    for id in [8, 11] {
        assert!(s.peer_lost(t0, id, "closed").is_empty(), "nobody to tell");
    }
    assert!(s.is_finished());
    assert_eq!(s.dead(), [9], "the survivors that closed are not dead");
}

#[test]
fn malformed_messages_are_ignored() {
    let t0 = Instant::now();
    let mut s = ready(1, 1, Some(TIMEOUT), t0);
    let mut no_control = request(8, Barrier, 2);
    no_control.meta.control = None;
    let mut response = request(8, Barrier, 2);
    response.meta.request = false;
    let two_nodes = message(None, AddNode, 0, nodes(1, 1));
    let (empty_add, stranger) = (message(None, AddNode, 0, vec![]), request(99, Barrier, 2));
    let (ack, failure) = (request(8, Command::Ack, 0), request(8, NodeFailure, 0));
    for msg in [
        no_control, response, two_nodes, empty_add, stranger, ack, failure,
    ] {
        assert!(s.handle(t0, &msg).is_empty(), "{msg:?}");
    }
    assert!(s.barriers.is_empty());
}

#[test]
fn a_new_process_at_a_joining_address_replaces_the_one_before_and_stale_waiters_expire() {
    let t0 = Instant::now();
    let mut s = fresh(1, 1, Some(TIMEOUT));
    let all = nodes(1, 1);
    assert!(s.handle(t0, &add_node_from(&all[0], 5)).is_empty());
    // The server restarts before the cluster is complete: its new registration counts.
    let mut moved = all[0].clone();
    moved.endpoints = vec![van_core::Endpoint::stream(
        van_core::VanKind::Tcp,
        "10.0.0.9",
        4242,
    )];
    assert!(s.handle(t0, &add_node_from(&moved, 6)).is_empty());
    s.handle(t0, &add_node_from(&all[1], 7));
    assert!(s.is_ready());
    let server = s.node(8).unwrap();
    assert_eq!((server.incarnation, server.endpoints.len()), (6, 1));
    // So the live server re-sending is the same process: the table again, no burial.
    let again = s.handle(t0, &add_node_from(&moved, 6));
    assert_eq!(sends(&again[1..]), [(8, AddNode, 0, vec![1, 8, 9])]);
    assert!(s.dead().is_empty());
    // A waiting registration not re-sent within its time is gone when a place frees.
    let waiter = Node::new(Role::Worker, "10.0.0.50", 5050);
    assert!(s.handle(t0, &add_node_from(&waiter, 9)).is_empty());
    let late = t0 + Duration::from_secs(11);
    s.handle(late, &request(8, Heartbeat, 0));
    let out = s.peer_lost(late, 9, "reset");
    assert!(
        out.iter().all(|o| !matches!(o, Output::Connect(_))),
        "an expired waiter took the place: {out:?}"
    );
    assert_eq!(s.dead(), [9]);
}

/// A node of `role` at `host:port` running TensorFlow task `job:index`.
fn task_node(role: Role, host: &str, port: u16, job: &str, index: u32) -> Node {
    let mut node = Node::new(role, host, port);
    node.task = Some(van_core::TfTask {
        job: job.to_owned(),
        index,
    });
    node
}

/// Kubeflow's names: chief, worker 0, worker 1 and ps 0, on hosts that sort opposite to the
/// task order.
fn tf_nodes() -> Vec<Node> {
    vec![
        task_node(Role::Worker, "10.0.0.9", 2222, "chief", 0),
        task_node(Role::Worker, "10.0.0.8", 2222, "worker", 0),
        task_node(Role::Worker, "10.0.0.7", 2222, "worker", 1),
        task_node(Role::Server, "10.0.0.6", 2222, "ps", 0),
    ]
}

#[test]
fn tensorflow_tasks_are_numbered_in_task_order_not_by_address() {
    for order in [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]] {
        let mut s = fresh(1, 3, None);
        let nodes = tf_nodes();
        for i in order {
            s.handle(Instant::now(), &add_node(&nodes[i]));
        }
        assert!(s.is_ready());
        let by_id: Vec<(NodeId, String)> = s
            .table()
            .iter()
            .skip(1)
            .map(|n| (n.id.unwrap(), n.task.as_ref().unwrap().to_string()))
            .collect();
        assert_eq!(
            by_id,
            [
                (8, "/job:ps/task:0".to_owned()),
                (9, "/job:chief/task:0".to_owned()),
                (11, "/job:worker/task:0".to_owned()),
                (13, "/job:worker/task:1".to_owned()),
            ],
            "registration order {order:?}"
        );
    }
}

#[test]
fn a_restarted_task_at_a_new_address_takes_its_own_tasks_place() {
    let t0 = Instant::now();
    let mut s = fresh(1, 3, Some(TIMEOUT));
    for (i, node) in tf_nodes().iter().enumerate() {
        s.handle(t0, &add_node_from(node, 100 + i as u64));
    }
    assert!(s.is_ready());
    // worker:0 (id 11) and worker:1 (id 13) die.
    for id in [8, 9] {
        s.handle(t0 + TIMEOUT / 2, &request(id, Heartbeat, 0));
    }
    s.tick(t0 + TIMEOUT);
    assert_eq!(s.dead(), [11, 13]);
    // The pod of worker:1 comes back first, at a new address: it gets 13, not the lowest
    // dead worker id.
    let now = t0 + TIMEOUT + MS;
    let pod = task_node(Role::Worker, "10.0.0.70", 2222, "worker", 1);
    s.handle(now, &add_node_from(&pod, 500));
    assert_eq!(s.node(13).map(|n| n.host.as_str()), Some("10.0.0.70"));
    assert_eq!(s.dead(), [11]);
    // A live task restarted before its death was noticed: the old process is buried and
    // the new one takes the same id.
    let chief = task_node(Role::Worker, "10.0.0.90", 2222, "chief", 0);
    let out = s.handle(now, &add_node_from(&chief, 501));
    let sent: Vec<Output> = out
        .into_iter()
        .filter(|o| matches!(o, Output::Send(_)))
        .collect();
    let sent = sends(&sent);
    assert!(
        sent.iter()
            .any(|(_, cmd, _, ids)| *cmd == NodeFailure && ids == &[9]),
        "the chief's old process is declared failed: {sent:?}"
    );
    assert_eq!(s.node(9).map(|n| n.host.as_str()), Some("10.0.0.90"));
    assert_eq!(s.dead(), [11]);
}

#[test]
fn a_task_held_by_a_live_process_is_refused_to_another_and_taken_over_once_it_is_quiet() {
    let t0 = Instant::now();
    let mut s = fresh(1, 3, None);
    let nodes = tf_nodes();
    s.handle(t0, &add_node_from(&nodes[1], 1));
    // Another process claims worker:0 from another address while the first still re-sends
    // (two processes given one task): refused, whichever re-sends when.
    let other = task_node(Role::Worker, "10.0.0.80", 2222, "worker", 0);
    for at in [1, 2, 3, 4] {
        let now = t0 + TIMEOUT / 10 * at;
        assert!(s.handle(now, &add_node_from(&other, 2)).is_empty());
        let holder = s.joining.iter().find(|(n, ..)| n.task == other.task);
        assert_eq!(holder.map(|(n, ..)| n.host.as_str()), Some("10.0.0.8"));
        s.handle(now, &add_node_from(&nodes[1], 1));
    }
    // The first goes quiet (a pod restarted at a new address): the newcomer takes over.
    let later = t0 + TIMEOUT;
    s.handle(later, &add_node_from(&other, 2));
    for node in [&nodes[0], &nodes[2], &nodes[3]] {
        s.handle(later, &add_node_from(node, 3));
    }
    assert!(s.is_ready());
    assert_eq!(s.node(11).map(|n| n.host.as_str()), Some("10.0.0.80"));
}

#[test]
fn vans_rank_numbers_nodes_in_rank_order_not_by_address() {
    // `VANS_RANK=N` is announced as task `worker:N` (`ps:N` for a server). Ranks 2, 0, 1 from
    // addresses that sort the other way (rank 2's lowest, rank 1's highest).
    let workers = [
        task_node(Role::Worker, "10.0.0.1", 7000, "worker", 2),
        task_node(Role::Worker, "10.0.0.2", 7000, "worker", 0),
        task_node(Role::Worker, "10.0.0.3", 7000, "worker", 1),
    ];
    let servers = [
        task_node(Role::Server, "10.0.0.4", 7000, "ps", 1),
        task_node(Role::Server, "10.0.0.5", 7000, "ps", 0),
    ];
    for reversed in [false, true] {
        let mut s = fresh(2, 3, None);
        let mut all: Vec<&Node> = workers.iter().chain(&servers).collect();
        if reversed {
            all.reverse();
        }
        for node in all {
            s.handle(Instant::now(), &add_node(node));
        }
        assert!(s.is_ready());
        let by_id: Vec<(NodeId, &str)> = s
            .table()
            .iter()
            .skip(1)
            .map(|n| (n.id.unwrap(), n.host.as_str()))
            .collect();
        assert_eq!(
            by_id,
            [
                (8, "10.0.0.5"),
                (10, "10.0.0.4"),
                (9, "10.0.0.2"),
                (11, "10.0.0.3"),
                (13, "10.0.0.1"),
            ],
            "reversed: {reversed}"
        );
    }
}
