//! Checkpoints of a server's values: a [`Snapshot`] is each shard's state as its handler
//! gave it ([`RequestHandler::snapshot`](super::RequestHandler::snapshot)), with the server's
//! key range, as bytes an application can write anywhere and read back
//! ([`KvServer::snapshot`](super::KvServer::snapshot), [`KvServer::restore`](super::KvServer::restore)).
//!
//! # Layout (version 1, little-endian)
//!
//! | size | field |
//! | --- | --- |
//! | 4 | magic `b"VSNP"` |
//! | 2 | version, 1 |
//! | 2 | reserved, 0 |
//! | 8 + 8 | the server's key range: first, last |
//! | 4 | shard count |
//! | per shard: 8 + n | state length, then the state |
//!
//! The sum handler's state is a key count (u64), then per key: the key (u64), the value
//! count (u64) and the values. Decoding checks every length against the bytes present and
//! never panics.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::range::KeyRange;
use crate::values::Value;
use node::error::{NodeError, Result};
use node::hash::IntMap;

const MAGIC: &[u8; 4] = b"VSNP";
const VERSION: u16 = 1;

/// A server's values at one moment, shard by shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub(crate) range: KeyRange,
    pub(crate) shards: Vec<Bytes>,
}

impl Snapshot {
    /// The key range of the server it was taken from.
    pub fn range(&self) -> KeyRange {
        self.range
    }

    /// The number of shards it holds.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Fails unless the snapshot fits a server holding `range` in `shards` shards.
    pub(crate) fn check_shape(&self, range: KeyRange, shards: usize) -> Result<()> {
        if self.range == range && self.shards.len() == shards {
            return Ok(());
        }
        Err(NodeError::InvalidArgument(format!(
            "the snapshot holds keys {}..={} in {} shards; this server holds {}..={} in {}",
            self.range.first,
            self.range.last,
            self.shards.len(),
            range.first,
            range.last,
            shards
        )))
    }

    /// Its bytes, to store.
    pub fn to_bytes(&self) -> Vec<u8> {
        let len: usize = self.shards.iter().map(|s| 8 + s.len()).sum();
        let mut out = BytesMut::with_capacity(32 + len);
        out.put_slice(MAGIC);
        out.put_u16_le(VERSION);
        out.put_u16_le(0);
        out.put_u64_le(self.range.first);
        out.put_u64_le(self.range.last);
        out.put_u32_le(u32::try_from(self.shards.len()).unwrap_or(u32::MAX));
        for shard in &self.shards {
            out.put_u64_le(shard.len() as u64);
            out.put_slice(shard);
        }
        out.to_vec()
    }

    /// Reads bytes [`to_bytes`](Self::to_bytes) wrote; anything else is
    /// [`NodeError::InvalidArgument`] saying what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Result<Snapshot> {
        let bad = |what: &str| NodeError::InvalidArgument(format!("not a vans snapshot: {what}"));
        let mut r = bytes;
        if r.remaining() < 28 || &r[..4] != MAGIC {
            return Err(bad("no VSNP header"));
        }
        r.advance(4);
        let version = r.get_u16_le();
        if version != VERSION {
            return Err(bad(&format!(
                "version {version}, this build reads {VERSION}"
            )));
        }
        r.advance(2);
        let range = KeyRange {
            first: r.get_u64_le(),
            last: r.get_u64_le(),
        };
        let count = r.get_u32_le() as usize;
        let mut shards = Vec::with_capacity(count.min(r.remaining() / 8));
        for shard in 0..count {
            if r.remaining() < 8 {
                return Err(bad(&format!("shard {shard} of {count} is missing")));
            }
            let len = r.get_u64_le();
            let len = usize::try_from(len)
                .ok()
                .filter(|&len| len <= r.remaining())
                .ok_or_else(|| bad(&format!("shard {shard} claims {len} bytes")))?;
            shards.push(Bytes::copy_from_slice(&r[..len]));
            r.advance(len);
        }
        if r.has_remaining() {
            return Err(bad(&format!(
                "{} bytes after the last shard",
                r.remaining()
            )));
        }
        Ok(Snapshot { range, shards })
    }
}

/// The sum handler's store as bytes.
pub(crate) fn encode_store<T: Value>(store: &IntMap<u64, std::sync::Arc<Vec<T>>>) -> Vec<u8> {
    let mut keys: Vec<&u64> = store.keys().collect();
    keys.sort_unstable();
    let mut out = BytesMut::new();
    out.put_u64_le(keys.len() as u64);
    for key in keys {
        let values = store.get(key).map_or(&[][..], |v| v.as_slice());
        out.put_u64_le(*key);
        out.put_u64_le(values.len() as u64);
        out.put_slice(bytemuck::cast_slice(values));
    }
    out.to_vec()
}

/// The sum handler's store from [`encode_store`]'s bytes.
pub(crate) fn decode_store<T: Value>(
    bytes: &[u8],
) -> std::result::Result<IntMap<u64, std::sync::Arc<Vec<T>>>, String> {
    let elem = std::mem::size_of::<T>();
    let mut r = bytes;
    if r.remaining() < 8 {
        return Err("sum state: no key count".into());
    }
    let count = r.get_u64_le();
    let mut store = IntMap::default();
    for i in 0..count {
        if r.remaining() < 16 {
            return Err(format!("sum state: key {i} of {count} is missing"));
        }
        let key = r.get_u64_le();
        let n = r.get_u64_le();
        let len = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(elem))
            .filter(|&len| len <= r.remaining())
            .ok_or_else(|| format!("sum state: key {key} claims {n} values"))?;
        let mut values = vec![T::zeroed(); len / elem.max(1)];
        bytemuck::cast_slice_mut::<T, u8>(&mut values).copy_from_slice(&r[..len]);
        r.advance(len);
        store.insert(key, std::sync::Arc::new(values));
    }
    if r.has_remaining() {
        return Err(format!(
            "sum state: {} bytes after the last key",
            r.remaining()
        ));
    }
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn snapshots_round_trip_and_bad_bytes_are_errors_not_panics() {
        let mut store: IntMap<u64, Arc<Vec<f32>>> = IntMap::default();
        store.insert(7, Arc::new(vec![1.5, -2.0]));
        store.insert(u64::MAX, Arc::new(vec![]));
        let state = encode_store(&store);
        let back = decode_store::<f32>(&state).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[&7].as_slice(), &[1.5, -2.0]);
        let snapshot = Snapshot {
            range: KeyRange { first: 0, last: 99 },
            shards: vec![Bytes::from(state.clone()), Bytes::new()],
        };
        let bytes = snapshot.to_bytes();
        assert_eq!(Snapshot::from_bytes(&bytes).unwrap(), snapshot);
        // Every truncation and a trailing byte are refused with a reason.
        for cut in 0..bytes.len() {
            assert!(Snapshot::from_bytes(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(Snapshot::from_bytes(&long).is_err());
        for cut in 0..state.len() {
            assert!(decode_store::<f32>(&state[..cut]).is_err(), "cut at {cut}");
        }
        // A huge claimed length is refused before any allocation.
        let mut lying = state;
        lying[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_store::<f32>(&lying).is_err());
    }
}
