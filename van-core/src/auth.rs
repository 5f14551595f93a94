//! Cluster authentication: a shared secret, and a mutual challenge–response that every van
//! runs on every new connection before it reads a single frame.
//!
//! # Threat model
//!
//! With a [`ClusterSecret`] configured (`VANS_CLUSTER_SECRET`, or `VANS_CLUSTER_SECRET_FILE`
//! for a mounted Kubernetes Secret), only processes that know the secret join the cluster: a
//! connection from anyone else is refused before any of its bytes are decoded, so it cannot
//! register with the scheduler, inject frames or read values. That is *authentication and
//! integrity of membership*. The frames themselves are not encrypted or signed after the
//! handshake: on a network where others can read or rewrite traffic, run the cluster inside a
//! VPN such as WireGuard (or IPsec) for confidentiality. Without a secret, anyone who can reach
//! a node's port can join, as in ps-lite; nodes then warn when they listen on an address that
//! is not loopback.
//!
//! # The handshake
//!
//! Both sides send a hello at once: `VANSAUTH`, a version (u16 LE), two reserved bytes and a
//! fresh 32-byte nonce from the operating system. Each then proves it knows the secret by
//! sending `HMAC-SHA256(secret, "vans-auth-v1" ‖ side ‖ peer's nonce ‖ own nonce)`, where
//! `side` is `D` for the dialer and `A` for the acceptor (so one side's proof is never valid
//! for the other, and a reflected hello is refused), and checks the peer's proof with a
//! constant-time comparison. One round trip for the hellos, one for the proofs; then frames
//! flow. The whole exchange runs under a timeout ([`Gate`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::{debug, warn};

/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;
/// How long a new connection may take to authenticate, unless `VANS_HANDSHAKE_TIMEOUT_MS`
/// says otherwise.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The first bytes of a hello.
const HELLO_MAGIC: [u8; 8] = *b"VANSAUTH";
const VERSION: u16 = 1;
const NONCE_LEN: usize = 32;
const HELLO_LEN: usize = HELLO_MAGIC.len() + 4 + NONCE_LEN;
const PROOF_LEN: usize = 32;
const CONTEXT: &[u8] = b"vans-auth-v1";

/// The secret every node of a cluster shares. Its `Debug` form does not show it.
#[derive(Clone)]
pub struct ClusterSecret(Arc<[u8]>);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterSecret({} bytes)", self.0.len())
    }
}

impl PartialEq for ClusterSecret {
    fn eq(&self, other: &ClusterSecret) -> bool {
        self.0 == other.0
    }
}

impl Eq for ClusterSecret {}

impl ClusterSecret {
    /// A secret of `bytes`, at least [`MIN_SECRET_BYTES`] long (for example 32 random bytes,
    /// hex-encoded: `openssl rand -hex 32`).
    pub fn new(bytes: impl AsRef<[u8]>) -> Result<ClusterSecret, SecretError> {
        let bytes = bytes.as_ref();
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort { len: bytes.len() });
        }
        Ok(ClusterSecret(Arc::from(bytes)))
    }

    /// A secret read from `path`: the file's bytes, without a trailing newline.
    pub fn from_file(path: &std::path::Path) -> Result<ClusterSecret, SecretError> {
        let bytes = std::fs::read(path).map_err(|e| SecretError::Unreadable {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let trimmed = bytes
            .strip_suffix(b"\r\n")
            .or_else(|| bytes.strip_suffix(b"\n"))
            .unwrap_or(&bytes);
        ClusterSecret::new(trimmed)
    }

    /// The proof that `side` knows the secret, answering `challenge` with its own `nonce`.
    fn proof(&self, side: Side, challenge: &[u8], nonce: &[u8]) -> Hmac<Sha256> {
        // An HMAC key may have any length, so this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(CONTEXT);
        mac.update(&[side.label()]);
        mac.update(challenge);
        mac.update(nonce);
        mac
    }
}

/// A secret that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// Too short to resist guessing.
    #[error(
        "the cluster secret has {len} bytes; at least {MIN_SECRET_BYTES} are needed \
         (for example `openssl rand -hex 32`)"
    )]
    TooShort {
        /// Its length.
        len: usize,
    },
    /// The secret file cannot be read.
    #[error("cannot read the cluster secret file {path}: {reason}")]
    Unreadable {
        /// The file.
        path: String,
        /// The OS error.
        reason: String,
    },
}

/// Which end of a connection a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The node that connected.
    Dialer,
    /// The node that accepted.
    Acceptor,
}

impl Side {
    fn label(self) -> u8 {
        match self {
            Side::Dialer => b'D',
            Side::Acceptor => b'A',
        }
    }

    fn other(self) -> Side {
        match self {
            Side::Dialer => Side::Acceptor,
            Side::Acceptor => Side::Dialer,
        }
    }
}

/// Why a connection was not authenticated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The exchange did not finish in time.
    #[error("the peer did not authenticate within {0:?}")]
    Timeout(Duration),
    /// The peer sent something other than a hello: a node without a cluster secret, or not a
    /// vans node at all.
    #[error(
        "the peer did not start the vans authentication (it has no cluster secret configured, \
         or is not a vans node)"
    )]
    NotAuthenticating,
    /// The peer closed the connection during the exchange (a node without a secret closes
    /// on our hello, which it reads as a bad frame).
    #[error(
        "the peer closed the connection during authentication (it may have no cluster secret \
         configured, or a different one)"
    )]
    Closed,
    /// The peer speaks another version of the handshake.
    #[error("the peer speaks authentication version {0}; this node speaks {VERSION}")]
    Version(u16),
    /// The peer's proof does not match: it holds a different secret.
    #[error("the peer's proof does not match: it has a different cluster secret")]
    WrongSecret,
    /// The peer sent our own nonce back: a reflection, or a connection to ourselves.
    #[error("the peer sent our own challenge back (a reflection, or a connection to ourselves)")]
    Reflected,
    /// The van holds as many accepted connections as it may, from this address or in all.
    #[error(
        "{count} connections are open {scope}, the most allowed ({}); this one is closed",
        if *per_address { "VANS_MAX_CONNECTIONS_PER_ADDRESS" } else { "VANS_MAX_CONNECTIONS" }
    )]
    TooManyConnections {
        /// How many are open.
        count: usize,
        /// Whether the limit is the one per address (else the total).
        per_address: bool,
        /// `from this address` or `in all`, for the message.
        scope: &'static str,
    },
    /// Too many connections from this address are authenticating at once.
    #[error("{count} connections from this address are already authenticating (at most {max})")]
    TooManyPending {
        /// How many are.
        count: usize,
        /// The limit (`VANS_MAX_PENDING_PER_ADDRESS`).
        max: usize,
    },
    /// The connection failed.
    #[error("the connection failed during authentication: {0}")]
    Io(std::io::Error),
}

impl From<std::io::Error> for AuthError {
    fn from(e: std::io::Error) -> AuthError {
        match e.kind() {
            std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe => AuthError::Closed,
            _ => AuthError::Io(e),
        }
    }
}

/// Runs the handshake on `stream` as `side`, with no time limit (see [`Gate::authenticate`]).
/// On success the stream is positioned at the peer's first frame.
pub async fn handshake<S>(
    stream: &mut S,
    secret: &ClusterSecret,
    side: Side,
) -> Result<(), AuthError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce).map_err(|e| AuthError::Io(e.into()))?;
    let mut hello = [0u8; HELLO_LEN];
    hello[..8].copy_from_slice(&HELLO_MAGIC);
    hello[8..10].copy_from_slice(&VERSION.to_le_bytes());
    hello[12..].copy_from_slice(&nonce);
    stream.write_all(&hello).await?;
    stream.flush().await?;

    // The magic first: a peer that sends frames instead is refused before more is read.
    let mut peer = [0u8; HELLO_LEN];
    stream.read_exact(&mut peer[..8]).await?;
    if peer[..8] != HELLO_MAGIC {
        return Err(AuthError::NotAuthenticating);
    }
    stream.read_exact(&mut peer[8..]).await?;
    let version = u16::from_le_bytes([peer[8], peer[9]]);
    if version != VERSION {
        return Err(AuthError::Version(version));
    }
    let peer_nonce = &peer[12..];
    if peer_nonce == nonce {
        return Err(AuthError::Reflected);
    }

    let proof = secret
        .proof(side, peer_nonce, &nonce)
        .finalize()
        .into_bytes();
    stream.write_all(&proof).await?;
    stream.flush().await?;
    let mut answer = [0u8; PROOF_LEN];
    stream.read_exact(&mut answer).await?;
    secret
        .proof(side.other(), &nonce, peer_nonce)
        .verify_slice(&answer)
        .map_err(|_| AuthError::WrongSecret)
}

/// How a van authenticates its connections: part of every van's options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthOptions {
    /// The cluster secret; `None`: connections are not authenticated.
    pub secret: Option<ClusterSecret>,
    /// How long a new connection may take to authenticate.
    pub handshake_timeout: Duration,
    /// Connections one address may have authenticating at once.
    pub max_pending_per_address: usize,
    /// Accepted connections a van keeps open at once, in all.
    pub max_connections: usize,
    /// Accepted connections a van keeps open at once from one address.
    pub max_connections_per_address: usize,
}

impl Default for AuthOptions {
    fn default() -> AuthOptions {
        AuthOptions {
            secret: None,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_pending_per_address: DEFAULT_MAX_PENDING_PER_ADDRESS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
        }
    }
}

/// Where a van's new connections are admitted: its [`AuthOptions`] and the record of
/// connections authenticating and refused. Clones share the record.
#[derive(Debug, Clone)]
pub struct Gate {
    options: AuthOptions,
    record: Arc<Record>,
}

#[derive(Debug, Default)]
struct Record {
    refused: AtomicU64,
    /// Refusals per address, for logging the first one loudly; at most
    /// [`REMEMBERED_ADDRESSES`] addresses are remembered.
    by_address: Mutex<HashMap<String, u64>>,
    pending: Mutex<Places>,
}

/// Connections authenticating now, per address and in all.
#[derive(Debug, Default)]
struct Places {
    by_address: HashMap<IpAddr, usize>,
    total: usize,
}

/// Addresses whose refusals are counted for the log; beyond them refusals are logged at
/// debug level and only counted in all, so that a flood from many addresses cannot grow the
/// record without bound.
const REMEMBERED_ADDRESSES: usize = 1024;
/// Connections authenticating at once from all addresses together, in multiples of the
/// per-address bound.
const PENDING_TOTAL_FACTOR: usize = 16;

/// One connection authenticating; releases its place when dropped.
#[derive(Debug)]
pub struct Authenticating {
    record: Arc<Record>,
    address: IpAddr,
}

impl Drop for Authenticating {
    fn drop(&mut self) {
        let mut places = lock(&self.record.pending);
        places.total = places.total.saturating_sub(1);
        if let Some(n) = places.by_address.get_mut(&self.address) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                places.by_address.remove(&self.address);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Connections one address may have authenticating at once, unless
/// `VANS_MAX_PENDING_PER_ADDRESS` says otherwise.
pub const DEFAULT_MAX_PENDING_PER_ADDRESS: usize = 64;
/// Accepted connections a van keeps open at once, unless `VANS_MAX_CONNECTIONS` says
/// otherwise: room for a few thousand peers with two connections each.
pub const DEFAULT_MAX_CONNECTIONS: usize = 8192;
/// Accepted connections a van keeps open from one address, unless
/// `VANS_MAX_CONNECTIONS_PER_ADDRESS` says otherwise: a host may run many nodes.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 1024;

impl Gate {
    /// The gate `options` describe.
    pub fn new(options: AuthOptions) -> Gate {
        Gate {
            options,
            record: Arc::default(),
        }
    }

    /// The options the gate admits by.
    pub fn options(&self) -> &AuthOptions {
        &self.options
    }

    /// Whether connections must authenticate.
    pub fn requires_auth(&self) -> bool {
        self.options.secret.is_some()
    }

    /// Warns when a node without a secret listens where others can reach it.
    pub fn warn_if_open(&self, host: &str) {
        if self.requires_auth() {
            return;
        }
        let loopback =
            host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            warn!(
                host,
                "no cluster secret is set (VANS_CLUSTER_SECRET or VANS_CLUSTER_SECRET_FILE): \
                 anyone who can reach this address can join the cluster"
            );
        }
    }

    /// Takes a place for a connection from `address` that is about to authenticate, or
    /// refuses it when that address already has its bound authenticating, or all addresses
    /// together have `PENDING_TOTAL_FACTOR` (16) times that (a flood of idle connections, from
    /// one address or many, then cannot hold a node's listener or its descriptors).
    pub fn admit(&self, address: IpAddr) -> Result<Authenticating, AuthError> {
        let per_address = self.options.max_pending_per_address.max(1);
        let total = per_address.saturating_mul(PENDING_TOTAL_FACTOR);
        let mut places = lock(&self.record.pending);
        let count = places.by_address.get(&address).copied().unwrap_or(0);
        let refusal = if count >= per_address {
            Some(AuthError::TooManyPending {
                count,
                max: per_address,
            })
        } else if places.total >= total {
            Some(AuthError::TooManyPending {
                count: places.total,
                max: total,
            })
        } else {
            None
        };
        if let Some(error) = refusal {
            drop(places);
            self.refuse(&address, &error);
            return Err(error);
        }
        *places.by_address.entry(address).or_insert(0) += 1;
        places.total += 1;
        Ok(Authenticating {
            record: Arc::clone(&self.record),
            address,
        })
    }

    /// Authenticates a new connection from or to `peer` (its address, for the log) as `side`
    /// within the timeout (at once without a secret). A refusal of an accepted connection is
    /// recorded (see [`refuse`](Self::refuse)).
    pub async fn authenticate<S>(
        &self,
        stream: &mut S,
        side: Side,
        peer: &(dyn std::fmt::Display + Sync),
    ) -> Result<(), AuthError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let Some(secret) = &self.options.secret else {
            return Ok(());
        };
        let timeout = self.options.handshake_timeout;
        let result = match tokio::time::timeout(timeout, handshake(stream, secret, side)).await {
            Ok(result) => result,
            Err(_) => Err(AuthError::Timeout(timeout)),
        };
        if let Err(e) = &result {
            if side == Side::Acceptor {
                self.refuse(peer, e);
            }
        }
        result
    }

    /// Records a refused connection from `address`: counted, and logged at `warn` the first
    /// time for that address (then at `debug`). Vans call it for refusals of their own too
    /// (the RDMA van's handshake bound), so every refusal is counted and logged one way.
    pub fn refuse(&self, address: &dyn std::fmt::Display, error: &dyn std::fmt::Display) {
        self.record.refused.fetch_add(1, Ordering::Relaxed);
        let address = address.to_string();
        let mut by_address = lock(&self.record.by_address);
        let first = if let Some(count) = by_address.get_mut(&address) {
            *count += 1;
            false
        } else if by_address.len() < REMEMBERED_ADDRESSES {
            by_address.insert(address.clone(), 1);
            true
        } else {
            false
        };
        drop(by_address);
        if first {
            warn!(%address, "refused a connection: {error} (later refusals from this address are logged at debug level)");
        } else {
            debug!(%address, "refused a connection: {error}");
        }
    }

    /// Connections refused so far (failed authentication, over the pending bounds, or
    /// recorded by the van through [`refuse`](Self::refuse)).
    pub fn refused_count(&self) -> u64 {
        self.record.refused.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
