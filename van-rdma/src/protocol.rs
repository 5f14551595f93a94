//! The bytes two RDMA vans exchange: the queue-pair attributes sent over the TCP side channel
//! at connection setup ([`QpAttributes`]), and the 16-byte header that starts every SEND
//! ([`Header`]). Pure code: decoding checks every length and range and never panics, so it is
//! tested (and could be fuzzed) without a device.
//!
//! # Side channel
//!
//! The dialer opens a TCP connection to the listener's RDMA endpoint (`host:port`) and writes
//! its [`QpAttributes`] ([`QpAttributes::LEN`] bytes) at once; the listener reads them before
//! it creates a queue pair of its own for the connection (so an idle or foreign connection
//! costs it no registered memory), then answers with its attributes. Both move their queue
//! pair to RTR and RTS with the other's, and then exchange one [`READY`] byte, so that neither
//! side sends before the other can receive. The TCP connection stays open for the life of the
//! queue pair: its end of file is how a side learns that its peer stopped or died (an RC
//! queue pair with no traffic notices nothing). An orderly stop writes [`BYE`] once every
//! message has been acknowledged.
//!
//! # Messages on the queue pair
//!
//! | what | verb | payload |
//! | --- | --- | --- |
//! | a frame of at most `slot_bytes - 16` bytes | SEND | [`Header`] `DATA`, the frame |
//! | credits only | SEND | [`Header`] `CREDIT` |
//! | "I have a frame of `len` bytes for you" | SEND | [`Header`] `START`, `id`, `len` |
//! | "write it here" | SEND | [`Header`] `REPLY`, `id`, `len`, address, rkey |
//! | the frame | RDMA WRITE_WITH_IMM into that address | immediate data = `id` |
//!
//! Every SEND consumes one of the receiver's posted receive buffers, and so does a
//! WRITE_WITH_IMM; each header carries the credits (buffers reposted) its sender returns.

/// First bytes of the attributes: a side channel that is not a vans RDMA van is refused.
pub const MAGIC: [u8; 8] = *b"VANSRDMA";
/// Version of this exchange and of the message headers.
pub const VERSION: u16 = 1;
/// The byte each side writes once its queue pair can receive.
pub const READY: u8 = 0x52;
/// The byte a stopping side writes once every message it sent has been acknowledged.
pub const BYE: u8 = 0x42;

/// Smallest and largest receive buffers a peer may announce.
pub const SLOT_BYTES: std::ops::RangeInclusive<u32> = 256..=(1 << 20);
/// Range of receive depths a peer may announce (credits travel as `u16`).
pub const RX_DEPTH: std::ops::RangeInclusive<u32> = 4..=32768;

/// What one side tells the other to connect its RC queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttributes {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number this side sends with (24 bits).
    pub psn: u32,
    /// Local identifier of the port (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Active MTU of the port, as the verbs enum (1: 256 … 5: 4096).
    pub mtu: u8,
    /// The GID the side sends from.
    pub gid: [u8; 16],
    /// Receive buffers posted (the other side's initial credits).
    pub rx_depth: u32,
    /// Bytes of each receive buffer.
    pub slot_bytes: u32,
}

/// Why bytes from a peer are not valid attributes or a valid header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// Too few bytes.
    #[error("truncated: {needed} bytes needed, {available} available")]
    Truncated {
        /// Needed.
        needed: usize,
        /// Present.
        available: usize,
    },
    /// Not our magic: something other than a vans RDMA van answered.
    #[error("not a vans RDMA peer (bad magic)")]
    BadMagic,
    /// Another version of this protocol.
    #[error("RDMA protocol version {found} is not supported (this build speaks {supported})")]
    Version {
        /// The peer's.
        found: u16,
        /// Ours.
        supported: u16,
    },
    /// A field out of its range.
    #[error("invalid {field}: {value}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
}

fn take<const N: usize>(bytes: &[u8], at: usize) -> Result<[u8; N], ProtocolError> {
    bytes
        .get(at..at + N)
        .and_then(|s| s.try_into().ok())
        .ok_or(ProtocolError::Truncated {
            needed: at + N,
            available: bytes.len(),
        })
}

impl QpAttributes {
    /// Encoded length.
    pub const LEN: usize = 48;

    /// The bytes to send.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[0..8].copy_from_slice(&MAGIC);
        out[8..10].copy_from_slice(&VERSION.to_le_bytes());
        out[10..12].copy_from_slice(&self.lid.to_le_bytes());
        out[12..16].copy_from_slice(&self.qpn.to_le_bytes());
        out[16..20].copy_from_slice(&self.psn.to_le_bytes());
        out[20..36].copy_from_slice(&self.gid);
        out[36..40].copy_from_slice(&self.rx_depth.to_le_bytes());
        out[40..44].copy_from_slice(&self.slot_bytes.to_le_bytes());
        out[44] = self.mtu;
        out
    }

    /// Parses and checks a peer's attributes.
    pub fn decode(bytes: &[u8]) -> Result<QpAttributes, ProtocolError> {
        if bytes.len() < Self::LEN {
            return Err(ProtocolError::Truncated {
                needed: Self::LEN,
                available: bytes.len(),
            });
        }
        if take::<8>(bytes, 0)? != MAGIC {
            return Err(ProtocolError::BadMagic);
        }
        let version = u16::from_le_bytes(take(bytes, 8)?);
        if version != VERSION {
            return Err(ProtocolError::Version {
                found: version,
                supported: VERSION,
            });
        }
        let attrs = QpAttributes {
            lid: u16::from_le_bytes(take(bytes, 10)?),
            qpn: u32::from_le_bytes(take(bytes, 12)?),
            psn: u32::from_le_bytes(take(bytes, 16)?),
            gid: take(bytes, 20)?,
            rx_depth: u32::from_le_bytes(take(bytes, 36)?),
            slot_bytes: u32::from_le_bytes(take(bytes, 40)?),
            mtu: take::<1>(bytes, 44)?[0],
        };
        let invalid = |field, value: u64| Err(ProtocolError::Invalid { field, value });
        if attrs.qpn >= 1 << 24 {
            return invalid("queue pair number", attrs.qpn.into());
        }
        if attrs.psn >= 1 << 24 {
            return invalid("packet sequence number", attrs.psn.into());
        }
        if !(1..=5).contains(&attrs.mtu) {
            return invalid("MTU", attrs.mtu.into());
        }
        if !RX_DEPTH.contains(&attrs.rx_depth) {
            return invalid("receive depth", attrs.rx_depth.into());
        }
        if !SLOT_BYTES.contains(&attrs.slot_bytes) {
            return invalid("receive buffer size", attrs.slot_bytes.into());
        }
        Ok(attrs)
    }
}

/// What a SEND carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A whole frame follows the header.
    Data,
    /// Nothing but credits.
    Credit,
    /// A frame of `len` bytes waits for a buffer (id in the header).
    Start {
        /// Frame length.
        len: u64,
    },
    /// Write frame `id` at `addr` with `rkey` (`len` bytes reserved).
    Reply {
        /// Frame length.
        len: u64,
        /// Remote address to write at.
        addr: u64,
        /// Remote key of that memory.
        rkey: u32,
    },
}

/// The header at the start of every SEND.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What follows.
    pub kind: Kind,
    /// Receive buffers the sender reposted since its last header: credits for the reader.
    pub credits: u16,
    /// Large-message id (`Start`, `Reply`); 0 otherwise.
    pub id: u32,
}

const DATA: u8 = 1;
const CREDIT: u8 = 2;
const START: u8 = 3;
const REPLY: u8 = 4;

impl Header {
    /// Bytes of a header before any payload (`Data`, `Credit`).
    pub const LEN: usize = 16;
    /// Bytes of a `Start` or `Reply` SEND.
    pub const CONTROL_LEN: usize = 40;

    /// Writes the header (and the `Start`/`Reply` fields) at the start of `out`; returns the
    /// bytes written. `out` must hold [`Header::CONTROL_LEN`] bytes.
    pub fn encode(&self, out: &mut [u8]) -> usize {
        let (kind, len, addr, rkey) = match self.kind {
            Kind::Data => (DATA, 0, 0, 0),
            Kind::Credit => (CREDIT, 0, 0, 0),
            Kind::Start { len } => (START, len, 0, 0),
            Kind::Reply { len, addr, rkey } => (REPLY, len, addr, rkey),
        };
        let mut header = [0u8; Self::CONTROL_LEN];
        header[0] = kind;
        header[1] = VERSION as u8;
        header[2..4].copy_from_slice(&self.credits.to_le_bytes());
        header[4..8].copy_from_slice(&self.id.to_le_bytes());
        header[16..24].copy_from_slice(&len.to_le_bytes());
        header[24..32].copy_from_slice(&addr.to_le_bytes());
        header[32..36].copy_from_slice(&rkey.to_le_bytes());
        let n = match kind {
            START | REPLY => Self::CONTROL_LEN,
            _ => Self::LEN,
        };
        let n = n.min(out.len());
        out[..n].copy_from_slice(&header[..n]);
        n
    }

    /// Parses the header of a received SEND; returns it and where the payload starts.
    pub fn decode(bytes: &[u8]) -> Result<(Header, usize), ProtocolError> {
        let first: [u8; 8] = take(bytes, 0)?;
        if u16::from(first[1]) != VERSION {
            return Err(ProtocolError::Version {
                found: first[1].into(),
                supported: VERSION,
            });
        }
        let credits = u16::from_le_bytes([first[2], first[3]]);
        let id = u32::from_le_bytes([first[4], first[5], first[6], first[7]]);
        let control = |bytes: &[u8]| -> Result<(u64, u64, u32), ProtocolError> {
            Ok((
                u64::from_le_bytes(take(bytes, 16)?),
                u64::from_le_bytes(take(bytes, 24)?),
                u32::from_le_bytes(take(bytes, 32)?),
            ))
        };
        let (kind, start) = match first[0] {
            DATA => (Kind::Data, Self::LEN),
            CREDIT => (Kind::Credit, Self::LEN),
            START => {
                let (len, _, _) = control(bytes)?;
                (Kind::Start { len }, Self::CONTROL_LEN)
            }
            REPLY => {
                let (len, addr, rkey) = control(bytes)?;
                (Kind::Reply { len, addr, rkey }, Self::CONTROL_LEN)
            }
            other => {
                return Err(ProtocolError::Invalid {
                    field: "message kind",
                    value: other.into(),
                })
            }
        };
        if bytes.len() < start {
            return Err(ProtocolError::Truncated {
                needed: start,
                available: bytes.len(),
            });
        }
        Ok((Header { kind, credits, id }, start))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs() -> QpAttributes {
        QpAttributes {
            qpn: 0x11,
            psn: 0xabcdef,
            lid: 7,
            mtu: 3,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1],
            rx_depth: 128,
            slot_bytes: 8192,
        }
    }

    #[test]
    fn attributes_round_trip_and_bad_ones_are_named() {
        let a = attrs();
        assert_eq!(QpAttributes::decode(&a.encode()), Ok(a));
        let mut bad = a;
        bad.psn = 1 << 24;
        assert!(matches!(
            QpAttributes::decode(&bad.encode()),
            Err(ProtocolError::Invalid {
                field: "packet sequence number",
                ..
            })
        ));
        bad = a;
        bad.mtu = 9;
        assert!(QpAttributes::decode(&bad.encode()).is_err());
        bad = a;
        bad.rx_depth = 1;
        assert!(QpAttributes::decode(&bad.encode()).is_err());
        let mut bytes = a.encode();
        bytes[8] = 2;
        let err = QpAttributes::decode(&bytes).unwrap_err().to_string();
        assert!(
            err.contains("version 2") && err.contains("speaks 1"),
            "{err}"
        );
        bytes = a.encode();
        bytes[0] = b'X';
        assert_eq!(QpAttributes::decode(&bytes), Err(ProtocolError::BadMagic));
    }

    #[test]
    fn headers_round_trip() {
        for kind in [
            Kind::Data,
            Kind::Credit,
            Kind::Start { len: 1 << 33 },
            Kind::Reply {
                len: 5,
                addr: 0x7f00_dead_b000,
                rkey: 0x1234,
            },
        ] {
            let header = Header {
                kind,
                credits: 513,
                id: 99,
            };
            let mut buf = [0u8; 64];
            let n = header.encode(&mut buf);
            assert_eq!(Header::decode(&buf[..n]), Ok((header, n)));
        }
    }

    #[test]
    fn decoding_garbage_never_panics() {
        // Every prefix of valid encodings, and pseudo-random bytes of every length.
        let mut buf = [0u8; 64];
        let n = Header {
            kind: Kind::Reply {
                len: 1,
                addr: 2,
                rkey: 3,
            },
            credits: 1,
            id: 1,
        }
        .encode(&mut buf);
        for len in 0..n {
            assert!(Header::decode(&buf[..len]).is_err());
        }
        let a = attrs().encode();
        for len in 0..a.len() {
            assert!(QpAttributes::decode(&a[..len]).is_err());
        }
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for len in 0..200 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            let _ = Header::decode(&bytes);
            let _ = QpAttributes::decode(&bytes);
        }
    }
}
