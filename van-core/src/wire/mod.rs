//! The wire format: one frame per [`Message`].
//!
//! A frame is a fixed little-endian header, the encoded [`Meta`](crate::Meta), a table of
//! segment lengths, then the segments. Every part starts on an 8-byte boundary *relative to
//! the start of the frame*, and every frame's length is a multiple of 8, so a receiver that
//! reads frames back to back into an 8-aligned buffer can view any segment as `&[f32]` or
//! `&[u64]` without copying.
//!
//! # Frame layout (version 2)
//!
//! | offset | size | field | rule |
//! | --- | --- | --- | --- |
//! | 0 | 4 | magic | `b"VANS"` ([`MAGIC`]) |
//! | 4 | 2 | version, u16 LE | [`VERSION`]; any other value is rejected naming both |
//! | 6 | 2 | flags, u16 LE | must be 0 (reserved) |
//! | 8 | 8 | `frame_len`, u64 LE | total bytes including this header; multiple of 8; ≤ [`Limits::max_frame`] |
//! | 16 | 4 | `meta_len`, u32 LE | bytes of encoded meta; ≤ [`Limits::max_meta`] |
//! | 20 | 4 | `segment_count`, u32 LE | ≤ [`Limits::max_segments`] |
//! | 24 | 8 | reserved | must be 0 |
//! | 32 | `meta_len` | meta | see below, then zero padding to a multiple of 8 |
//! | `T` = 32 + pad8(`meta_len`) | 8 × `segment_count` | segment lengths, u64 LE each | |
//! | `T` + 8 × `segment_count` | … | segments | each followed by zero padding to a multiple of 8 |
//!
//! `frame_len` must equal `T + 8 × segment_count + Σ pad8(len_i)` exactly.
//!
//! # Meta layout
//!
//! All integers little-endian; strings are a length prefix then UTF-8 bytes; an absent node
//! id is `i32::MAX` (ps-lite's `Meta::kEmpty`).
//!
//! | size | field |
//! | --- | --- |
//! | 4 | head, i32 |
//! | 4 | app_id, i32 |
//! | 4 | customer_id, i32 |
//! | 4 | request_id, i32 |
//! | 4 | sender, i32 (`i32::MAX` = none) |
//! | 4 | recipient, i32 (`i32::MAX` = none) |
//! | 1 | flags: bit 0 request, 1 push, 2 pull, 3 simple_app, 4 control present, 5 seq present; others must be 0 |
//! | 4 | priority, i32 |
//! | 8 | key, u64 |
//! | 8 | addr, u64 |
//! | 8 | val_len, u64 |
//! | 4 | option, i32 |
//! | if seq: 8 + 8 | seq: the resend sequence number, u64, then the recipient's incarnation it was meant for, u64 (0: any) |
//! | 4 + n | body: u32 length, bytes |
//! | 4 + n | data types: u32 count, one u8 code each ([`DataType`](crate::DataType) order) |
//! | if control: 1 | command code, u8 |
//! | if control: 4 | barrier group, i32 |
//! | if control: 8 | msg_sig, u64 |
//! | if control: 4 + … | nodes: u32 count, then each node |
//!
//! A node is: role u8 (0 scheduler, 1 server, 2 worker), id i32 (`i32::MAX` = none), host
//! (u16 length + UTF-8), port u16, host identity (u16 length + UTF-8), is_recovery u8 (0/1),
//! incarnation u64, TensorFlow task (job: u16 length + UTF-8, empty = none; index u32), then
//! u16 endpoint count and per endpoint a van kind u8 (0 in-process, 1 tcp, 2 uring,
//! 3 rdma, 4 ipc) and an address (u16 length + UTF-8). The meta must be consumed exactly.
//! Padding bytes are written as zeros and ignored when decoding.
//!
//! # Guarantees
//!
//! Decoding never panics, never reads past the frame, and allocates nothing in proportion
//! to a length field that has not been checked against the bytes present and the
//! [`Limits`]. Encoding copies no payload byte: [`encode_into`] appends the segments'
//! [`Bytes`] handles, ready for vectored I/O.

mod meta;

use bytes::{BufMut, Bytes, BytesMut};

use crate::Message;
pub use meta::{decode_meta, encode_meta};

/// The four bytes every frame starts with.
pub const MAGIC: [u8; 4] = *b"VANS";
/// The frame format version this build speaks.
pub const VERSION: u16 = 2;
/// Length of the fixed frame header.
pub const HEADER_LEN: usize = 32;
/// Segments, the meta and whole frames are aligned to this many bytes.
pub const ALIGN: usize = 8;

/// Default largest frame a node accepts (1 GiB).
pub const DEFAULT_MAX_FRAME: u64 = 1 << 30;
/// Default largest number of data segments in one message.
pub const DEFAULT_MAX_SEGMENTS: u32 = 1024;
/// Default largest encoded meta (4 MiB: a node table of tens of thousands of nodes).
pub const DEFAULT_MAX_META: u32 = 4 << 20;

/// Zero bytes used as padding; padding never needs an allocation.
static PADDING: [u8; ALIGN] = [0; ALIGN];

/// Size limits checked before any allocation, on encode and on decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest frame in bytes, header included.
    pub max_frame: u64,
    /// Largest number of data segments.
    pub max_segments: u32,
    /// Largest encoded meta in bytes.
    pub max_meta: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_frame: DEFAULT_MAX_FRAME,
            max_segments: DEFAULT_MAX_SEGMENTS,
            max_meta: DEFAULT_MAX_META,
        }
    }
}

/// Every way a frame can be wrong. Each names what was found and what was allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The first four bytes are not [`MAGIC`]: the peer does not speak vans (or the stream
    /// lost sync).
    #[error("bad magic {found:02x?}, expected {MAGIC:02x?} (the peer does not speak the vans wire format)")]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
    },
    /// The frame is of a version this build does not speak.
    #[error("unsupported wire version {found}; this build speaks version {supported}")]
    UnsupportedVersion {
        /// The version in the frame.
        found: u16,
        /// The version this build speaks.
        supported: u16,
    },
    /// Reserved flag bits or reserved header bytes are set.
    #[error("reserved header bits set (flags {flags:#06x}, reserved {reserved:#018x}); the peer speaks a newer or corrupt format")]
    ReservedBitsSet {
        /// The flags field.
        flags: u16,
        /// The reserved word.
        reserved: u64,
    },
    /// The frame is larger than [`Limits::max_frame`].
    #[error("frame of {len} bytes exceeds the limit of {max} bytes (VANS_MAX_FRAME_BYTES)")]
    FrameTooLarge {
        /// Declared or computed frame length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The meta is larger than [`Limits::max_meta`].
    #[error("meta of {len} bytes exceeds the limit of {max} bytes (VANS_MAX_META_BYTES)")]
    MetaTooLarge {
        /// Declared or encoded meta length.
        len: u64,
        /// The limit.
        max: u32,
    },
    /// More segments than [`Limits::max_segments`].
    #[error("{count} data segments exceed the limit of {max} (VANS_MAX_SEGMENTS)")]
    TooManySegments {
        /// Declared or actual segment count.
        count: u64,
        /// The limit.
        max: u32,
    },
    /// The declared frame length does not match its parts.
    #[error("frame length {declared} does not match its parts ({computed} bytes)")]
    LengthMismatch {
        /// `frame_len` from the header.
        declared: u64,
        /// What the meta length, table and segments add up to (saturating).
        computed: u64,
    },
    /// Fewer bytes than the frame needs.
    #[error("truncated frame: {needed} bytes needed, {available} present")]
    Truncated {
        /// Bytes the frame declares.
        needed: u64,
        /// Bytes present.
        available: u64,
    },
    /// The meta ended in the middle of a field.
    #[error("meta truncated while reading {field}")]
    MetaTruncated {
        /// The field being read.
        field: &'static str,
    },
    /// The meta has bytes left over after its last field.
    #[error("meta has {extra} trailing bytes")]
    MetaTrailingBytes {
        /// How many.
        extra: usize,
    },
    /// An enum code that no variant has.
    #[error("unknown {what} code {code}")]
    UnknownCode {
        /// Which enum (`role`, `command`, `data type`, `van kind`, `meta flags`).
        what: &'static str,
        /// The code found.
        code: u8,
    },
    /// A string field is not UTF-8.
    #[error("{field} is not valid UTF-8")]
    InvalidUtf8 {
        /// The field.
        field: &'static str,
    },
    /// A message field cannot be represented on the wire (encoding only).
    #[error("cannot encode {field}: {reason}")]
    Unencodable {
        /// The field.
        field: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// A decoded field holds a value no encoder writes.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// Why.
        reason: &'static str,
    },
}

/// The parsed fixed header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Total frame length in bytes, header included.
    pub frame_len: u64,
    /// Encoded meta length.
    pub meta_len: u32,
    /// Number of data segments.
    pub segment_count: u32,
}

/// Rounds up to a multiple of [`ALIGN`]; `None` on overflow.
fn pad8(len: u64) -> Option<u64> {
    len.checked_add(ALIGN as u64 - 1)
        .map(|l| l & !(ALIGN as u64 - 1))
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Checks the first bytes of a frame, however few have arrived: they must begin the magic.
/// Stream vans call this on a partial header, so a peer that sends a few bytes of garbage is
/// refused at once instead of holding the connection until a whole header has arrived.
pub fn check_start(bytes: &[u8]) -> Result<(), WireError> {
    let n = bytes.len().min(MAGIC.len());
    if bytes[..n] == MAGIC[..n] {
        return Ok(());
    }
    let mut found = [0u8; 4];
    found[..n].copy_from_slice(&bytes[..n]);
    Err(WireError::BadMagic { found })
}

impl FrameHeader {
    /// Parses and validates the header at the start of `bytes` against `limits`.
    ///
    /// Stream vans call this as soon as [`HEADER_LEN`] bytes have arrived, to learn how long
    /// the frame is before reading (or allocating for) the rest.
    pub fn parse(bytes: &[u8], limits: &Limits) -> Result<FrameHeader, WireError> {
        if bytes.len() < HEADER_LEN {
            return Err(WireError::Truncated {
                needed: HEADER_LEN as u64,
                available: bytes.len() as u64,
            });
        }
        let found = [bytes[0], bytes[1], bytes[2], bytes[3]];
        if found != MAGIC {
            return Err(WireError::BadMagic { found });
        }
        let version = le_u16(bytes, 4);
        if version != VERSION {
            return Err(WireError::UnsupportedVersion {
                found: version,
                supported: VERSION,
            });
        }
        let flags = le_u16(bytes, 6);
        let reserved = le_u64(bytes, 24);
        if flags != 0 || reserved != 0 {
            return Err(WireError::ReservedBitsSet { flags, reserved });
        }
        let header = FrameHeader {
            frame_len: le_u64(bytes, 8),
            meta_len: le_u32(bytes, 16),
            segment_count: le_u32(bytes, 20),
        };
        header.check(limits)?;
        Ok(header)
    }

    /// Checks the header's lengths against the limits and against each other.
    fn check(&self, limits: &Limits) -> Result<(), WireError> {
        if self.frame_len > limits.max_frame {
            return Err(WireError::FrameTooLarge {
                len: self.frame_len,
                max: limits.max_frame,
            });
        }
        if self.meta_len > limits.max_meta {
            return Err(WireError::MetaTooLarge {
                len: u64::from(self.meta_len),
                max: limits.max_meta,
            });
        }
        if self.segment_count > limits.max_segments {
            return Err(WireError::TooManySegments {
                count: u64::from(self.segment_count),
                max: limits.max_segments,
            });
        }
        // The fixed part alone (all segments empty) must fit, and the total must stay aligned.
        let fixed = self.segments_offset();
        if self.frame_len < fixed || self.frame_len % ALIGN as u64 != 0 {
            return Err(WireError::LengthMismatch {
                declared: self.frame_len,
                computed: fixed,
            });
        }
        Ok(())
    }

    /// Offset of the segment-length table.
    fn table_offset(&self) -> u64 {
        // meta_len ≤ u32::MAX, so this cannot overflow a u64.
        HEADER_LEN as u64 + u64::from(self.meta_len).div_ceil(8) * 8
    }

    /// Offset of the first segment.
    fn segments_offset(&self) -> u64 {
        self.table_offset() + 8 * u64::from(self.segment_count)
    }
}

/// Encodes `msg` as one frame, appending its parts to `parts` for vectored I/O.
///
/// The header, meta and segment table are written into `arena` (which keeps its spare
/// capacity for the next frame, so a batch of small messages shares one allocation); the
/// segments themselves are appended as the same [`Bytes`] handles the message holds, so no
/// payload byte is copied. Returns the frame length.
///
/// On error nothing is appended to `parts`.
pub fn encode_into(
    msg: &Message,
    limits: &Limits,
    arena: &mut BytesMut,
    parts: &mut impl Extend<Bytes>,
) -> Result<u64, WireError> {
    let count = msg.data.len();
    if count as u64 > u64::from(limits.max_segments) {
        return Err(WireError::TooManySegments {
            count: count as u64,
            max: limits.max_segments,
        });
    }
    let mut segments_len: u64 = 0;
    for seg in &msg.data {
        segments_len = pad8(seg.len() as u64)
            .and_then(|l| segments_len.checked_add(l))
            .unwrap_or(u64::MAX);
    }

    arena.clear();
    arena.reserve(HEADER_LEN + 256 + 8 * count);
    arena.put_bytes(0, HEADER_LEN);
    encode_meta(&msg.meta, arena)?;
    let meta_len = arena.len() - HEADER_LEN;
    if meta_len as u64 > u64::from(limits.max_meta) {
        return Err(WireError::MetaTooLarge {
            len: meta_len as u64,
            max: limits.max_meta,
        });
    }
    let pad = arena.len().next_multiple_of(ALIGN) - arena.len();
    arena.put_bytes(0, pad);
    for seg in &msg.data {
        arena.put_u64_le(seg.len() as u64);
    }
    let frame_len = (arena.len() as u64).saturating_add(segments_len);
    if frame_len > limits.max_frame {
        return Err(WireError::FrameTooLarge {
            len: frame_len,
            max: limits.max_frame,
        });
    }
    arena[0..4].copy_from_slice(&MAGIC);
    arena[4..6].copy_from_slice(&VERSION.to_le_bytes());
    arena[8..16].copy_from_slice(&frame_len.to_le_bytes());
    arena[16..20].copy_from_slice(&(meta_len as u32).to_le_bytes());
    arena[20..24].copy_from_slice(&(count as u32).to_le_bytes());

    let header = arena.split().freeze();
    let segments = msg.data.iter().flat_map(|seg| {
        let pad = seg.len().next_multiple_of(ALIGN) - seg.len();
        [
            (!seg.is_empty()).then(|| seg.clone()),
            (pad > 0).then(|| Bytes::from_static(&PADDING[..pad])),
        ]
    });
    parts.extend(std::iter::once(header).chain(segments.flatten()));
    Ok(frame_len)
}

/// An encoded frame: its header and segments (with their padding), ready for vectored
/// I/O. Up to five parts (a header and two or three segments) are stored inline, so encoding
/// a small message allocates nothing.
pub type Frame = smallvec::SmallVec<[Bytes; 5]>;

thread_local! {
    /// Where [`encode`] writes frame headers: each is split off a shared chunk, so a small
    /// message costs no allocation of its own (a chunk is freed with its last frame).
    static ARENA: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::new());
}
/// Size of an encoding chunk.
const ARENA_CHUNK: usize = 64 * 1024;
/// Below this much room, a fresh chunk is taken.
const ARENA_REFILL: usize = 4 * 1024;

/// Encodes `msg` into a fresh list of parts (see [`encode_into`]), its header taken from a
/// per-thread chunk shared with other frames.
pub fn encode(msg: &Message, limits: &Limits) -> Result<Frame, WireError> {
    let mut parts = Frame::new();
    ARENA.with(|arena| {
        let mut arena = arena.borrow_mut();
        if arena.capacity() < ARENA_REFILL {
            *arena = BytesMut::with_capacity(ARENA_CHUNK);
        }
        encode_into(msg, limits, &mut arena, &mut parts)
    })?;
    Ok(parts)
}

/// Encodes `msg` into one contiguous buffer (one copy of the payload).
///
/// For tests, fuzz corpora and transports that need a contiguous frame; socket vans should
/// use [`encode_into`] and vectored writes instead.
pub fn encode_to_vec(msg: &Message, limits: &Limits) -> Result<Vec<u8>, WireError> {
    let parts = encode(msg, limits)?;
    let mut out = Vec::with_capacity(parts.iter().map(Bytes::len).sum());
    for part in &parts {
        out.extend_from_slice(part);
    }
    Ok(out)
}

/// Decodes one whole frame. Segments and the meta body are zero-copy slices of `frame`.
///
/// `frame` must hold exactly one frame: fewer bytes is [`WireError::Truncated`], more is
/// [`WireError::LengthMismatch`].
pub fn decode(frame: Bytes, limits: &Limits) -> Result<Message, WireError> {
    let header = FrameHeader::parse(&frame, limits)?;
    let available = frame.len() as u64;
    if available < header.frame_len {
        return Err(WireError::Truncated {
            needed: header.frame_len,
            available,
        });
    }
    if available > header.frame_len {
        return Err(WireError::LengthMismatch {
            declared: header.frame_len,
            computed: available,
        });
    }
    // All offsets below are ≤ frame_len ≤ frame.len(), checked by `FrameHeader::check`.
    let meta_end = HEADER_LEN + header.meta_len as usize;
    let meta = decode_meta(frame.slice(HEADER_LEN..meta_end))?;

    let table = header.table_offset() as usize;
    let count = header.segment_count as usize;
    let mut offset = header.segments_offset();
    let mut data = crate::Parts::with_capacity(count);
    for i in 0..count {
        let len = le_u64(&frame, table + 8 * i);
        let end = offset
            .checked_add(len)
            .filter(|end| *end <= header.frame_len);
        let Some(end) = end else {
            return Err(WireError::LengthMismatch {
                declared: header.frame_len,
                computed: offset.saturating_add(len),
            });
        };
        data.push(frame.slice(offset as usize..end as usize));
        offset = pad8(end).unwrap_or(u64::MAX);
    }
    if offset != header.frame_len {
        return Err(WireError::LengthMismatch {
            declared: header.frame_len,
            computed: offset,
        });
    }
    Ok(Message { meta, data })
}
