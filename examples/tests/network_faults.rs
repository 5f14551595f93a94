//! The parameter server under faults of the network itself: a scheduler, 2 servers and 4
//! workers on three network-namespace hosts (`vans-soak --network`), with the kernel
//! dropping packets on the links between them (`examples::netns::Fault`, nftables rules in
//! the hosts' namespaces), while the workers push, pull and push-pull and check every sum
//! exactly (`PS_RESEND` on).
//!
//! What they show: random loss of 1, 5 and 20 % loses and doubles nothing and declares
//! nobody dead; partitions shorter than the heartbeat timeout, both ways and one way, declare
//! nobody dead; a host cut off beyond the timeout (both ways, or one way either way) has its
//! nodes declared dead within the timeout and one heartbeat, replacements on another host
//! take their places, and the old processes, when the cut heals, have stopped with an error
//! saying they were removed from the cluster (fenced) while none of their late messages was
//! applied; and with fencing turned off (`VANS_TEST_NO_FENCING=1`) the same run fails, so
//! the zombie tests can fail.
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables); without root each test says it skipped
//! and passes (as root, hosts or rules that cannot be made fail it). The runs take one at a
//! time (each keeps both cores busy).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use common::text;

const SOAK: &str = env!("CARGO_BIN_EXE_vans-soak");

/// One run at a time: each is a cluster of seven busy processes.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// What a run printed, and whether it passed; `None` (the test says it skipped) only
/// without root.
fn soak(faults: &str, env: &[(&str, &str)]) -> Option<(bool, String)> {
    if !examples::netns::is_root() {
        eprintln!("skipped: network namespaces and nftables need root");
        return None;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new(SOAK);
    cmd.args([
        "--network",
        "--faults",
        faults,
        "--seconds",
        "8",
        "--heartbeat-timeout",
        "6",
    ])
    .env_remove("RUST_LOG")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out =
        common::wait_output_within(cmd.spawn().unwrap(), "vans-soak", Duration::from_secs(300));
    let all = text(&out);
    assert!(
        !all.contains("the hosts could not be made") && !all.contains("could not inject"),
        "running as root, yet the hosts or the faults could not be made \
         (apt-get install iproute2 nftables): {all}"
    );
    Some((out.status.success(), all))
}

/// The number after `label` in the run's summary line that holds it.
fn number(all: &str, label: &str) -> u64 {
    let at = all
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in: {all}"));
    all[at + label.len()..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {label:?} in: {all}"))
}

/// The run passed with exact sums, and the scheduler declared exactly `dead` nodes dead.
fn exact(all: &str, dead: u64) {
    assert!(all.contains("vans-soak: PASS"), "{all}");
    assert!(all.contains("lost 0, duplicated 0"), "{all}");
    let updates = all
        .lines()
        .find(|l| l.contains("updates verified by"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok());
    assert!(updates.is_some_and(|n| n > 0), "no updates verified: {all}");
    assert_eq!(number(all, "; nodes declared dead"), dead, "{all}");
    assert_eq!(number(all, "(expected"), dead, "{all}");
}

#[test]
fn loss_of_1_5_and_20_percent_on_the_links_loses_and_doubles_nothing() {
    let Some((passed, all)) = soak("1:loss1:3,2:loss5:4,0:loss20:3", &[]) else {
        return;
    };
    assert!(passed, "{all}");
    exact(&all, 0);
    for kind in ["1.0 % loss", "5.0 % loss", "20.0 % loss"] {
        assert!(
            all.contains(&format!("vans-soak: {kind}")),
            "{kind} not injected: {all}"
        );
    }
}

#[test]
fn partitions_shorter_than_the_heartbeat_timeout_declare_nobody_dead() {
    // Host 0 holds the scheduler: cutting it cuts everyone from the scheduler for a while.
    let Some((passed, all)) = soak("1:partition:2,2:deaf:2,0:mute:2,0:partition:1.5", &[]) else {
        return;
    };
    assert!(passed, "{all}");
    exact(&all, 0);
    assert_eq!(number(&all, "zombies fenced"), 0, "{all}");
}

#[test]
fn a_host_cut_off_beyond_the_timeout_is_replaced_and_its_zombies_fenced() {
    // Host 1 holds server 1; host 2 workers 2 and 3 (all replaced on host 0).
    let Some((passed, all)) = soak("1:long:0,2:long:0", &[]) else {
        return;
    };
    assert!(passed, "{all}");
    exact(&all, 3);
    assert_eq!(number(&all, "zombies fenced"), 3, "{all}");
    // Declared within the timeout and one heartbeat (the driver fails the run beyond), and
    // the replacements joined.
    assert!(all.contains("nodes declared dead") && all.contains("replacements joined"));
    assert!(all.contains("server 1 came back as a new process"), "{all}");
}

#[test]
fn a_one_way_partition_ends_the_same_way() {
    // A deaf server (its packets go out, none come in) and two mute workers (the reverse):
    // never both a process and its replacement in the role.
    let Some((passed, all)) = soak("1:longdeaf:0,2:longmute:0", &[]) else {
        return;
    };
    assert!(passed, "{all}");
    exact(&all, 3);
    assert_eq!(number(&all, "zombies fenced"), 3, "{all}");
}

#[test]
fn without_fencing_the_zombies_are_caught() {
    // The same cut as above with fencing off: the old workers go on after the cut heals,
    // and the run must say so (a zombie still running, and its late pushes applied twice
    // when they land first).
    let Some((passed, all)) = soak("2:long:0", &[("VANS_TEST_NO_FENCING", "1")]) else {
        return;
    };
    assert!(!passed, "a run without fencing passed: {all}");
    assert!(
        all.contains("zombie worker") && all.contains("still running"),
        "the unfenced zombies were not caught: {all}"
    );
}
