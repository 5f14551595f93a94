//! Nodes over real TCP sockets behind the chaos harness's fault proxy: registration through
//! a proxy that opens before the scheduler does, and exact sums across cut and reset
//! connections with `PS_RESEND`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use examples::chaos::{FaultProxy, Mode};
use ps::{Config, KvServer, KvWorker, Postoffice, Role};

fn config(role: Role, root_port: u16, resend: bool) -> Config {
    Config::builder()
        .role(role)
        .num_servers(1)
        .num_workers(1)
        .root_uri("127.0.0.1")
        .root_port(root_port)
        // TCP between the nodes, so that their traffic crosses the proxies.
        .enable_ipc(false)
        .heartbeat_interval(Duration::from_secs(1))
        .heartbeat_timeout(Duration::from_secs(30))
        .resend_timeout(resend.then_some(Duration::from_millis(200)))
        .bootstrap_timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn node(config: Config) -> Postoffice {
    Postoffice::start(config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_register_through_a_proxy_that_opened_before_the_scheduler() {
    let port = common::free_port();
    let target: SocketAddr = ([127, 0, 0, 1], port).into();
    // The proxy accepts at once and drops each connection while the scheduler is not up:
    // the first registrations are lost with their connections.
    let proxy = FaultProxy::start(0, target).await.unwrap();
    let via = proxy.addr().port();
    let server = tokio::spawn(node(config(Role::Server, via, false)));
    let worker = tokio::spawn(node(config(Role::Worker, via, false)));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let scheduler = tokio::spawn(node(config(Role::Scheduler, port, false)));
    let joined = tokio::time::timeout(Duration::from_secs(30), async {
        (
            server.await.unwrap(),
            worker.await.unwrap(),
            scheduler.await.unwrap(),
        )
    })
    .await
    .expect("the nodes did not join: a lost registration was not sent again");
    let (server, worker, scheduler) = joined;
    assert!(
        proxy
            .stats()
            .connections
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 2
    );
    let (a, b, c) = tokio::join!(server.finalize(), worker.finalize(), scheduler.finalize());
    a.unwrap();
    b.unwrap();
    c.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_resend_sums_stay_exact_while_the_proxy_cuts_and_resets_every_connection() {
    let port = common::free_port();
    let scheduler = tokio::spawn(async move {
        node(config(Role::Scheduler, port, true))
            .await
            .finalize()
            .await
            .unwrap();
    });
    // Each node's own port, and a proxy in front of it that the other is sent through: every
    // connection between them, whoever dials, crosses a proxy.
    let (server_port, worker_port) = (common::free_port(), common::free_port());
    let mut proxies = Vec::new();
    let mut map = String::new();
    for own in [server_port, worker_port] {
        let proxy = FaultProxy::start(0, ([127, 0, 0, 1], own).into())
            .await
            .unwrap();
        map.push_str(&format!(
            "127.0.0.1:{own}=127.0.0.1:{}\n",
            proxy.addr().port()
        ));
        proxies.push(proxy);
    }
    let map = van_core::EndpointMap::parse(&map).unwrap();
    let mut server_config = config(Role::Server, port, true);
    (server_config.port, server_config.endpoint_map) = (server_port, Some(map.clone()));
    let server = tokio::spawn(async move {
        let po = node(server_config).await;
        let kv = KvServer::<i64>::with_sum(&po, 0, 0, 1).await.unwrap();
        po.finalize().await.unwrap();
        drop(kv);
    });
    let mut worker_config = config(Role::Worker, port, true);
    (worker_config.port, worker_config.endpoint_map) = (worker_port, Some(map));
    let po = node(worker_config).await;
    let kv = KvWorker::<i64>::new(&po, 0, 0).await.unwrap();
    let rounds = 300i64;
    for round in 1..=rounds {
        // Pushes in flight while the connection breaks: each must land exactly once.
        let id = kv.push(&[7], &[1], None, 0).await.unwrap();
        match round % 50 {
            10 => proxies.iter().for_each(|p| {
                p.cut();
            }),
            30 => proxies.iter().for_each(|p| {
                p.reset();
            }),
            40 => {
                // Held, then reset: what the proxies held is lost and must be resent.
                proxies.iter().for_each(|p| p.set_mode(Mode::Blackhole));
                tokio::time::sleep(Duration::from_millis(50)).await;
                for p in &proxies {
                    p.reset();
                    p.set_mode(Mode::Pass);
                }
            }
            _ => {}
        }
        kv.wait(id).await.unwrap();
    }
    let id = kv.pull(&[7], 0).await.unwrap();
    let sum = kv.wait(id).await.unwrap().vals::<i64>().unwrap()[0];
    assert_eq!(
        sum, rounds,
        "lost or doubled pushes across broken connections"
    );
    let stats = po.resend_stats().unwrap();
    let broken: u64 = proxies
        .iter()
        .map(|p| p.stats().broken.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    assert!(
        broken >= 12,
        "the proxies broke {broken} connections, too few for the test to mean anything"
    );
    assert!(stats.resent > 0, "nothing was ever resent: {stats:?}");
    po.finalize().await.unwrap();
    server.await.unwrap();
    scheduler.await.unwrap();
}

/// A worker and then a server killed with `kill -9` and started again: each comes back in
/// its old place (the ranks at the end are exactly 0..4, the restarted ones among them),
/// the restarted server is refilled by the workers, and every sum is exact.
#[test]
fn killed_nodes_rejoin_in_their_old_place_and_the_sums_stay_exact() {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_vans-soak"))
        .args([
            "--seconds",
            "24",
            "--van",
            "tcp",
            "--seed",
            "3",
            "--kill-every",
            "4",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::wait_output(child, "vans-soak");
    let all = common::text(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("vans-soak: PASS"), "{all}");
    assert!(all.contains("lost 0, duplicated 0"), "{all}");
    for event in [
        "killed worker",
        "killed server",
        "came back as a new process: counts",
        "server 0 came back as a new process",
    ] {
        let found = all.contains(event) || {
            // The server killed may be either one.
            event.starts_with("server 0") && all.contains("server 1 came back as a new process")
        };
        assert!(found, "no `{event}` in: {all}");
    }
    let mut ranks: Vec<u32> = all
        .lines()
        .filter_map(|l| {
            l.strip_prefix("SOAK-WORKER ")?
                .split(':')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1, 2, 3], "{all}");
}
