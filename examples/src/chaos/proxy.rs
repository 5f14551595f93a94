//! A TCP fault proxy: it listens on a loopback port, forwards every connection to a target
//! address, and on command delays, throttles, stalls (blackhole), closes (cut) or resets
//! the connections passing through it.
//!
//! A blackhole holds the bytes instead of dropping them: what a TCP connection whose packets
//! are lost for a while looks like to its ends (the kernel retransmits; nothing arrives until
//! the path heals, then everything does). Dropping bytes inside a stream would not model a
//! network; a cut or a reset does, and loses what was in flight.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How the proxy treats the bytes it forwards, until told otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward at once.
    Pass,
    /// Hold every chunk this long before forwarding it.
    Delay(Duration),
    /// Forward at most this many bytes per second, each direction of each connection.
    Throttle(u64),
    /// Forward nothing (hold it) until the mode changes.
    Blackhole,
}

/// Counters of what went through a proxy.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Bytes forwarded, both directions.
    pub bytes: AtomicU64,
    /// Connections closed by [`FaultProxy::cut`] or reset by [`FaultProxy::reset`].
    pub broken: AtomicU64,
}

/// One connection through the proxy: its two sockets' pump tasks and a way to reset them.
struct Conn {
    pumps: [JoinHandle<()>; 2],
    client: std::net::TcpStream,
    server: std::net::TcpStream,
}

/// A running fault proxy; dropping it closes the listener and every connection.
pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    conns: Arc<Mutex<Vec<Conn>>>,
    stats: Arc<ProxyStats>,
    accept: JoinHandle<()>,
}

fn lock(conns: &Mutex<Vec<Conn>>) -> MutexGuard<'_, Vec<Conn>> {
    conns.lock().unwrap_or_else(|e| e.into_inner())
}

impl FaultProxy {
    /// Listens on `127.0.0.1:port` (0: any free port) and forwards to `target`.
    pub async fn start(port: u16, target: SocketAddr) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let addr = listener.local_addr()?;
        let (mode, _) = watch::channel(Mode::Pass);
        let conns = Arc::new(Mutex::new(Vec::new()));
        let stats = Arc::new(ProxyStats::default());
        let accept = tokio::spawn(accept_loop(
            listener,
            target,
            mode.clone(),
            Arc::clone(&conns),
            Arc::clone(&stats),
        ));
        Ok(FaultProxy {
            addr,
            mode,
            conns,
            stats,
            accept,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What went through so far.
    pub fn stats(&self) -> &ProxyStats {
        &self.stats
    }

    /// Changes how bytes are forwarded, for every connection, at once.
    pub fn set_mode(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Closes every connection in order (FIN both ways); returns how many.
    pub fn cut(&self) -> usize {
        self.break_all(false)
    }

    /// Resets every connection (RST both ways, unsent bytes discarded); returns how many.
    pub fn reset(&self) -> usize {
        self.break_all(true)
    }

    fn break_all(&self, reset: bool) -> usize {
        let conns: Vec<Conn> = lock(&self.conns).drain(..).collect();
        for conn in &conns {
            for pump in &conn.pumps {
                pump.abort();
            }
            for socket in [&conn.client, &conn.server] {
                if reset {
                    // Linger 0: close sends RST and drops what is unsent.
                    let _ = socket2::SockRef::from(socket).set_linger(Some(Duration::ZERO));
                } else {
                    let _ = socket.shutdown(std::net::Shutdown::Both);
                }
            }
        }
        self.stats
            .broken
            .fetch_add(conns.len() as u64, Ordering::Relaxed);
        conns.len()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    mode: watch::Sender<Mode>,
    conns: Arc<Mutex<Vec<Conn>>>,
    stats: Arc<ProxyStats>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let Ok(server) = TcpStream::connect(target).await else {
            // The target is down (a node restarting): the client sees a closed connection.
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (Ok(client_std), Ok(server_std)) = (dup(&client), dup(&server)) else {
            continue;
        };
        stats.connections.fetch_add(1, Ordering::Relaxed);
        let (client_rx, client_tx) = client.into_split();
        let (server_rx, server_tx) = server.into_split();
        let pumps = [
            tokio::spawn(pump(
                client_rx,
                server_tx,
                mode.subscribe(),
                Arc::clone(&stats),
            )),
            tokio::spawn(pump(
                server_rx,
                client_tx,
                mode.subscribe(),
                Arc::clone(&stats),
            )),
        ];
        let mut all = lock(&conns);
        all.retain(|c| !c.pumps.iter().all(JoinHandle::is_finished));
        all.push(Conn {
            pumps,
            client: client_std,
            server: server_std,
        });
    }
}

/// A second handle on the socket, to shut it down or reset it from outside its tasks.
fn dup(stream: &TcpStream) -> std::io::Result<std::net::TcpStream> {
    use std::os::fd::AsFd;
    let fd = stream.as_fd().try_clone_to_owned()?;
    Ok(std::net::TcpStream::from(fd))
}

/// Forwards one direction under the current mode until either end closes.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    stats: Arc<ProxyStats>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        loop {
            let now = *mode.borrow_and_update();
            match now {
                Mode::Pass => break,
                Mode::Delay(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                Mode::Throttle(rate) => {
                    let secs = n as f64 / rate.max(1) as f64;
                    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                    break;
                }
                Mode::Blackhole => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        stats.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::time::Instant;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream) -> std::io::Result<[u8; 4]> {
        s.write_all(b"ping").await?;
        let mut back = [0u8; 4];
        s.read_exact(&mut back).await?;
        Ok(back)
    }

    #[tokio::test]
    async fn forwards_delays_holds_and_breaks_connections() {
        let proxy = FaultProxy::start(0, echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(&round_trip(&mut s).await.unwrap(), b"ping");

        proxy.set_mode(Mode::Delay(Duration::from_millis(100)));
        let t = Instant::now();
        round_trip(&mut s).await.unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "two delayed hops"
        );

        // A blackhole holds the bytes: nothing comes back until it lifts, then all does.
        proxy.set_mode(Mode::Blackhole);
        s.write_all(b"held").await.unwrap();
        let mut back = [0u8; 4];
        let waited =
            tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut back)).await;
        assert!(waited.is_err(), "bytes passed a blackhole");
        proxy.set_mode(Mode::Pass);
        s.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"held");

        // A reset: the client's next read fails (RST) or sees the end.
        assert_eq!(proxy.reset(), 1);
        let mut one = [0u8; 1];
        let after = s.read(&mut one).await;
        assert!(matches!(after, Ok(0) | Err(_)), "{after:?}");

        // New connections work again; a cut ends them in order.
        let mut s2 = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(&round_trip(&mut s2).await.unwrap(), b"ping");
        assert_eq!(proxy.cut(), 1);
        assert!(matches!(s2.read(&mut one).await, Ok(0) | Err(_)));
        assert_eq!(proxy.stats().broken.load(Ordering::Relaxed), 2);
        assert_eq!(proxy.stats().connections.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_throttle_bounds_the_rate() {
        let proxy = FaultProxy::start(0, echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        proxy.set_mode(Mode::Throttle(40));
        let t = Instant::now();
        round_trip(&mut s).await.unwrap();
        // 4 bytes at 40 B/s, both ways: 0.2 s at least.
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
    }
}
