//! `finalize`'s barrier: with a replacement grace it outlasts a member's death followed by
//! a replacement, and fails naming the dead when none comes; without one it fails at once.

use super::*;

/// The replacement grace of the `finalize` tests.
const GRACE: Duration = Duration::from_secs(60);

/// A scheduler like [`ready`]'s, with a replacement grace of [`GRACE`] (or none).
fn ready_with_grace(grace: Duration, t0: Instant) -> Scheduler {
    let mut s = with_grace(1, 2, None, grace);
    for node in nodes(1, 2) {
        s.handle(t0, &add_node(&node));
    }
    assert!(s.is_ready());
    s
}

/// `from` arrives at `finalize`'s barrier (all groups, marked final).
fn final_barrier(s: &mut Scheduler, now: Instant, from: NodeId) -> Vec<Output> {
    let mut msg = request(from, Barrier, 1 | 2 | 4);
    if let Some(control) = &mut msg.meta.control {
        control.msg_sig = FINAL_BARRIER;
    }
    s.handle(now, &msg)
}

/// The barrier replies among `out`: (recipient, ids named dead).
fn barrier_replies(out: &[Output]) -> Vec<(NodeId, Vec<NodeId>)> {
    let replies = out.iter().filter_map(|o| match o {
        Output::Send(m) => m
            .meta
            .control
            .as_ref()
            .filter(|c| c.cmd == Barrier)
            .map(|c| {
                let dead = c.nodes.iter().filter_map(|n| n.id).collect();
                (m.meta.recipient.unwrap_or_default(), dead)
            }),
        Output::Connect(_) => None,
    });
    replies.collect()
}

#[test]
fn finalize_s_barrier_survives_a_death_followed_by_a_replacement() {
    let t0 = Instant::now();
    // Server 8, workers 9 and 11; no heartbeats (broken connections declare deaths).
    let mut s = ready_with_grace(GRACE, t0);
    // The scheduler, the server and worker 11 are done; worker 9 works on.
    for id in [1, 8, 11] {
        assert!(final_barrier(&mut s, t0, id).is_empty());
    }
    // Worker 11 dies after it arrived: the barrier waits instead of failing.
    let out = s.peer_lost(t0, 11, "reset");
    assert!(barrier_replies(&out).is_empty(), "{out:?}");
    assert_eq!(s.dead(), [11]);
    assert_eq!(s.next_deadline(), Some(t0 + GRACE));
    // A new process takes its place within the grace.
    let later = t0 + Duration::from_secs(5);
    let fresh = Node::new(Role::Worker, "10.0.0.60", 6060);
    let out = s.handle(later, &add_node_from(&fresh, 77));
    assert!(barrier_replies(&out).is_empty(), "{out:?}");
    assert!(s.dead().is_empty());
    assert_eq!(s.next_deadline(), None, "nobody is dead: no grace runs");
    // Worker 9 arrives: not released, the new process has not arrived (the old one's
    // arrival is none of its own), however long it works.
    assert!(final_barrier(&mut s, later, 9).is_empty());
    assert!(s.tick(t0 + 3 * GRACE).is_empty());
    // It arrives: released to all four, naming nobody dead.
    let out = final_barrier(&mut s, t0 + 3 * GRACE, 11);
    let mut replies = barrier_replies(&out);
    replies.sort();
    assert_eq!(
        replies,
        [(1, vec![]), (8, vec![]), (9, vec![]), (11, vec![])]
    );
}

#[test]
fn finalize_s_barrier_fails_naming_the_dead_when_no_replacement_comes() {
    let t0 = Instant::now();
    let mut s = ready_with_grace(GRACE, t0);
    for id in [1, 8, 9] {
        assert!(final_barrier(&mut s, t0, id).is_empty());
    }
    let died = t0 + Duration::from_secs(1);
    assert!(barrier_replies(&s.peer_lost(died, 11, "reset")).is_empty());
    assert!(s.tick(died + GRACE - MS).is_empty());
    let mut replies = barrier_replies(&s.tick(died + GRACE));
    replies.sort();
    assert_eq!(replies, [(1, vec![11]), (8, vec![11]), (9, vec![11])]);
    // An ordinary barrier on all groups still fails at once.
    assert_eq!(
        barrier_replies(&barrier(&mut s, died, 9, 1 | 2 | 4)),
        [(9, vec![11])]
    );
}

#[test]
fn without_a_replacement_grace_finalize_s_barrier_fails_at_once() {
    // Fast failure, the default: every survivor learns of the death at once.
    let t0 = Instant::now();
    let mut s = ready_with_grace(Duration::ZERO, t0);
    for id in [1, 8, 9] {
        assert!(final_barrier(&mut s, t0, id).is_empty());
    }
    let mut replies = barrier_replies(&s.peer_lost(t0, 11, "reset"));
    replies.sort();
    assert_eq!(replies, [(1, vec![11]), (8, vec![11]), (9, vec![11])]);
}
