//! Forming a generation's mesh (see the [module docs](super)): who wants one, the exchange
//! of addresses over the vans, the connections and the vote.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{debug, info};
use van_core::{NodeId, VanKind};

use super::peer::Peer;
use super::{Links, Mesh, MAX_RANKS};
use crate::comm::{MeshClaim, Op, Shared};
use crate::element::ReduceOp;
use crate::error::Result;

/// The op numbers of the exchanges that form a mesh: apart from every other's.
const FORM_OP: u64 = 3 << 61;
/// Words per rank in the first exchange: IPv4 address, port, token.
const ROW: usize = 3;
/// Longest wait for the connections of a forming mesh.
const CONNECT: Duration = Duration::from_secs(20);

/// Makes sure the mesh of `generation` is settled on this rank before a collective of it
/// runs: the first task to ask forms it (every rank of every generation of 2 or more takes
/// part in the exchange and the vote, wanting a mesh or not, so all decide alike whichever
/// way each entered the generation); the others wait for the outcome. A collective of the
/// generation then takes the mesh exactly when every rank has it.
pub(crate) async fn ensure(shared: &Shared, generation: u64) -> Result<()> {
    let op = match shared.claim_mesh(generation) {
        MeshClaim::Settled => return Ok(()),
        MeshClaim::Forming => return shared.mesh_settled(generation).await,
        MeshClaim::Form(op) => op,
    };
    if op.size() < 2 {
        shared.set_mesh(generation, None);
        return Ok(());
    }
    let formed = form(shared, &op).await;
    match formed {
        Ok(mesh) => {
            shared.set_mesh(generation, mesh);
            Ok(())
        }
        Err(e) => {
            debug!("no mesh for generation {generation}: {e}");
            shared.set_mesh(generation, None);
            Err(e)
        }
    }
}

/// Whether `members` form a mesh from this node: see the [module docs](self).
fn wanted(shared: &Shared, members: &[NodeId]) -> bool {
    let config = shared.po.config();
    if !shared.options.mesh
        || config.cluster_secret.is_some()
        || !matches!(config.stream_van, VanKind::Tcp | VanKind::Uring)
        || !(2..=MAX_RANKS).contains(&members.len())
    {
        return false;
    }
    // Ranks that all share a host talk through shared memory or their shared-memory van.
    let nodes = shared.po.nodes();
    let host = |id: NodeId| {
        nodes
            .iter()
            .find(|n| n.id == Some(id))
            .map(|n| n.host_identity.clone())
    };
    let first = host(members[0]);
    let one_host = first.is_some() && members.iter().all(|&m| host(m) == first);
    !(one_host && config.enable_ipc)
}

/// This node's IPv4 address as its peers know it (the node table's `host`).
fn my_address(shared: &Shared) -> Option<Ipv4Addr> {
    let me = shared.po.my_id();
    let node = shared.po.nodes().iter().find(|n| n.id == Some(me))?;
    match node.host.parse::<IpAddr>().ok()? {
        IpAddr::V4(ip) => Some(ip),
        IpAddr::V6(_) => None,
    }
}

/// Forms the mesh of `op`'s generation (see the [module docs](self)): `Ok(None)` when some
/// rank could not connect to every other (the generation keeps the vans).
async fn form(shared: &Shared, op: &Op) -> Result<Option<Arc<Mesh>>> {
    let (n, r) = (op.size(), op.rank);
    let want = wanted(shared, &op.members);
    let listener = my_address(shared).filter(|_| want).and_then(|ip| {
        let listener = TcpListener::bind((ip, 0)).ok()?;
        let port = listener.local_addr().ok()?.port();
        Some((listener, ip, port))
    });
    let mut table = vec![0i64; ROW * n];
    if let Some((_, ip, port)) = &listener {
        table[r * ROW] = i64::from(u32::from(*ip));
        table[r * ROW + 1] = i64::from(*port);
    }
    if r == 0 {
        // Positive as an `i64`.
        table[2] = (getrandom::u64().unwrap_or(0) >> 1) as i64;
    }
    let exchange = op.internal(FORM_OP).carrying::<i64>(table.len());
    crate::ring::direct(shared, &exchange, &mut table, ReduceOp::Sum).await?;
    let token = table[2] as u64;
    // Asynchronously: on a single-threaded runtime, a blocking wait here would also hold
    // back this rank's own row, still queued to its van.
    // Every rank sees who listens: without a listener everywhere, nobody dials or waits.
    let everyone = (0..n).all(|q| table[q * ROW + 1] != 0);
    let connected = match listener {
        _ if !crate::spin::can_block() => {
            Err("this rank runs on a current-thread runtime, which must not block".into())
        }
        _ if !everyone => Err("not every rank wants a mesh (or has an IPv4 address)".into()),
        Some((listener, _, _)) => connect_all(listener, &table, n, r, token).await,
        None => Err("this rank does not want a mesh".into()),
    };
    let mut vote = vec![i32::from(connected.is_ok())];
    let ballot = op.internal(FORM_OP + 1).carrying::<i32>(1);
    crate::ring::direct(shared, &ballot, &mut vote, ReduceOp::Min).await?;
    match (connected, vote[0]) {
        (Ok((peers, watch)), 1) => {
            let spin = crate::spin::policy(
                shared.options.spin,
                crate::hosts::on_this_machine(&shared.po, &op.members),
            );
            info!(
                "collectives of generation {} go over a TCP mesh ({n} ranks, {spin:?})",
                op.generation
            );
            Ok(Some(Arc::new(Mesh {
                members: op.members.clone(),
                generation: op.generation,
                spin,
                // Frames are slices.
                max_payload: shared.options.slice_bytes,
                pool: shared.pool.clone(),
                links: Mutex::new(Links {
                    peers,
                    early: HashMap::new(),
                }),
                watch,
            })))
        }
        (Ok(_), _) => {
            debug!(
                "no mesh for generation {}: another rank could not connect",
                op.generation
            );
            Ok(None)
        }
        (Err(why), _) => {
            debug!("no mesh for generation {}: {why}", op.generation);
            Ok(None)
        }
    }
}

/// Dials every higher rank and accepts every lower one, checking the token; the connections
/// by rank, non-blocking, without Nagle's delay (and a duplicate of each to poll).
async fn connect_all(
    listener: TcpListener,
    table: &[i64],
    n: usize,
    r: usize,
    token: u64,
) -> std::result::Result<Connections, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let deadline = tokio::time::Instant::now() + CONNECT;
    let late = |what: String| move |_| format!("{what}: no answer within {CONNECT:?}");
    let listener = listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener))
        .map_err(|e| format!("listener: {e}"))?;
    let dial = async {
        let mut dialed = Vec::new();
        for q in r + 1..n {
            let ip = u32::try_from(table[q * ROW]).map_err(|_| format!("rank {q}'s address"))?;
            let port = u16::try_from(table[q * ROW + 1]).map_err(|_| format!("rank {q}'s port"))?;
            if ip == 0 || port == 0 {
                return Err(format!("rank {q} has no listener"));
            }
            let to = SocketAddr::from((Ipv4Addr::from(ip), port));
            let mut stream = tokio::time::timeout_at(deadline, tokio::net::TcpStream::connect(to))
                .await
                .map_err(late(format!("connecting to rank {q} at {to}")))?
                .map_err(|e| format!("connecting to rank {q} at {to}: {e}"))?;
            let mut hello = [0u8; 16];
            hello[..8].copy_from_slice(&token.to_le_bytes());
            hello[8..].copy_from_slice(&(r as u64).to_le_bytes());
            stream
                .write_all(&hello)
                .await
                .map_err(|e| format!("greeting rank {q}: {e}"))?;
            dialed.push((q, stream));
        }
        Ok(dialed)
    };
    let accept = async {
        let mut accepted: Vec<(usize, tokio::net::TcpStream)> = Vec::new();
        while accepted.len() < r {
            let (mut stream, from) = tokio::time::timeout_at(deadline, listener.accept())
                .await
                .map_err(late(format!(
                    "{} lower ranks connecting",
                    r - accepted.len()
                )))?
                .map_err(|e| format!("accepting: {e}"))?;
            let mut hello = [0u8; 16];
            let read = tokio::time::timeout_at(deadline, stream.read_exact(&mut hello)).await;
            if !matches!(read, Ok(Ok(_))) {
                debug!("mesh: {from} sent no greeting; closed");
                continue;
            }
            let (mut t, mut q) = ([0u8; 8], [0u8; 8]);
            t.copy_from_slice(&hello[..8]);
            q.copy_from_slice(&hello[8..]);
            let q = usize::try_from(u64::from_le_bytes(q)).unwrap_or(usize::MAX);
            if u64::from_le_bytes(t) != token || q >= r || accepted.iter().any(|(p, _)| *p == q) {
                debug!("mesh: {from} sent a wrong greeting; closed");
                continue;
            }
            accepted.push((q, stream));
        }
        Ok::<_, String>(accepted)
    };
    let (dialed, accepted) = tokio::join!(dial, accept);
    let mut peers: Vec<Option<Peer>> = (0..n).map(|_| None).collect();
    let mut watch = Vec::new();
    for (q, stream) in dialed?.into_iter().chain(accepted?) {
        let stream = stream.into_std().map_err(|e| format!("socket: {e}"))?;
        watch.push((q, stream.try_clone().map_err(|e| format!("socket: {e}"))?));
        peers[q] = Some(ready(stream)?);
    }
    Ok((peers, watch))
}

/// A mesh's connections by rank, and a duplicate of each (by rank) to sleep on.
type Connections = (Vec<Option<Peer>>, Vec<(usize, TcpStream)>);

/// A connected stream made ready for the mesh.
pub(super) fn ready(stream: TcpStream) -> std::result::Result<Peer, String> {
    stream
        .set_nodelay(true)
        .and_then(|()| stream.set_nonblocking(true))
        .and_then(|()| stream.set_read_timeout(None))
        .map_err(|e| format!("socket options: {e}"))?;
    Ok(Peer::new(stream))
}
