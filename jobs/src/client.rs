//! A minimal HTTP/1.1 client for the master's JSON API: one request per connection
//! (`Connection: close`), enough for `vans-submit` and the tests, without an HTTP stack.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::BoxError;

/// Longest a request may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Sends `method path` with an optional JSON body to the master at `addr` (`host:port`),
/// presenting `token` when given, and returns the status code and body.
pub async fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&crate::token::Token>,
) -> Result<(u16, String), BoxError> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("cannot reach the master at {addr}: {e}"))?;
        let body = body.unwrap_or("");
        let authorization = token
            .map(|t| format!("Authorization: Bearer {}\r\n", t.expose()))
            .unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
             {authorization}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        parse_response(&response)
    };
    match tokio::time::timeout(TIMEOUT, exchange).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "the master at {addr} did not answer {method} {path} within {TIMEOUT:?}"
        )
        .into()),
    }
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
}
