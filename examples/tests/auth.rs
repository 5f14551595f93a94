//! An authenticated cluster of real processes on 127.0.0.1: nodes holding the secret form the
//! cluster and verify exact sums, while an intruder without the secret, and one with another
//! secret, cannot register (so they cannot take a worker's place, push or read values).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{all_succeeded, exact_sums, free_port, loopback_node, text, wait_output};

use std::process::Command;

const PS_BENCH: &str = env!("CARGO_BIN_EXE_ps-bench");
const SECRET: &str = "7f3a9c1e5b2d4f6a8c0e1b3d5f7a9c2e";

/// `ps-bench --mode check` for one role of a 1-server, 1-worker cluster.
fn node(role: &str, port: u16, secret: Option<&str>) -> Command {
    let mut cmd = loopback_node(PS_BENCH, role, port);
    cmd.args(["--mode", "check", "--keys", "16"])
        .env("VANS_BOOTSTRAP_TIMEOUT_SECS", "20")
        .env_remove("VANS_CLUSTER_SECRET")
        .env_remove("VANS_CLUSTER_SECRET_FILE");
    if let Some(secret) = secret {
        cmd.env("VANS_CLUSTER_SECRET", secret);
    }
    cmd
}

/// A server and a worker holding the secret join the `scheduler` at `port`; every node must
/// exit 0 and the worker verify exact sums. The scheduler's output.
fn the_cluster_sums_exactly(port: u16, scheduler: std::process::Child) -> String {
    let server = node("server", port, Some(SECRET)).spawn().unwrap();
    let worker = node("worker", port, Some(SECRET)).spawn().unwrap();
    let [worker, _, scheduler] = all_succeeded([
        ("worker", worker),
        ("server", server),
        ("scheduler", scheduler),
    ]);
    exact_sums(&text(&worker), 16, 1);
    text(&scheduler)
}

#[test]
fn intruders_without_the_secret_cannot_join_and_the_cluster_sums_exactly() {
    let port = free_port();
    let scheduler = node("scheduler", port, Some(SECRET)).spawn().unwrap();
    // The intruders come first: had either registered, it would hold the only worker slot.
    let missing = node("worker", port, None)
        .env("VANS_BOOTSTRAP_TIMEOUT_SECS", "4")
        .spawn()
        .unwrap();
    let wrong = node("worker", port, Some("another-secret-of-32-characters!"))
        .env("VANS_BOOTSTRAP_TIMEOUT_SECS", "4")
        .spawn()
        .unwrap();
    let missing = wait_output(missing, "intruder without a secret");
    let wrong = wait_output(wrong, "intruder with another secret");
    assert!(!missing.status.success(), "{}", text(&missing));
    assert!(!wrong.status.success(), "{}", text(&wrong));
    let wrong_text = text(&wrong);
    assert!(
        wrong_text.contains("different cluster secret"),
        "the refusal must say why: {wrong_text}"
    );

    let scheduler_log = the_cluster_sums_exactly(port, scheduler);
    assert!(
        scheduler_log.contains("refused a connection"),
        "the scheduler must log the refusals: {scheduler_log}"
    );
}

/// Opens connections from `from` to the node at `port` until `stop`, one every 2 ms, and holds
/// the last 150 open: idle ones, and half-open ones that sent the first bytes of a hello and
/// went quiet. Returns how many connected.
fn flood(from: &str, port: u16, stop: &std::sync::atomic::AtomicBool) -> usize {
    use socket2::{Domain, Socket, Type};
    use std::io::Write;
    let (from, to) = (
        std::net::SocketAddr::new(from.parse().unwrap(), 0),
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
    );
    let mut held = std::collections::VecDeque::new();
    let mut opened = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        socket.bind(&from.into()).unwrap();
        if socket
            .connect_timeout(&to.into(), std::time::Duration::from_secs(1))
            .is_ok()
        {
            opened += 1;
            let mut stream = std::net::TcpStream::from(socket);
            if opened % 2 == 0 {
                // Whether the node already closed it does not matter.
                let _ = stream.write_all(b"VANS\x01");
            }
            held.push_back(stream);
            if held.len() > 150 {
                held.pop_front();
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    opened
}

/// Idle and half-open connections from two other addresses, opened all the time and more than
/// a listener lets one address have authenticating at once, do not keep the cluster from
/// forming: the scheduler refuses what is over the bound (and closes the silent ones at the
/// handshake timeout) while the nodes on 127.0.0.1 register and verify exact sums.
#[test]
fn a_flood_of_idle_and_half_open_connections_does_not_keep_the_cluster_from_forming() {
    let port = free_port();
    let scheduler = node("scheduler", port, Some(SECRET))
        .env("VANS_HANDSHAKE_TIMEOUT_MS", "1000")
        .env("VANS_MAX_PENDING_PER_ADDRESS", "32")
        .spawn()
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooders: Vec<_> = ["127.0.0.2", "127.0.0.3"]
        .into_iter()
        .map(|from| {
            let stop = stop.clone();
            std::thread::spawn(move || flood(from, port, &stop))
        })
        .collect();
    // The flood holds the scheduler's places before the nodes come (2 s: past the handshake
    // timeout, so the silent ones have also been closed and replaced).
    std::thread::sleep(std::time::Duration::from_secs(2));
    let scheduler_log = the_cluster_sums_exactly(port, scheduler);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let opened: Vec<usize> = flooders.into_iter().map(|f| f.join().unwrap()).collect();
    // The flood was real: each address opened more than its bound allows at once.
    assert!(
        opened.iter().all(|&n| n > 64),
        "connections opened: {opened:?}"
    );
    for from in ["127.0.0.2", "127.0.0.3"] {
        assert!(
            scheduler_log
                .lines()
                .any(|l| l.contains("refused a connection") && l.contains(from)),
            "the scheduler must log refusing the flood from {from}: {scheduler_log}"
        );
    }
}
