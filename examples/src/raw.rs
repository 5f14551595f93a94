//! The reference every benchmark compares with: a plain tokio socket on loopback.
//!
//! Length-prefixed frames, one `write_all` per message, a reader that counts replies to keep
//! a fixed number of requests in flight. Both ends run in the calling process
//! ([`raw_socket`]), or the echo end runs in another process ([`echo_server`],
//! [`raw_socket_to`]) so the reference crosses processes as a cluster's messages do.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Errors of the benchmarks.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One workload: payload size, requests in flight, total requests, reply size.
#[derive(Clone, Copy)]
pub struct Workload {
    /// Row name.
    pub name: &'static str,
    /// Request payload bytes.
    pub size: usize,
    /// Requests in flight.
    pub window: usize,
    /// Requests in total.
    pub count: usize,
    /// Reply payload bytes.
    pub reply: usize,
}

impl Workload {
    /// The figure the table shows: µs per op for window 1, ops/s for small, GB/s for large.
    pub fn figure(&self, elapsed: Duration) -> f64 {
        let secs = elapsed.as_secs_f64().max(1e-9);
        if self.window == 1 {
            secs * 1e6 / self.count as f64
        } else if self.size < 4096 {
            self.count as f64 / secs
        } else {
            (self.size * self.count) as f64 / secs / 1e9
        }
    }

    /// The unit of [`figure`](Self::figure).
    pub fn unit(&self) -> &'static str {
        if self.window == 1 {
            "µs/op"
        } else if self.size < 4096 {
            "ops/s"
        } else {
            "GB/s"
        }
    }
}

/// The reference: length-prefixed frames on a plain tokio socket, one write per message, both
/// ends in this process.
pub async fn raw_socket(w: Workload) -> Result<Duration, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let server = tokio::spawn(async move {
        let (socket, _) = listener.accept().await?;
        serve_echo(socket).await
    });
    let elapsed = drive(TcpStream::connect(address).await?, w).await?;
    server.await??;
    Ok(elapsed)
}

/// The same workload against an echo server in another process (see [`echo_server`]).
pub async fn raw_socket_to(address: &str, w: Workload) -> Result<Duration, BoxError> {
    drive(TcpStream::connect(address).await?, w).await
}

/// Serves echo connections one after another until the listener fails: what a second
/// process runs so the reference crosses processes like a cluster does.
pub async fn echo_server(listener: TcpListener) -> Result<(), BoxError> {
    loop {
        let (socket, _) = listener.accept().await?;
        serve_echo(socket).await?;
    }
}

/// Answers one connection: a handshake (reply bytes, request count), then for every
/// length-prefixed request a length-prefixed reply.
async fn serve_echo(socket: TcpStream) -> std::io::Result<()> {
    socket.set_nodelay(true)?;
    let (read, mut write) = socket.into_split();
    let mut read = BufReader::with_capacity(256 * 1024, read);
    let reply = read.read_u64_le().await?;
    let count = read.read_u64_le().await?;
    let reply = usize::try_from(reply).unwrap_or(0).min(1 << 30);
    let mut answer = (reply as u64).to_le_bytes().to_vec();
    answer.resize(8 + reply, 1);
    let mut frame = Vec::new();
    for _ in 0..count {
        let len = usize::try_from(read.read_u64_le().await?)
            .unwrap_or(0)
            .min(1 << 30);
        frame.resize(len, 0);
        read.read_exact(&mut frame).await?;
        write.write_all(&answer).await?;
    }
    Ok(())
}

/// The client side: keeps `w.window` requests in flight until `w.count` are answered.
async fn drive(socket: TcpStream, w: Workload) -> Result<Duration, BoxError> {
    socket.set_nodelay(true)?;
    let (read, mut write) = socket.into_split();
    let mut handshake = (w.reply as u64).to_le_bytes().to_vec();
    handshake.extend_from_slice(&(w.count as u64).to_le_bytes());
    write.write_all(&handshake).await?;
    let window = Arc::new(Semaphore::new(w.window));
    let reader_window = window.clone();
    let reader = tokio::spawn(async move {
        let mut read = BufReader::with_capacity(256 * 1024, read);
        let mut reply = vec![0u8; w.reply];
        for _ in 0..w.count {
            let len = usize::try_from(read.read_u64_le().await?)
                .unwrap_or(0)
                .min(1 << 30);
            reply.resize(len, 0);
            read.read_exact(&mut reply).await?;
            reader_window.add_permits(1);
        }
        Ok::<_, std::io::Error>(())
    });
    let payload = vec![7u8; w.size];
    let header = (w.size as u64).to_le_bytes();
    let started = Instant::now();
    for _ in 0..w.count {
        window.acquire().await?.forget();
        if w.size <= 4096 {
            let mut frame = header.to_vec();
            frame.extend_from_slice(&payload);
            write.write_all(&frame).await?;
        } else {
            write.write_all(&header).await?;
            write.write_all(&payload).await?;
        }
    }
    reader.await??;
    Ok(started.elapsed())
}
