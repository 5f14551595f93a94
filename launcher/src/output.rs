//! Output: each line a node writes, printed with the node's name in front as it arrives,
//! and the launcher's own messages.

use std::fmt;
use std::io::{self, Write};

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// A line of node output longer than this is printed in pieces of this many bytes.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// Where a node's output line goes.
#[derive(Debug, Clone)]
pub(crate) enum Sink {
    Stdout,
    Stderr,
    #[cfg(test)]
    Capture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>),
}

/// Prints each line of `pipe` with `prefix`, as it arrives; invalid UTF-8 becomes U+FFFD and
/// lines longer than [`MAX_LINE_BYTES`] are split.
pub(crate) async fn forward_lines(pipe: impl AsyncRead + Unpin, prefix: String, sink: Sink) {
    let mut reader = BufReader::new(pipe);
    let mut line = Vec::new();
    loop {
        let buffer = match reader.fill_buf().await {
            Ok(buffer) => buffer,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if buffer.is_empty() {
            break;
        }
        let room = MAX_LINE_BYTES - line.len();
        let (taken, complete) = match buffer.iter().take(room).position(|&byte| byte == b'\n') {
            Some(newline) => {
                line.extend_from_slice(&buffer[..newline]);
                (newline + 1, true)
            }
            None => {
                let taken = buffer.len().min(room);
                line.extend_from_slice(&buffer[..taken]);
                (taken, line.len() == MAX_LINE_BYTES)
            }
        };
        reader.consume(taken);
        if complete {
            print_line(&prefix, &line, &sink);
            line.clear();
        }
    }
    if !line.is_empty() {
        print_line(&prefix, &line, &sink);
    }
}

fn print_line(prefix: &str, line: &[u8], sink: &Sink) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut text = String::with_capacity(prefix.len() + line.len() + 1);
    text.push_str(prefix);
    text.push_str(&String::from_utf8_lossy(line));
    text.push('\n');
    // One write per line keeps lines of different nodes whole. A closed stdout or stderr
    // must not stop the node (its pipe would fill) nor the launcher, so errors are dropped.
    let _ = match sink {
        Sink::Stdout => io::stdout().lock().write_all(text.as_bytes()),
        Sink::Stderr => io::stderr().lock().write_all(text.as_bytes()),
        #[cfg(test)]
        Sink::Capture(buffer) => buffer
            .lock()
            .map(|mut buffer| buffer.extend_from_slice(text.as_bytes()))
            .map_err(|_| io::ErrorKind::Other.into()),
    };
}

/// Prints one of the launcher's own messages on stderr.
pub(crate) fn say(message: fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr().lock(), "[launcher] {message}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_prefixed_split_when_long_and_decoded_lossily() {
        let (mut writer, reader) = tokio::io::duplex(1024);
        let captured = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = Sink::Capture(captured.clone());
        let task = tokio::spawn(forward_lines(reader, "[worker 2] ".into(), sink));
        let mut data = b"first\n".to_vec();
        data.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 10));
        data.extend_from_slice(b"\n\xff\xfe bad\r\n\nno newline");
        tokio::io::AsyncWriteExt::write_all(&mut writer, &data)
            .await
            .ok();
        drop(writer);
        assert!(task.await.is_ok());
        let text = captured.lock().map(|text| text.clone()).unwrap_or_default();
        let text = String::from_utf8(text).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let long = "x".repeat(MAX_LINE_BYTES);
        let expected = [
            "[worker 2] first".to_owned(),
            format!("[worker 2] {long}"),
            "[worker 2] xxxxxxxxxx".to_owned(),
            "[worker 2] \u{fffd}\u{fffd} bad".to_owned(),
            "[worker 2] ".to_owned(),
            "[worker 2] no newline".to_owned(),
        ];
        assert_eq!(lines, expected);
    }
}
