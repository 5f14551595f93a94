//! The master's listener: every connection served by hyper with a deadline on the request
//! (a client that sends half a request, or a body that never ends, is answered 408 or cut
//! off, instead of holding a connection and a task for ever) and on writing the answer (a
//! client that never reads is cut off), at most so many connections at once (503 beyond),
//! optionally over TLS.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use jobs::BoxError;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{sleep, Sleep};

/// How long the headers and then the body of a request may take to arrive.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    pub(crate) read: Duration,
    /// The largest body, bytes.
    pub(crate) max_body: usize,
}

/// What one connection may take: time to read a request, time to write an answer, and how
/// many connections are served at once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) read: Duration,
    pub(crate) write: Duration,
    pub(crate) connections: usize,
}

/// The answer to a connection beyond [`Limits::connections`].
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\
Content-Type: text/plain\r\nContent-Length: 56\r\nRetry-After: 1\r\n\r\n\
the master serves too many connections; try again later\n";

/// Serves `router` on `listener` until the process ends; each connection over TLS when
/// `tls` is given.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Option<Tls>,
    limits: Limits,
) -> Result<(), BoxError> {
    let slots = Arc::new(Semaphore::new(limits.connections));
    let read_timeout = limits.read;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, say: the next accept may succeed once some close.
                eprintln!("vans-master: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            // Told so, without reading its request; over TLS there is no plain text to send.
            if tls.is_none() {
                tokio::spawn(async move {
                    let mut stream = stream;
                    let busy = async {
                        stream.write_all(BUSY).await?;
                        stream.shutdown().await
                    };
                    let _ = tokio::time::timeout(limits.write, busy).await;
                });
            }
            continue;
        };
        let (router, tls) = (router.clone(), tls.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let stream = WriteDeadline::new(stream, limits.write);
            let Some(tls) = tls else {
                return connection(stream, router, read_timeout).await;
            };
            // A client that is not speaking TLS, or not trusting us, or too slow to: dropped.
            if let Ok(Ok(stream)) = tokio::time::timeout(read_timeout, tls.accept(stream)).await {
                connection(stream, router, read_timeout).await;
            }
        });
    }
}

/// One connection: HTTP/1.1 with the header deadline.
async fn connection<S>(stream: S, router: Router, read_timeout: Duration)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(read_timeout)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(router))
        .await;
    // A connection cut by its client or by the deadline: nothing to tell anyone.
    drop(served);
}

/// A body over the limit is still read, and dropped, up to this many bytes before the 413
/// goes out: a client that writes its whole request before reading (most do) would otherwise
/// meet a reset in the middle of its write and never see the answer. This is the "lingering
/// close" of nginx and Apache. A longer body is cut off at this point.
const DRAIN_LIMIT: u64 = 64 << 20;

/// A stream whose writes fail with `TimedOut` once one has waited `limit` without any byte
/// going out: a client that stops reading cannot hold its connection, and the task serving
/// it, for ever.
struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    /// Armed while a write waits; dropped when bytes go out.
    waiting: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteDeadline<S> {
    fn new(inner: S, limit: Duration) -> Self {
        WriteDeadline {
            inner,
            limit,
            waiting: None,
        }
    }

    /// `poll`'s result, or `TimedOut` when it keeps waiting past the limit.
    fn bounded<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut S>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>>
    where
        S: Unpin,
    {
        match poll(Pin::new(&mut self.inner), cx) {
            Poll::Ready(result) => {
                self.waiting = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let limit = self.limit;
                let waiting = self.waiting.get_or_insert_with(|| Box::pin(sleep(limit)));
                match waiting.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client read nothing of the answer in time",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().bounded(cx, |s, cx| s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .bounded(cx, |s, cx| s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().bounded(cx, |s, cx| s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().bounded(cx, |s, cx| s.poll_shutdown(cx))
    }
}

/// Reads the whole body (at most `max_body` bytes) within the deadline before the handler
/// runs: 408 when it does not come in time, 413 when it is too large.
/// The router's layer under the token check (so no body is read for a caller without it).
pub(crate) async fn read_body(
    State(deadline): State<Deadline>,
    request: Request,
    next: Next,
) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > DRAIN_LIMIT) {
        return too_large(deadline);
    }
    let (parts, body) = request.into_parts();
    let read = read_limited(body, deadline.max_body);
    match tokio::time::timeout(deadline.read, read).await {
        Ok(Some(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        // Over the limit (drained, or cut off past the drain limit): no handler sees it.
        Ok(None) => too_large(deadline),
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {:?}\n",
                deadline.read
            ),
        )
            .into_response(),
    }
}

/// The body when it is at most `max` bytes; `None` when it is longer (read to its end, up to
/// [`DRAIN_LIMIT`], and dropped) or broken off by the client.
async fn read_limited(mut body: Body, max: usize) -> Option<Bytes> {
    use http_body_util::BodyExt;
    let mut kept = Vec::new();
    let mut seen = 0u64;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.ok()?.into_data() else {
            continue; // trailers
        };
        seen = seen.saturating_add(data.len() as u64);
        if seen > DRAIN_LIMIT {
            return None;
        }
        if seen <= max as u64 {
            kept.extend_from_slice(&data);
        }
    }
    (seen <= max as u64).then(|| Bytes::from(kept))
}

fn too_large(deadline: Deadline) -> Response {
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "a request body is at most {} bytes, and must be whole\n",
            deadline.max_body
        ),
    )
        .into_response()
}

/// The master's TLS: its certificate chain and key.
#[cfg(feature = "tls")]
#[derive(Clone)]
pub(crate) struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
}

/// Without the `tls` feature there is no TLS to serve: no value of this type exists.
#[cfg(not(feature = "tls"))]
#[derive(Clone)]
pub(crate) enum Tls {}

impl Tls {
    /// Loads the PEM certificate chain and private key (`--tls-cert`, `--tls-key`).
    #[cfg(feature = "tls")]
    pub(crate) fn load(cert: &Path, key: &Path) -> Result<Tls, BoxError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::PrivateKeyDer;
        let certs = jobs::tls::certificates(cert, "--tls-cert")?;
        let key = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
        let config = rustls::ServerConfig::builder_with_provider(jobs::tls::provider())
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
            .map_err(|e| format!("--tls-cert/--tls-key: {e}"))?;
        Ok(Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)),
        })
    }

    /// Without the `tls` feature: the error that says how to get it.
    #[cfg(not(feature = "tls"))]
    pub(crate) fn load(_cert: &Path, _key: &Path) -> Result<Tls, BoxError> {
        Err("--tls-cert needs a build with the `tls` feature \
             (cargo build --release -p jobs --features tls)"
            .into())
    }

    #[cfg(feature = "tls")]
    async fn accept<S>(&self, stream: S) -> std::io::Result<tokio_rustls::server::TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        self.acceptor.accept(stream).await
    }

    #[cfg(not(feature = "tls"))]
    async fn accept<S>(&self, _stream: S) -> std::io::Result<S> {
        match *self {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_answer_declares_its_own_length() {
        let text = std::str::from_utf8(BUSY).unwrap_or_default();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or_default();
        let declared = head
            .lines()
            .find_map(|line| line.strip_prefix("Content-Length: "))
            .and_then(|n| n.parse::<usize>().ok());
        assert_eq!(declared, Some(body.len()));
        assert!(head.starts_with("HTTP/1.1 503 "));
    }
}
