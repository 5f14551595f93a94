//! One rank's TCP connection to another in a mesh: frames queued to send, written without
//! blocking, and frames read without blocking into whole messages.
//!
//! A frame is a 40-byte header (little-endian: collective number `u64`, hop `u32`, slice
//! `u32`, kind `i32`, element tag `u32`, total elements `u64`, payload length `u64`) and the
//! payload. Nothing else crosses the connection after the handshake.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;

use bytes::Bytes;

/// Header bytes of a frame.
pub(super) const HEADER: usize = 40;

/// What a frame says of itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Head {
    pub(super) number: u64,
    pub(super) hop: u32,
    pub(super) slice: u32,
    pub(super) kind: i32,
    pub(super) tag: u32,
    pub(super) total: u64,
    pub(super) len: u64,
}

impl Head {
    pub(super) fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[0..8].copy_from_slice(&self.number.to_le_bytes());
        b[8..12].copy_from_slice(&self.hop.to_le_bytes());
        b[12..16].copy_from_slice(&self.slice.to_le_bytes());
        b[16..20].copy_from_slice(&self.kind.to_le_bytes());
        b[20..24].copy_from_slice(&self.tag.to_le_bytes());
        b[24..32].copy_from_slice(&self.total.to_le_bytes());
        b[32..40].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub(super) fn decode(b: &[u8; HEADER]) -> Head {
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let u32_at = |i: usize| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&b[i..i + 4]);
            u32::from_le_bytes(w)
        };
        Head {
            number: u64_at(0),
            hop: u32_at(8),
            slice: u32_at(12),
            kind: u32_at(16) as i32,
            tag: u32_at(20),
            total: u64_at(24),
            len: u64_at(32),
        }
    }
}

/// A frame's payload to send.
pub(crate) enum Data<'a> {
    /// Bytes the mesh may keep until they are written.
    Owned(Bytes),
    /// The caller's bytes: copied only if the socket does not take them at once.
    Borrowed(&'a [u8]),
}

impl Data<'_> {
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Data::Owned(bytes) => bytes,
            Data::Borrowed(bytes) => bytes,
        }
    }
}

/// A frame to send: its header and payload, and how much of both is written.
struct Outgoing {
    header: [u8; HEADER],
    payload: Bytes,
    written: usize,
}

/// The frame being read: the header so far, then its payload.
enum Reading {
    Header {
        bytes: [u8; HEADER],
        have: usize,
    },
    /// A payload of `want` bytes, `bytes` holding what came (allocated for all of it, not
    /// zeroed: the socket fills it).
    Payload {
        head: Head,
        bytes: Vec<u8>,
        want: usize,
    },
    /// A payload read straight into the memory of the receiver waiting for it (a
    /// [`Target`]), `have` bytes of it so far.
    Direct {
        head: Head,
        have: usize,
    },
}

/// The frame a receiver waits for, and where its payload may land: the receiver's memory,
/// exactly its length.
pub(super) struct Target<'a> {
    /// The header the frame must have, to the bit (its length `buf`'s).
    pub(super) head: Head,
    pub(super) buf: &'a mut [u8],
}

/// A connection to one peer rank (non-blocking).
pub(super) struct Peer {
    pub(super) stream: TcpStream,
    out: VecDeque<Outgoing>,
    reading: Reading,
    /// Why the connection is unusable, once it is.
    pub(super) broken: Option<String>,
}

impl Peer {
    pub(super) fn new(stream: TcpStream) -> Peer {
        Peer {
            stream,
            out: VecDeque::new(),
            reading: Reading::Header {
                bytes: [0; HEADER],
                have: 0,
            },
            broken: None,
        }
    }

    /// Sends a frame: when no frame waits before it, writes as much as the socket takes at
    /// once (borrowed bytes the socket takes are never copied), and queues the rest, `copy`
    /// making a copy of borrowed bytes it must keep.
    pub(super) fn send(
        &mut self,
        head: &Head,
        data: Data<'_>,
        copy: impl FnOnce(&[u8]) -> Bytes,
    ) -> io::Result<()> {
        let header = head.encode();
        self.flush()?;
        let mut written = 0;
        if self.out.is_empty() {
            written = write_frame(&self.stream, &header, data.bytes(), 0)?;
            if written == HEADER + data.bytes().len() {
                return Ok(());
            }
        }
        let (payload, written) = match data {
            Data::Owned(bytes) => (bytes, written),
            Data::Borrowed(bytes) if written <= HEADER => (copy(bytes), written),
            Data::Borrowed(bytes) => (copy(&bytes[written - HEADER..]), HEADER),
        };
        self.out.push_back(Outgoing {
            header,
            payload,
            written,
        });
        Ok(())
    }

    /// Whether frames wait to be written.
    pub(super) fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// Writes what it can without blocking; whether anything was written.
    pub(super) fn flush(&mut self) -> io::Result<bool> {
        let mut progressed = false;
        while let Some(front) = self.out.front_mut() {
            let before = front.written;
            front.written = write_frame(&self.stream, &front.header, &front.payload, before)?;
            progressed |= front.written > before;
            if front.written < HEADER + front.payload.len() {
                break;
            }
            self.out.pop_front();
        }
        Ok(progressed)
    }

    /// Reads what it can without blocking, handing each whole frame to `deliver`; whether
    /// anything was read. A frame longer than `max_payload` is an error (a confused or
    /// hostile peer cannot make this rank allocate at will). Payloads are read into buffers
    /// from `fresh`, except the one `target` waits for: it is read straight into the
    /// target's memory and delivered without a buffer (`None`).
    pub(super) fn read(
        &mut self,
        max_payload: usize,
        fresh: &mut dyn FnMut() -> Vec<u8>,
        mut target: Option<&mut Target<'_>>,
        mut deliver: impl FnMut(Head, Option<Vec<u8>>),
    ) -> io::Result<bool> {
        let mut progressed = false;
        loop {
            // A complete payload (an empty one at once) goes out before the next read.
            let complete = match &self.reading {
                Reading::Header { .. } => false,
                Reading::Payload { bytes, want, .. } => bytes.len() == *want,
                Reading::Direct { head, have } => *have as u64 == head.len,
            };
            if complete {
                let next = Reading::Header {
                    bytes: [0; HEADER],
                    have: 0,
                };
                match std::mem::replace(&mut self.reading, next) {
                    Reading::Payload { head, bytes, .. } => deliver(head, Some(bytes)),
                    Reading::Direct { head, .. } => {
                        // The target is filled: nothing more may land in it.
                        target = None;
                        deliver(head, None);
                    }
                    Reading::Header { .. } => {}
                }
            }
            let result = match &mut self.reading {
                Reading::Header { bytes, have } => self.stream.read(&mut bytes[*have..]),
                Reading::Payload { bytes, want, .. } => read_into(&self.stream, bytes, *want),
                Reading::Direct { have, .. } => match target.as_deref_mut() {
                    Some(target) => (&self.stream).read(&mut target.buf[*have..]),
                    // Only the receiver whose memory it is may go on with a frame that
                    // lands in place (it holds the mesh until the frame is whole).
                    None => return Ok(progressed),
                },
            };
            let n = match result {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection",
                    ))
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(progressed),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            progressed = true;
            match &mut self.reading {
                Reading::Header { bytes, have } => {
                    *have += n;
                    if *have < HEADER {
                        continue;
                    }
                    let head = Head::decode(bytes);
                    let len = usize::try_from(head.len)
                        .ok()
                        .filter(|&len| len <= max_payload)
                        .ok_or_else(|| {
                            io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!("a frame of {} bytes (at most {max_payload})", head.len),
                            )
                        })?;
                    let lands = target
                        .as_ref()
                        .is_some_and(|t| t.head == head && t.buf.len() == len);
                    self.reading = match lands {
                        true => Reading::Direct { head, have: 0 },
                        false => Reading::Payload {
                            head,
                            bytes: fresh(),
                            want: len,
                        },
                    };
                }
                // `read_into` grew the payload.
                Reading::Payload { .. } => {}
                Reading::Direct { have, .. } => *have += n,
            }
        }
    }

    /// Whether a frame is half read into a receiver's memory.
    pub(super) fn landing(&self) -> bool {
        matches!(self.reading, Reading::Direct { .. })
    }
}

/// Writes a frame's bytes from `written` on (header, then payload) until they are all
/// written or the socket would block; how many are written now.
fn write_frame(
    stream: &TcpStream,
    header: &[u8; HEADER],
    payload: &[u8],
    mut written: usize,
) -> io::Result<usize> {
    let mut stream = stream;
    while written < HEADER + payload.len() {
        let (head_part, body_part) = match written.checked_sub(HEADER) {
            None => (&header[written..], payload),
            Some(at) => (&[][..], &payload[at..]),
        };
        match stream.write_vectored(&[IoSlice::new(head_part), IoSlice::new(body_part)]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}

/// Reads from `stream` into the rest of `bytes`, up to `want` bytes in all, without zeroing
/// the room first (fresh zeroed buffers cost a `memset` of every payload); how many came.
fn read_into(stream: &TcpStream, bytes: &mut Vec<u8>, want: usize) -> io::Result<usize> {
    let room = want.saturating_sub(bytes.len());
    bytes.reserve_exact(room);
    let spare = &mut bytes.spare_capacity_mut()[..room];
    let (filled, _) = rustix::io::read(stream, spare).map_err(io::Error::from)?;
    let n = filled.len();
    // SAFETY: `read` initialised the `n` bytes after the vector's length (within its
    // capacity: `room` was reserved).
    unsafe { bytes.set_len(bytes.len() + n) };
    Ok(n)
}
