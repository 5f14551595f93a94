//! One TCP connection: a writer task that drains a peer queue in batches with vectored
//! writes, and a reader task that reassembles frames and delivers them in batches.

use std::io::{self, IoSlice};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use van_core::link::stream::{self, Closed};
use van_core::link::Frame;
use van_core::wire::{self, FrameHeader, Limits, HEADER_LEN};
use van_core::{Event, FramePool, InboxSender, Message, WireError};

/// Most frames one writer batch takes from the queue (each is ≤ 1 + 2 × segments parts).
const MAX_BATCH_FRAMES: usize = 256;
/// Most iovecs per `writev` (Linux `IOV_MAX`).
const MAX_IOVECS: usize = 1024;
/// Bytes a reader asks the kernel for at a time.
const READ_CHUNK: usize = 64 * 1024;
/// Frames larger than this are read into a buffer of their own, so their bytes are copied
/// once (kernel to frame buffer) however the stream was cut into reads.
pub(crate) const LARGE_FRAME: usize = 256 * 1024;
/// How far a large frame's buffer may run ahead of the bytes that have arrived: a peer that
/// declares a huge frame and sends nothing makes us allocate at most this much.
const LARGE_FRAME_WINDOW: usize = 4 << 20;

/// Writes every queued frame until the queue closes, many frames per system call. Each part
/// is dropped as soon as it is written, so a frame's budget comes back before the rest of the
/// batch goes out and senders refill the queue meanwhile.
///
/// Once the queue closes (a stop, or the connection's end), it sends FIN after the data and waits up to `linger` for
/// the peer to acknowledge everything: the connection closes when the writer and reader are
/// gone, and a close with unread input would reset it and drop what is still unsent.
pub(crate) async fn write_loop(
    mut queue: mpsc::Receiver<Frame>,
    mut socket: OwnedWriteHalf,
    linger: std::time::Duration,
) -> io::Result<()> {
    let mut frames = Vec::with_capacity(MAX_BATCH_FRAMES);
    let mut parts: Vec<Bytes> = Vec::new();
    while queue.recv_many(&mut frames, MAX_BATCH_FRAMES).await > 0 {
        for frame in frames.drain(..) {
            parts.extend(frame);
        }
        write_all_parts(&mut socket, &mut parts).await?;
        parts.clear();
    }
    socket.shutdown().await?;
    stream::wait_sent(socket.as_ref(), linger).await;
    Ok(())
}

/// Writes `parts` completely with vectored writes; no payload byte is copied, and each part
/// is released (replaced by an empty one) once written.
async fn write_all_parts(socket: &mut OwnedWriteHalf, parts: &mut [Bytes]) -> io::Result<()> {
    let mut first = 0;
    while first < parts.len() {
        let end = (first + MAX_IOVECS).min(parts.len());
        let slices: Vec<IoSlice<'_>> = parts[first..end].iter().map(|p| IoSlice::new(p)).collect();
        let mut written = socket.write_vectored(&slices).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while written > 0 && first < parts.len() {
            let len = parts[first].len();
            if written >= len {
                written -= len;
                parts[first] = Bytes::new();
                first += 1;
            } else {
                parts[first].advance(written);
                written = 0;
            }
        }
    }
    Ok(())
}

/// Reassembles frames from `socket` and delivers them to `inbox` in batches (one channel hop
/// per read, however many frames it held). `on_message` sees each message first (the van
/// uses it to learn which peer is on this connection).
pub(crate) async fn read_loop(
    mut socket: OwnedReadHalf,
    limits: Limits,
    pool: &FramePool,
    inbox: &InboxSender,
    mut on_message: impl FnMut(&Message),
) -> Closed {
    // Frames are multiples of 8 bytes and `buf` starts 8-aligned (a fresh allocation), so
    // every frame split off it, and so every segment, stays 8-aligned.
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        // Room for exactly the complete frames the buffer holds, so a batch of small messages
        // does not grow its vector step by step.
        let mut batch = Vec::with_capacity(complete_frames(&buf));
        let mut large = None;
        while buf.len() >= HEADER_LEN {
            let header = match FrameHeader::parse(&buf[..HEADER_LEN], &limits) {
                Ok(header) => header,
                Err(e) => return Closed::Wire(e),
            };
            // `parse` checked frame_len ≤ max_frame, which fits in memory by construction.
            let len = usize::try_from(header.frame_len).unwrap_or(usize::MAX);
            if buf.len() >= len {
                match wire::decode(buf.split_to(len).freeze(), &limits) {
                    Ok(msg) => {
                        on_message(&msg);
                        batch.push(Event::Message(msg));
                    }
                    Err(e) => return Closed::Wire(e),
                }
            } else {
                if len > LARGE_FRAME {
                    large = Some(len);
                } else {
                    buf.reserve(len - buf.len());
                }
                break;
            }
        }
        if !batch.is_empty() && inbox.deliver(batch).await.is_err() {
            return Closed::InboxGone;
        }
        // What is left starts the next frame: garbage is refused before a whole header is in.
        if let Err(e) = wire::check_start(&buf) {
            return Closed::Wire(e);
        }
        if let Some(len) = large {
            let frame = match read_large_frame(&mut socket, &mut buf, len, pool).await {
                Ok(frame) => frame,
                Err(closed) => return closed,
            };
            match wire::decode(frame, &limits) {
                Ok(msg) => {
                    on_message(&msg);
                    if inbox.deliver(vec![Event::Message(msg)]).await.is_err() {
                        return Closed::InboxGone;
                    }
                }
                Err(e) => return Closed::Wire(e),
            }
            continue;
        }
        if buf.capacity() - buf.len() < READ_CHUNK / 4 {
            buf.reserve(READ_CHUNK);
        }
        match socket.read_buf(&mut buf).await {
            Ok(0) if buf.is_empty() => return Closed::Eof,
            Ok(0) => {
                return Closed::Wire(WireError::Truncated {
                    needed: peek_len(&buf),
                    available: buf.len() as u64,
                })
            }
            Ok(_) => {}
            Err(e) => return Closed::Io(e),
        }
    }
}

/// How many complete frames lie at the start of `buf` (reading only their length words; a
/// bad header counts as the end, and the decoding loop reports it).
fn complete_frames(buf: &[u8]) -> usize {
    let mut count = 0;
    let mut at = 0;
    while let Some(len) = buf.get(at + 8..at + 16) {
        let mut word = [0u8; 8];
        word.copy_from_slice(len);
        let len = usize::try_from(u64::from_le_bytes(word)).unwrap_or(usize::MAX);
        match at.checked_add(len) {
            Some(end) if len >= HEADER_LEN && end <= buf.len() => {
                count += 1;
                at = end;
            }
            _ => break,
        }
    }
    count
}

/// The declared length of the partial frame in `buf`, for error messages.
fn peek_len(buf: &[u8]) -> u64 {
    buf.get(8..16)
        .and_then(|b| b.try_into().ok())
        .map_or(HEADER_LEN as u64, u64::from_le_bytes)
}

/// Reads the rest of a `len`-byte frame whose start is in `buf` into a buffer of its own,
/// from `pool` (it goes back there once the application drops the frame).
///
/// The buffer grows with what has arrived (never more than [`LARGE_FRAME_WINDOW`] ahead of
/// it); growth uses `realloc`, which for buffers this large moves pages instead of copying
/// on Linux.
async fn read_large_frame(
    socket: &mut OwnedReadHalf,
    buf: &mut BytesMut,
    len: usize,
    pool: &FramePool,
) -> Result<Bytes, Closed> {
    let mut frame = pool.take(len.min(buf.len() + LARGE_FRAME_WINDOW));
    frame.extend_from_slice(buf);
    buf.clear();
    while frame.len() < len {
        if frame.len() == frame.capacity() {
            let target = len.min(frame.len() + frame.len().max(LARGE_FRAME_WINDOW));
            frame.reserve_exact(target - frame.len());
        }
        let room = frame.capacity().min(len) - frame.len();
        match socket.read_buf(&mut (&mut frame).limit(room)).await {
            Ok(0) => {
                return Err(Closed::Wire(WireError::Truncated {
                    needed: len as u64,
                    available: frame.len() as u64,
                }))
            }
            Ok(_) => {}
            Err(e) => return Err(Closed::Io(e)),
        }
    }
    Ok(pool.freeze(frame))
}
