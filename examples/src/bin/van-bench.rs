//! `van-bench`: the vans side by side with a raw TCP socket, measured in one run.
//!
//! Four workloads, each through a plain tokio `TcpStream` (length-prefixed frames, one
//! `write_all` per message: the reference), the TCP van, the TCP van without its pool of
//! received-frame buffers (`frame_pool_bytes: 0`, every large frame in fresh memory), the TCP
//! van without its per-peer byte budget (`peer_budget_bytes: 0`) and the in-process van:
//!
//! - `rtt 8 B`: one 8-byte request, wait for the 8-byte echo, repeat (µs per round trip);
//! - `8 B x64`: 8-byte requests with 64 in flight, each echoed (operations per second);
//! - `1 MiB x64`: 1 MiB requests with 64 in flight, each acknowledged with 8 bytes (GB/s);
//! - `4 MiB x4`: 4 MiB requests with 4 in flight, each acknowledged with 8 bytes (GB/s).
//!
//! Usage: `van-bench [--quick] [--json]` (see `--help`). Absolute figures on a shared machine
//! are noise; the ratio columns compare runs made seconds apart on the same machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use examples::raw::{raw_socket, Workload};
use examples::{ratio, Table};
use van_core::inproc::{Hub, InProcessVan};
use van_core::{inbox, Event, Inbox, Message, Node, Role, Van};
use van_tcp::{TcpOptions, TcpVan};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The vans side by side with a raw TCP socket, measured in one run.
///
/// Four workloads, each through a plain tokio TcpStream (length-prefixed frames, one write_all
/// per message: the reference), the TCP van, the TCP van without its pool of received-frame
/// buffers, the TCP van without its per-peer byte budget and the in-process van: an 8-byte
/// round trip (µs), 8-byte requests with 64 in flight (ops/s), 1 MiB requests with 64 in
/// flight and 4 MiB requests with 4 in flight (GB/s).
#[derive(Debug, Parser)]
#[command(
    name = "van-bench",
    after_help = "Absolute figures on a shared machine are noise; the ratio columns compare \
                  runs made seconds apart on the same machine."
)]
struct Options {
    /// About a tenth of the requests per workload.
    #[arg(long)]
    quick: bool,
    /// Print the table as JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> Result<(), BoxError> {
    let Options { quick, json } = Options::parse();
    let scale = if quick { 10 } else { 1 };
    let workloads = [
        Workload {
            name: "rtt 8 B",
            size: 8,
            window: 1,
            count: 20_000 / scale,
            reply: 8,
        },
        Workload {
            name: "8 B x64 in flight",
            size: 8,
            window: 64,
            count: 400_000 / scale,
            reply: 8,
        },
        Workload {
            name: "1 MiB x64 in flight",
            size: 1 << 20,
            window: 64,
            count: 1_600 / scale,
            reply: 8,
        },
        Workload {
            name: "4 MiB x4 in flight",
            size: 4 << 20,
            window: 4,
            count: 400 / scale,
            reply: 8,
        },
    ];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut table = Table::new(&[
        "workload",
        "unit",
        "raw socket",
        "tcp van",
        "tcp, no pool",
        "tcp, no budget",
        "inproc van",
        "tcp van / raw",
        "pool / no pool",
        "budget / none",
    ]);
    runtime.block_on(async {
        for w in workloads {
            eprintln!("running {} ({} requests) ...", w.name, w.count);
            let raw = w.figure(raw_socket(w).await?);
            let tcp = w.figure(tcp_pair(w, TcpOptions::default()).await?);
            let unpooled = TcpOptions {
                frame_pool_bytes: 0,
                ..TcpOptions::default()
            };
            let unpooled = w.figure(tcp_pair(w, unpooled).await?);
            let unbudgeted = TcpOptions {
                peer_budget_bytes: 0,
                ..TcpOptions::default()
            };
            let unbudgeted = w.figure(tcp_pair(w, unbudgeted).await?);
            let hub = Hub::new();
            let inproc = w.figure(van_pair(w, || InProcessVan::new(&hub)).await?);
            // Lower is better for latency; express the ratio as "how many times better".
            let better = |a: f64, b: f64| {
                if w.window == 1 {
                    ratio(b, a)
                } else {
                    ratio(a, b)
                }
            };
            let speedup = better(tcp, raw);
            let pooling = better(tcp, unpooled);
            let budgeting = better(tcp, unbudgeted);
            table.row(vec![
                w.name.to_owned(),
                w.unit().to_owned(),
                format!("{raw:.3}"),
                format!("{tcp:.3}"),
                format!("{unpooled:.3}"),
                format!("{unbudgeted:.3}"),
                format!("{inproc:.3}"),
                format!("{speedup:.2}x"),
                format!("{pooling:.2}x"),
                format!("{budgeting:.2}x"),
            ]);
        }
        Ok::<_, BoxError>(())
    })?;
    if json {
        println!("{}", table.to_json());
    } else {
        println!("{table}");
        println!("(\"tcp van / raw\" > 1 means the van is better; the raw socket writes each message with its own system call)");
    }
    Ok(())
}

/// [`van_pair`] over two TCP vans with `options`.
async fn tcp_pair(w: Workload, options: TcpOptions) -> Result<Duration, BoxError> {
    van_pair(w, || TcpVan::new(options.clone())).await
}

/// Two vans made by `make`, one echoing, the other driving the workload.
async fn van_pair<V: Van + 'static>(
    w: Workload,
    make: impl Fn() -> V,
) -> Result<Duration, BoxError> {
    let (client, mut client_inbox, client_node) = start(make(), 9).await?;
    let (server, server_inbox, server_node) = start(make(), 8).await?;
    client.connect(&server_node).await?;
    server.connect(&client_node).await?;
    let echo = tokio::spawn(echo(server.clone(), server_inbox, w.reply));

    let payload = Bytes::from(vec![7u8; w.size]);
    let started = Instant::now();
    let (mut sent, mut done) = (0, 0);
    while done < w.count {
        let mut batch = Vec::new();
        while sent < w.count && sent - done < w.window {
            let mut msg = Message::to(8, vec![payload.clone()]);
            msg.meta.sender = Some(9);
            msg.meta.request = true;
            batch.push(msg);
            sent += 1;
        }
        if !batch.is_empty() {
            client.send_batch(batch).await?;
        }
        let mut events = Vec::new();
        if client_inbox.recv_batch(&mut events).await == 0 {
            return Err("client inbox ended".into());
        }
        for event in events {
            match event {
                Event::Message(_) => done += 1,
                Event::PeerLost(lost) => return Err(format!("peer lost: {lost:?}").into()),
            }
        }
    }
    let elapsed = started.elapsed();
    client.stop().await?;
    server.stop().await?;
    echo.await??;
    Ok(elapsed)
}

async fn start<V: Van + 'static>(van: V, id: i32) -> Result<(Arc<V>, Inbox, Node), BoxError> {
    let van = Arc::new(van);
    let (tx, rx) = inbox(1024);
    let endpoint = van.bind("127.0.0.1", 0, tx).await?;
    let mut node = Node::new(Role::Worker, "127.0.0.1", 0).with_id(id);
    node.endpoints.push(endpoint);
    Ok((van, rx, node))
}

/// Answers every request with `reply` bytes, in batches, until the inbox ends.
async fn echo<V: Van>(van: Arc<V>, mut inbox: Inbox, reply: usize) -> Result<(), BoxError> {
    let answer = Bytes::from(vec![1u8; reply]);
    let mut events = Vec::new();
    while inbox.recv_batch(&mut events).await > 0 {
        let mut replies = Vec::with_capacity(events.len());
        for event in events.drain(..) {
            if let Event::Message(msg) = event {
                let mut out = Message::to(msg.meta.sender.unwrap_or(9), vec![answer.clone()]);
                out.meta.sender = Some(8);
                out.meta.request_id = msg.meta.request_id;
                replies.push(out);
            }
        }
        if van.send_batch(replies).await.is_err() {
            // The client stopped first; the run is over.
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_flags_parse_and_nothing_else_does() {
        Options::command().debug_assert();
        let o = Options::try_parse_from(["van-bench", "--quick", "--json"]).unwrap();
        assert!(o.quick && o.json);
        let o = Options::try_parse_from(["van-bench"]).unwrap();
        assert!(!o.quick && !o.json);
        assert!(Options::try_parse_from(["van-bench", "--fast"]).is_err());
    }
}
