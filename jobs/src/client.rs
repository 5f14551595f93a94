//! A minimal HTTP/1.1 client for the master's JSON API: one request per connection
//! (`Connection: close`), enough for `vans-submit` and the tests, without an HTTP stack;
//! over TLS (rustls, feature `tls`) for an `https://` master.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::BoxError;

/// Longest a request may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Sends `method path` with an optional JSON body to the master at `addr` (`host:port`,
/// plain HTTP), presenting `token` when given, and returns the status code and body.
pub async fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&crate::token::Token>,
) -> Result<(u16, String), BoxError> {
    Master::new(addr, None)?
        .request(method, path, body, token)
        .await
}

/// The master as a client reaches it: its address, and TLS for an `https://` one.
#[derive(Clone)]
pub struct Master {
    /// `host:port`.
    addr: String,
    #[cfg(feature = "tls")]
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
}

impl std::fmt::Debug for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Master")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Master {
    /// `master` is `host:port`, `http://host:port` or `https://host:port`; for `https`,
    /// `ca_file` names the PEM certificates to trust (the master's own, or the authority
    /// that signed it), and the certificate must name the host (a DNS name or IP address).
    pub fn new(master: &str, ca_file: Option<&std::path::Path>) -> Result<Master, BoxError> {
        let (https, rest) = match master.split_once("://") {
            Some(("https", rest)) => (true, rest),
            Some(("http", rest)) => (false, rest),
            Some((scheme, _)) => {
                return Err(
                    format!("the master {master}: {scheme}:// is neither http nor https").into(),
                )
            }
            None => (false, master),
        };
        let addr = rest.trim_end_matches('/').to_owned();
        if !https {
            if ca_file.is_some() {
                return Err(
                    format!("a CA file is for an https:// master; {master} is plain HTTP").into(),
                );
            }
            return Ok(Master {
                addr,
                #[cfg(feature = "tls")]
                tls: None,
            });
        }
        Master::https(addr, ca_file)
    }

    #[cfg(feature = "tls")]
    fn https(addr: String, ca_file: Option<&std::path::Path>) -> Result<Master, BoxError> {
        use rustls::pki_types::ServerName;
        let ca_file = ca_file.ok_or_else(|| {
            format!("https://{addr}: name the certificate to trust with --ca-file")
        })?;
        let mut roots = rustls::RootCertStore::empty();
        let (added, _) =
            roots.add_parsable_certificates(crate::tls::certificates(ca_file, "--ca-file")?);
        if added == 0 {
            return Err(format!("--ca-file {}: no certificate in it", ca_file.display()).into());
        }
        let host = match addr.rsplit_once(':') {
            Some((host, _)) => host.trim_start_matches('[').trim_end_matches(']'),
            None => addr.as_str(),
        };
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| format!("https://{addr}: {host} is no host name: {e}"))?;
        let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        Ok(Master {
            addr,
            tls: Some((connector, name)),
        })
    }

    #[cfg(not(feature = "tls"))]
    fn https(addr: String, _ca_file: Option<&std::path::Path>) -> Result<Master, BoxError> {
        Err(format!(
            "https://{addr}: this build has no TLS; rebuild with the `tls` feature \
             (cargo build --release -p jobs --features tls)"
        )
        .into())
    }

    /// Sends `method path` with an optional JSON body, presenting `token` when given, and
    /// returns the status code and body.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        token: Option<&crate::token::Token>,
    ) -> Result<(u16, String), BoxError> {
        let addr = &self.addr;
        let body = body.unwrap_or("");
        let authorization = token
            .map(|t| format!("Authorization: Bearer {}\r\n", t.expose()))
            .unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
             {authorization}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let call = async {
            let stream = TcpStream::connect(addr)
                .await
                .map_err(|e| format!("cannot reach the master at {addr}: {e}"))?;
            #[cfg(feature = "tls")]
            if let Some((connector, name)) = &self.tls {
                let stream = connector
                    .connect(name.clone(), stream)
                    .await
                    .map_err(|e| format!("TLS with the master at {addr}: {e}"))?;
                return exchange(stream, &head, body).await;
            }
            exchange(stream, &head, body).await
        };
        match tokio::time::timeout(TIMEOUT, call).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "the master at {addr} did not answer {method} {path} within {TIMEOUT:?}"
            )
            .into()),
        }
    }
}

/// Writes one request and reads the answer until the master closes the connection.
async fn exchange<S>(mut stream: S, head: &str, body: &str) -> Result<(u16, String), BoxError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.flush().await?;
    let mut response = Vec::new();
    if let Err(e) = stream.read_to_end(&mut response).await {
        // A TLS peer that closes without its close_notify, after a whole answer: the
        // answer stands (a cut one fails to parse below).
        if e.kind() != std::io::ErrorKind::UnexpectedEof || response.is_empty() {
            return Err(e.into());
        }
    }
    parse_response(&response)
}

/// The status code and body of a whole HTTP/1.1 response (chunked or not).
fn parse_response(bytes: &[u8]) -> Result<(u16, String), BoxError> {
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or("the master's answer is not HTTP (no end of headers)")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("the master's answer has no status: {head:?}"))?;
    let chunked = head
        .lines()
        .any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding:") && l.contains("chunked"));
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> Result<String, BoxError> {
    let mut out = String::new();
    loop {
        let (size, rest) = body
            .split_once("\r\n")
            .ok_or("a chunk without its size line")?;
        let size = usize::from_str_radix(size.trim(), 16).map_err(|_| "a bad chunk size")?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = rest.get(..size).ok_or("a chunk shorter than its size")?;
        out.push_str(chunk);
        body = rest.get(size..).unwrap_or("").trim_start_matches("\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_plain_and_chunked() {
        let plain = b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_response(plain).ok(), Some((201, "{}".to_owned())));
        let chunked =
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(
            parse_response(chunked).ok(),
            Some((200, "abcde".to_owned()))
        );
        assert!(parse_response(b"garbage").is_err());
    }

    #[test]
    fn master_addresses() {
        for plain in [
            "127.0.0.1:8470",
            "http://127.0.0.1:8470",
            "http://127.0.0.1:8470/",
        ] {
            let master = Master::new(plain, None).unwrap();
            assert_eq!(master.addr, "127.0.0.1:8470", "{plain}");
        }
        let refused = |master: &str, ca: Option<&std::path::Path>| {
            Master::new(master, ca).unwrap_err().to_string()
        };
        assert!(refused("ftp://h:1", None).contains("neither http nor https"));
        let ca = std::path::Path::new("ca.pem");
        assert!(refused("http://h:1", Some(ca)).contains("plain HTTP"));
        let https = refused("https://h:1", None);
        if cfg!(feature = "tls") {
            assert!(https.contains("--ca-file"), "{https}");
            let missing = refused(
                "https://h:1",
                Some(std::path::Path::new("/nonexistent.pem")),
            );
            assert!(missing.contains("/nonexistent.pem"), "{missing}");
        } else {
            assert!(https.contains("`tls` feature"), "{https}");
        }
    }
}
