//! The node's membership machine on a simulated clock: the races the cluster tests only catch
//! by chance, as sequences of inputs.

use std::time::{Duration, Instant};

use van_core::{node_ids, Command, Control, Message, Meta, Node, NodeId, Role, Seq};

use super::{Action, Input, Member, MemberConfig, ALL_GROUPS};
use crate::error::NodeError;
use crate::table::NodeTable;

const SERVER: NodeId = 8;
const WORKER: NodeId = 9;
const OTHER_WORKER: NodeId = 11;

fn node(role: Role, id: NodeId, port: u16, incarnation: u64) -> Node {
    let mut node = Node::new(role, "127.0.0.1", port).with_id(id);
    node.incarnation = incarnation;
    node
}

/// The table of a cluster of one server and two workers, each process numbered by its id.
fn table() -> Vec<Node> {
    vec![
        node(Role::Scheduler, node_ids::SCHEDULER, 9000, 1),
        node(Role::Server, SERVER, 9001, 8),
        node(Role::Worker, WORKER, 9002, 9),
        node(Role::Worker, OTHER_WORKER, 9003, 11),
    ]
}

/// A control message from the scheduler to worker 9.
fn from_scheduler(control: Control, seq: Option<u64>) -> Message {
    Message {
        meta: Meta {
            sender: Some(node_ids::SCHEDULER),
            recipient: Some(WORKER),
            control: Some(control),
            seq: seq.map(|number| Seq { number, to: 0 }),
            ..Meta::default()
        },
        data: van_core::Parts::new(),
    }
}

fn table_message(seq: Option<u64>) -> Message {
    let control = Control {
        nodes: table().into(),
        ..Control::command(Command::AddNode)
    };
    from_scheduler(control, seq)
}

/// The scheduler's notice that a new process (incarnation 80) took the server's place.
fn recovery_notice(seq: Option<u64>) -> Message {
    let mut replacement = node(Role::Server, SERVER, 9101, 80);
    replacement.is_recovery = true;
    let control = Control {
        nodes: vec![replacement].into(),
        ..Control::command(Command::AddNode)
    };
    from_scheduler(control, seq)
}

fn release(group: i32, dead: &[NodeId]) -> Message {
    let control = Control {
        barrier_group: group,
        nodes: dead
            .iter()
            .map(|&id| node(Role::Server, id, 9001, 0))
            .collect(),
        ..Control::command(Command::Barrier)
    };
    from_scheduler(control, None)
}

fn failure_notice(dead: Node) -> Message {
    let control = Control {
        nodes: vec![dead].into(),
        ..Control::command(Command::NodeFailure)
    };
    from_scheduler(control, None)
}

struct Harness {
    member: Member,
    now: Instant,
}

impl Harness {
    /// Worker 9, not joined yet.
    fn new(timeout: Option<Duration>, resend: bool) -> Harness {
        let now = Instant::now();
        let config = MemberConfig {
            role: Role::Worker,
            incarnation: 9,
            heartbeat_timeout: timeout,
            resend,
        };
        Harness {
            member: Member::new(config, now),
            now,
        }
    }

    /// Worker 9, joined.
    fn joined() -> Harness {
        let mut h = Harness::new(None, false);
        let actions = h.input(Input::Control(&table_message(None)));
        assert!(matches!(
            &actions[..],
            [Action::Joined { my_id: WORKER, .. }]
        ));
        h
    }

    fn input(&mut self, input: Input<'_>) -> Vec<Action> {
        self.member.handle(self.now, input)
    }

    fn control(&mut self, msg: &Message) -> Vec<Action> {
        self.input(Input::Control(msg))
    }

    fn lost(&mut self, peer: NodeId, read_as: u64) -> Vec<Action> {
        self.input(Input::Lost {
            peer,
            reason: "connection reset",
            read_as,
        })
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
    }
}

fn failed_nodes(actions: &[Action]) -> Vec<NodeId> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::NodeFailed { node, .. } => Some(*node),
            _ => None,
        })
        .collect()
}

fn recovered(actions: &[Action]) -> Vec<NodeId> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Recovered(peer) => Some(*peer),
            _ => None,
        })
        .collect()
}

#[test]
fn a_loss_read_before_a_recovery_but_handled_after_it_is_the_old_processs() {
    let mut h = Harness::joined();
    // The loss is read (it then waits behind data): the table names process 8.
    let read_as = h.member.incarnation_of(SERVER);
    assert_eq!(read_as, 8);
    // Meanwhile the scheduler's notice of a new process is handled at once.
    let actions = h.control(&recovery_notice(None));
    assert!(matches!(&actions[0], Action::Retarget(n) if n.incarnation == 80 && n.port == 9101));
    assert_eq!(recovered(&actions), vec![SERVER]);
    // Then the old loss: neither a failure of the new process nor a dropped route to it.
    let actions = h.lost(SERVER, read_as);
    assert!(
        actions.is_empty(),
        "the old process's loss was acted on: {actions:?}"
    );
    assert_eq!(h.member.failure(SERVER), None);
    // A loss read after the recovery is the new process's own.
    let actions = h.lost(SERVER, h.member.incarnation_of(SERVER));
    assert!(matches!(actions[0], Action::DropRoute(SERVER)));
    assert_eq!(failed_nodes(&actions), vec![SERVER]);
}

#[test]
fn a_failed_node_counts_dead_once_until_a_new_process_takes_its_place() {
    let mut h = Harness::joined();
    let actions = h.lost(SERVER, 8);
    assert_eq!(failed_nodes(&actions), vec![SERVER]);
    let reason = h.member.failure(SERVER).map(str::to_owned);
    assert_eq!(reason.as_deref(), Some("connection lost: connection reset"));
    // The scheduler's notice about the same process adds nothing.
    let actions = h.control(&failure_notice(node(Role::Server, SERVER, 9001, 8)));
    assert!(failed_nodes(&actions).is_empty());
    // A notice about a process replaced since is not about the new one.
    h.control(&recovery_notice(None));
    assert_eq!(h.member.failure(SERVER), None);
    let actions = h.control(&failure_notice(node(Role::Server, SERVER, 9001, 8)));
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(h.member.failure(SERVER), None);
    // One about the new process is.
    let actions = h.control(&failure_notice(node(Role::Server, SERVER, 9101, 80)));
    assert_eq!(failed_nodes(&actions), vec![SERVER]);
}

#[test]
fn a_peers_close_while_waiting_at_the_final_barrier_is_no_failure() {
    let mut h = Harness::joined();
    assert!(h.input(Input::Finalize).is_empty());
    assert!(matches!(
        &h.input(Input::Barrier(ALL_GROUPS))[..],
        [Action::Send(_)]
    ));
    // A peer released first stops in order while our release is on its way.
    let actions = h.lost(OTHER_WORKER, 11);
    assert!(matches!(&actions[..], [Action::DropRoute(OTHER_WORKER)]));
    assert_eq!(h.member.failure(OTHER_WORKER), None);
    // The scheduler's loss still is one, and fails the barrier.
    let actions = h.lost(node_ids::SCHEDULER, 1);
    assert!(matches!(
        actions[1],
        Action::FailBarriers {
            dead: node_ids::SCHEDULER,
            ..
        }
    ));
    assert_eq!(failed_nodes(&actions), vec![node_ids::SCHEDULER]);
}

#[test]
fn a_peers_close_at_an_ordinary_all_nodes_barrier_is_a_failure() {
    let mut h = Harness::joined();
    assert!(matches!(
        &h.input(Input::Barrier(ALL_GROUPS))[..],
        [Action::Send(_)]
    ));
    let actions = h.lost(OTHER_WORKER, 11);
    assert_eq!(failed_nodes(&actions), vec![OTHER_WORKER]);
}

#[test]
fn once_finalizes_barrier_is_released_departures_are_no_failures() {
    let mut h = Harness::joined();
    h.input(Input::Finalize);
    h.input(Input::Barrier(ALL_GROUPS));
    // An ordinary barrier's release does not end the run...
    let actions = h.control(&release(node_ids::WORKER_GROUP, &[]));
    assert!(matches!(
        &actions[..],
        [Action::EndBarrier { result: Ok(()), .. }]
    ));
    assert!(!h.member.is_finishing());
    // ...finalize's does: even the scheduler may now leave first.
    let actions = h.control(&release(ALL_GROUPS, &[]));
    assert!(matches!(
        &actions[..],
        [Action::EndBarrier {
            group: ALL_GROUPS,
            result: Ok(())
        }]
    ));
    assert!(h.member.is_finishing());
    let actions = h.lost(node_ids::SCHEDULER, 1);
    assert!(matches!(
        &actions[..],
        [Action::DropRoute(node_ids::SCHEDULER)]
    ));
    assert_eq!(h.member.failure(node_ids::SCHEDULER), None);
    let actions = h.input(Input::Leave);
    assert!(matches!(&actions[..], [Action::Send(m)]
        if m.meta.control.as_ref().map(|c| c.cmd) == Some(Command::Terminate)));
}

#[test]
fn an_all_nodes_barrier_released_without_finalize_does_not_end_the_run() {
    let mut h = Harness::joined();
    h.input(Input::Barrier(ALL_GROUPS));
    h.control(&release(ALL_GROUPS, &[]));
    assert!(!h.member.is_finishing());
    assert_eq!(failed_nodes(&h.lost(node_ids::SCHEDULER, 1)), vec![1]);
}

#[test]
fn a_recovery_notice_that_overtakes_the_table_is_applied_after_it() {
    let mut h = Harness::new(None, false);
    // Numbered after the table (a resend brought it first): kept, nothing done yet.
    assert!(h.control(&recovery_notice(Some(7))).is_empty());
    assert!(!h.member.is_joined());
    let actions = h.control(&table_message(Some(5)));
    assert!(matches!(actions[0], Action::Joined { my_id: WORKER, .. }));
    assert!(matches!(&actions[1], Action::Retarget(n) if n.incarnation == 80));
    assert_eq!(recovered(&actions), vec![SERVER]);
    assert_eq!(h.member.incarnation_of(SERVER), 80);
}

#[test]
fn a_recovery_notice_older_than_the_table_is_dropped() {
    let mut h = Harness::new(None, false);
    assert!(h.control(&recovery_notice(Some(4))).is_empty());
    let actions = h.control(&table_message(Some(5)));
    assert!(
        matches!(&actions[..], [Action::Joined { .. }]),
        "{actions:?}"
    );
    assert_eq!(h.member.incarnation_of(SERVER), 8);
}

#[test]
fn the_table_again_after_joining_changes_nothing() {
    let mut h = Harness::joined();
    h.control(&recovery_notice(None));
    assert!(h.control(&table_message(None)).is_empty());
    assert_eq!(h.member.incarnation_of(SERVER), 80);
}

#[test]
fn a_barrier_during_a_failure_ends_with_the_dead_nodes() {
    let mut h = Harness::joined();
    let actions = h.input(Input::Barrier(
        node_ids::WORKER_GROUP | node_ids::SERVER_GROUP,
    ));
    let [Action::Send(msg)] = &actions[..] else {
        panic!("the barrier request was not sent: {actions:?}");
    };
    let control = msg.meta.control.as_ref().map(|c| (c.cmd, c.barrier_group));
    assert_eq!(control, Some((Command::Barrier, 6)));
    assert!(msg.meta.request);
    // The server dies while the others wait: the scheduler fails the barrier, naming it.
    h.lost(SERVER, 8);
    let actions = h.control(&release(6, &[SERVER]));
    match &actions[..] {
        [Action::EndBarrier {
            group: 6,
            result: Err(NodeError::BarrierFailed { group: 6, dead }),
        }] => assert_eq!(dead, &vec![SERVER]),
        other => panic!("the barrier did not fail with the dead server: {other:?}"),
    }
}

#[test]
fn losing_the_scheduler_fails_every_barrier_and_refuses_new_ones() {
    let mut h = Harness::joined();
    h.input(Input::Barrier(node_ids::WORKER_GROUP));
    let actions = h.lost(node_ids::SCHEDULER, 1);
    assert!(matches!(
        actions[..],
        [
            Action::DropRoute(1),
            Action::FailBarriers { dead: 1, .. },
            Action::NodeFailed { node: 1, .. }
        ]
    ));
    let actions = h.input(Input::Barrier(node_ids::WORKER_GROUP));
    assert!(matches!(
        &actions[..],
        [Action::RefuseBarrier(NodeError::NodeFailed { node: 1, .. })]
    ));
}

#[test]
fn a_barrier_this_node_cannot_pass_is_refused() {
    let mut h = Harness::joined();
    for group in [0, 8, -1, node_ids::SERVER_GROUP] {
        let actions = h.input(Input::Barrier(group));
        assert!(
            matches!(
                &actions[..],
                [Action::RefuseBarrier(NodeError::InvalidArgument(_))]
            ),
            "group {group}: {actions:?}"
        );
    }
}

#[test]
fn a_barrier_on_a_stopped_node_is_refused_as_stopped() {
    let mut h = Harness::joined();
    assert!(matches!(&h.input(Input::Stop)[..], [Action::Stop]));
    for group in [ALL_GROUPS, node_ids::SERVER_GROUP] {
        let actions = h.input(Input::Barrier(group));
        assert!(
            matches!(&actions[..], [Action::RefuseBarrier(NodeError::Stopped)]),
            "group {group}: {actions:?}"
        );
    }
}

#[test]
fn a_scheduler_silent_for_a_whole_heartbeat_timeout_is_lost() {
    let timeout = Duration::from_secs(3);
    let mut h = Harness::new(Some(timeout), false);
    h.advance(Duration::from_secs(60));
    // Joining is bootstrap's to time out, not the heartbeat's.
    assert!(h.input(Input::Tick).is_empty());
    h.control(&table_message(None));
    h.advance(Duration::from_secs(2));
    assert!(h.input(Input::Tick).is_empty());
    // An answer to a heartbeat: heard.
    h.control(&from_scheduler(Control::command(Command::Heartbeat), None));
    h.advance(Duration::from_millis(2999));
    assert!(h.input(Input::Tick).is_empty());
    h.input(Input::Barrier(node_ids::WORKER_GROUP));
    h.advance(Duration::from_millis(1));
    let actions = h.input(Input::Tick);
    assert_eq!(failed_nodes(&actions), vec![node_ids::SCHEDULER]);
    // The barrier waiting fails saying why, not only that the scheduler is dead.
    let barriers: Vec<&String> = actions
        .iter()
        .filter_map(|a| match a {
            Action::FailBarriers { dead, reason } if *dead == node_ids::SCHEDULER => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(barriers.len(), 1, "{actions:?}");
    assert!(
        barriers[0].contains("no answer from the scheduler")
            && barriers[0].contains("this node is cut off"),
        "{}",
        barriers[0]
    );
    let reason = h.member.failure(node_ids::SCHEDULER).unwrap_or_default();
    assert!(
        reason.contains("no answer from the scheduler for 3.0 s"),
        "{reason}"
    );
    // Cut off, this node counts as dead for the cluster: it stops (fencing itself) rather
    // than go on beside the process that may replace it.
    let evicted: Vec<&String> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Evicted { node, reason } => {
                assert_eq!(*node, node_ids::SCHEDULER, "a silent scheduler is blamed");
                Some(reason)
            }
            _ => None,
        })
        .collect();
    assert_eq!(evicted.len(), 1, "{actions:?}");
    assert!(
        evicted[0].contains("this node is cut off"),
        "{}",
        evicted[0]
    );
    assert!(h.member.is_stopped());
    // Once.
    h.advance(Duration::from_secs(1));
    assert!(h.input(Input::Tick).is_empty());
}

#[test]
fn only_answers_to_heartbeats_renew_the_lease_on_the_scheduler() {
    // A node cut off one way (its heartbeats lost, the scheduler's notices to every node
    // still arriving) must stop at the timeout, as the scheduler declares it dead then.
    let timeout = Duration::from_secs(3);
    let mut h = Harness::new(Some(timeout), false);
    h.control(&table_message(None));
    for _ in 0..5 {
        h.advance(Duration::from_millis(700));
        h.control(&failure_notice(node(Role::Server, SERVER, 9001, 8)));
        h.control(&from_scheduler(Control::command(Command::Barrier), None));
    }
    let actions = h.input(Input::Tick);
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::Evicted { node, .. } if *node == node_ids::SCHEDULER)),
        "notices renewed the lease: {actions:?}"
    );
}

#[test]
fn without_heartbeats_a_silent_scheduler_is_no_failure() {
    let mut h = Harness::joined();
    h.advance(Duration::from_secs(3600));
    assert!(h.input(Input::Tick).is_empty());
}

#[test]
fn declared_dead_by_the_scheduler_this_node_stops_once() {
    let mut h = Harness::joined();
    let me = node(Role::Worker, WORKER, 9002, 9);
    let actions = h.control(&failure_notice(me.clone()));
    let [Action::Evicted { node, reason }] = &actions[..] else {
        panic!("{actions:?}");
    };
    assert!(
        reason.contains("declared this node dead") && reason.contains(super::EVICTED),
        "{reason}"
    );
    assert_eq!(*node, WORKER, "the node declared dead is this one");
    // Kept with the stop, for every later call's error.
    assert_eq!(h.member.eviction(), Some((WORKER, reason.as_str())));
    assert!(h.member.is_stopped());
    assert!(h.control(&failure_notice(me)).is_empty());
    assert!(h.input(Input::Stop).is_empty());
    // A stopped node reports no more failures.
    assert!(matches!(
        &h.lost(SERVER, 8)[..],
        [Action::DropRoute(SERVER)]
    ));
}

#[test]
fn with_resend_a_broken_connection_is_no_failure() {
    let mut h = Harness::new(None, true);
    h.control(&table_message(None));
    assert!(matches!(
        &h.lost(SERVER, 8)[..],
        [Action::DropRoute(SERVER)]
    ));
    assert_eq!(h.member.failure(SERVER), None);
}

#[test]
fn a_loss_while_joining_is_retried_by_bootstrap_not_failed() {
    let mut h = Harness::new(None, false);
    let actions = h.lost(node_ids::SCHEDULER, 0);
    assert!(matches!(&actions[..], [Action::DropRoute(1)]));
    assert_eq!(h.member.failure(node_ids::SCHEDULER), None);
}

#[test]
fn on_the_scheduler_a_loss_goes_to_its_state_machine() {
    let config = MemberConfig {
        role: Role::Scheduler,
        incarnation: 1,
        heartbeat_timeout: None,
        resend: false,
    };
    let now = Instant::now();
    let mut member = Member::new(config, now);
    let actions = member.handle(now, Input::SchedulerReady(NodeTable::new(table().into())));
    assert!(matches!(&actions[..], [Action::Joined { my_id: 1, .. }]));
    let actions = member.handle(
        now,
        Input::Lost {
            peer: SERVER,
            reason: "reset",
            read_as: 8,
        },
    );
    assert!(matches!(
        &actions[..],
        [
            Action::DropRoute(SERVER),
            Action::SchedulerPeerLost { peer: SERVER, .. }
        ]
    ));
    assert_eq!(member.failure(SERVER), None);
}
