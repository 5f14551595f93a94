//! Key-value applications: [`KvWorker`] pushes and pulls, [`KvServer`] answers.
//!
//! A KV message is ps-lite's: the meta carries `head` (the caller's `cmd`), `push`/`pull`,
//! `request`, the request id, and the data segments are keys (`u64`), values (any
//! [`crate::values::Value`] type) and optionally per-key lengths (`i32`, in values).
//! A response with a non-empty `meta.body` is an error reported by the server's handler.

// How a handler holds a request and answers it later: `Handled`, `HeldRequest`, `Released`.
mod hold;
// Synchronous rounds (`ROUND_CMD`): every worker gets the sum of a round's pushes.
mod round;
mod server;
mod snapshot;
mod sum;
mod worker;

use std::borrow::Cow;

use bytes::Bytes;
use van_core::{DataType, Message, Meta, NodeId};

use crate::values::{self, Value};
use node::error::NodeError;

pub use hold::{Handled, HeldRequest, Released, ShardContext, MAX_HELD_REQUESTS};
pub use round::ROUND_CMD;
pub use server::{KvServer, RequestHandler};
pub use snapshot::Snapshot;
pub use sum::SumHandler;
pub use van_core::config::UnpushedKeys;
pub use worker::{KvWorker, PullBuffer, RequestId};

/// Which kind of key-value request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Values to add (or whatever the server's handler does with a push).
    Push,
    /// The keys' values, answered.
    Pull,
    /// A push, then the updated values, in one request per server.
    PushPull,
}

impl Op {
    /// Every kind, as [`name`](Self::name) spells them.
    pub const ALL: [Op; 3] = [Op::Push, Op::Pull, Op::PushPull];

    /// `push`, `pull` or `pushpull`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Push => "push",
            Op::Pull => "pull",
            Op::PushPull => "pushpull",
        }
    }
}

impl std::str::FromStr for Op {
    type Err = NodeError;

    fn from_str(name: &str) -> Result<Op, NodeError> {
        Op::ALL
            .into_iter()
            .find(|op| op.name() == name)
            .ok_or_else(|| {
                NodeError::InvalidArgument(format!(
                    "unknown request kind {name:?}: push, pull or pushpull"
                ))
            })
    }
}

/// Keys, values and optional per-key lengths, as bytes that travel without copies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvPairs {
    /// Keys, little-endian `u64`, sorted ascending.
    pub keys: Bytes,
    /// Values, all keys' values back to back.
    pub vals: Bytes,
    /// Per-key value counts (`i32`), or `None` when every key has the same number of values.
    pub lens: Option<Bytes>,
}

/// Byte offsets of each key's values (inline for up to four keys: no allocation for the
/// common one-key request).
pub(crate) type Offsets = van_core::smallvec::SmallVec<[usize; 5]>;

impl KvPairs {
    /// Pairs from typed slices (one copy each).
    pub fn from_slices<T: Value>(keys: &[u64], vals: &[T], lens: Option<&[i32]>) -> KvPairs {
        KvPairs {
            keys: values::to_bytes(keys),
            vals: values::to_bytes(vals),
            lens: lens.map(values::to_bytes),
        }
    }

    /// The keys, borrowed when aligned.
    pub fn keys(&self) -> Result<Cow<'_, [u64]>, NodeError> {
        values::view(&self.keys)
    }

    /// The values as `T`, borrowed when aligned.
    pub fn vals<T: Value>(&self) -> Result<Cow<'_, [T]>, NodeError> {
        values::view(&self.vals)
    }

    /// The per-key lengths, if any.
    pub fn lens(&self) -> Result<Option<Cow<'_, [i32]>>, NodeError> {
        self.lens.as_deref().map(values::view).transpose()
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len() / 8
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The pairs of the keys at indexes `keys`, without copying: `offsets` are the byte
    /// offsets of each key's values (`value_offsets`), or `None` to
    /// leave the values out (a pull). Lengths, when present, cover every key (as
    /// the decoding of a received message checks).
    pub fn slice(&self, keys: std::ops::Range<usize>, offsets: Option<&[usize]>) -> KvPairs {
        KvPairs {
            keys: self.keys.slice(keys.start * 8..keys.end * 8),
            vals: offsets.map_or_else(Bytes::new, |o| self.vals.slice(o[keys.start]..o[keys.end])),
            lens: self
                .lens
                .as_ref()
                .map(|l| l.slice(keys.start * 4..keys.end * 4)),
        }
    }

    /// `parts` joined in order (one copy of each): the inverse of [`slice`](Self::slice)
    /// over consecutive key ranges. Per-key lengths are kept when any part has them.
    pub fn concat<'a>(parts: impl IntoIterator<Item = &'a KvPairs>) -> KvPairs {
        let mut keys = bytes::BytesMut::new();
        let mut vals = bytes::BytesMut::new();
        let mut lens = bytes::BytesMut::new();
        let mut with_lens = false;
        for part in parts {
            keys.extend_from_slice(&part.keys);
            vals.extend_from_slice(&part.vals);
            if let Some(l) = &part.lens {
                with_lens = true;
                lens.extend_from_slice(l);
            }
        }
        KvPairs {
            keys: keys.freeze(),
            vals: vals.freeze(),
            lens: with_lens.then(|| lens.freeze()),
        }
    }

    /// Byte offset of each key's values in `vals` (`len() + 1` entries), checking that the
    /// lengths add up. `elem` is the size of one value in bytes.
    pub(crate) fn value_offsets(&self, elem: usize) -> Result<Offsets, NodeError> {
        let n = self.len();
        let mut offsets = Offsets::with_capacity(n + 1);
        offsets.push(0);
        match self.lens()? {
            Some(lens) => {
                if lens.len() != n {
                    return Err(NodeError::InvalidArgument(format!(
                        "{} lengths for {n} keys",
                        lens.len()
                    )));
                }
                let mut at = 0usize;
                for len in lens.iter() {
                    let len = usize::try_from(*len).map_err(|_| {
                        NodeError::InvalidArgument(format!("negative value length {len}"))
                    })?;
                    at = at.saturating_add(len.saturating_mul(elem));
                    offsets.push(at);
                }
            }
            None => {
                let per_key = self.vals.len().checked_div(n).unwrap_or(0);
                if n > 0 && (per_key * n != self.vals.len() || per_key % elem != 0) {
                    return Err(NodeError::InvalidArgument(format!(
                        "{} value bytes do not divide evenly among {n} keys of {elem}-byte values",
                        self.vals.len()
                    )));
                }
                offsets.extend((1..=n).map(|i| i * per_key));
            }
        }
        if offsets.last().copied().unwrap_or(0) != self.vals.len() {
            return Err(NodeError::InvalidArgument(format!(
                "the lengths cover {} value bytes but {} were given",
                offsets.last().copied().unwrap_or(0),
                self.vals.len()
            )));
        }
        Ok(offsets)
    }
}

/// What a KV request or response says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvMeta {
    /// The caller's command (`head`).
    pub cmd: i32,
    /// A push.
    pub push: bool,
    /// A pull.
    pub pull: bool,
    /// The requesting node.
    pub sender: NodeId,
    /// The request id, echoed in the response.
    pub request_id: i32,
    /// The application id.
    pub app_id: i32,
    /// The customer id.
    pub customer_id: i32,
    /// The value type the request declared.
    pub val_type: DataType,
}

/// Builds a KV message.
pub(crate) fn kv_message(meta: Meta, pairs: &KvPairs, val_type: DataType) -> Message {
    let mut meta = meta;
    let mut data = van_core::smallvec::smallvec![pairs.keys.clone(), pairs.vals.clone()];
    meta.data_types = van_core::smallvec::smallvec![DataType::U64, val_type];
    if let Some(lens) = &pairs.lens {
        data.push(lens.clone());
        meta.data_types.push(DataType::I32);
    }
    Message { meta, data }
}

/// Splits a received KV message into its pairs (no copy).
pub(crate) fn kv_pairs(msg: &Message) -> Result<KvPairs, NodeError> {
    let bad = |what: &str| NodeError::Protocol {
        from: msg.meta.sender,
        reason: format!("KV message {what}"),
    };
    match msg.data.len() {
        0 => Ok(KvPairs::default()),
        2 | 3 => {
            if msg.data[0].len() % 8 != 0 {
                return Err(bad("keys are not whole u64s"));
            }
            if let Some(lens) = msg.data.get(2) {
                if lens.len() != msg.data[0].len() / 2 {
                    return Err(bad("has lengths that do not match its keys one for one"));
                }
            }
            Ok(KvPairs {
                keys: msg.data[0].clone(),
                vals: msg.data[1].clone(),
                lens: msg.data.get(2).cloned(),
            })
        }
        n => Err(bad(&format!(
            "has {n} segments (expected keys, values[, lengths])"
        ))),
    }
}
