//! [`SumHandler`]: ps-lite's default request handler, the store a [`KvServer`](super::KvServer)
//! sums pushes into and answers pulls from, and BytePS's synchronous rounds beside it.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use van_core::config::UnpushedKeys;

use super::hold::{Handled, Released, ShardContext};
use super::round::{Rounds, ROUND_CMD};
use super::server::{KvServer, RequestHandler};
use super::snapshot::{decode_store, encode_store};
use super::{KvMeta, KvPairs};
use crate::values::{self, Value};
use node::error::Result;
use node::hash::IntMap;
use node::postoffice::Postoffice;

/// ps-lite's default handler: a push adds the values into the store (the first push of a key
/// sets it); a pull returns the stored values with per-key lengths; a push-pull does both.
///
/// A key no one has pushed is answered as [`UnpushedKeys`] says: zeros, as many as the pull
/// expects of it (a pull's per-key lengths, which a pull into a buffer sends), or an error
/// naming the key; never with fewer values than keys. A pull that expects another number of
/// values than a key holds fails naming the key.
///
/// A push-pull whose `cmd` is [`ROUND_CMD`] is a synchronous round instead (BytePS's
/// server): it is summed into the key's round accumulator, apart from the store, and
/// answered with the round's sum once every worker has pushed the key.
#[derive(Debug)]
pub struct SumHandler<T: Value> {
    /// Each key's sum. Shared with the responses of pulls still being sent (a single-key pull
    /// answers with the stored values themselves, no copy); a push then copies first.
    store: IntMap<u64, Arc<Vec<T>>>,
    /// The [`ROUND_CMD`] rounds in progress.
    rounds: Rounds<T>,
    /// How a pull of a key never pushed is answered.
    unpushed: UnpushedKeys,
}

impl<T: Value> KvServer<T> {
    /// A server running ps-lite's default sum aggregation ([`SumHandler`]).
    pub async fn with_sum(
        po: &Postoffice,
        app_id: i32,
        customer_id: i32,
        shards: usize,
    ) -> Result<KvServer<T>> {
        let unpushed = po.config().unpushed_keys;
        KvServer::new(po, app_id, customer_id, shards, move |_| {
            SumHandler::<T>::new(unpushed)
        })
        .await
    }
}

/// Stored values lent to a response as bytes.
struct Lent<T: Value>(Arc<Vec<T>>);

impl<T: Value> AsRef<[u8]> for Lent<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(self.0.as_slice())
    }
}

impl<T: Value> Default for SumHandler<T> {
    /// Answers keys never pushed with zeros ([`UnpushedKeys::Zeros`]).
    fn default() -> Self {
        SumHandler::new(UnpushedKeys::Zeros)
    }
}

impl<T: Value> SumHandler<T> {
    /// An empty store that answers pulls of keys never pushed as `unpushed` says.
    pub fn new(unpushed: UnpushedKeys) -> Self {
        SumHandler {
            store: IntMap::default(),
            rounds: Rounds::default(),
            unpushed,
        }
    }

    /// The values a pull gets for `key`, which expects `expected` values of it (`None`: the
    /// pull did not say).
    fn pulled(
        &self,
        key: u64,
        expected: Option<usize>,
    ) -> std::result::Result<Pulled<'_, T>, String> {
        match (self.store.get(&key), expected) {
            (Some(stored), Some(n)) if stored.len() != n => Err(format!(
                "key {key} holds {} values; the pull expects {n}",
                stored.len()
            )),
            (Some(stored), _) => Ok(Pulled::Stored(stored)),
            (None, Some(n)) if self.unpushed == UnpushedKeys::Zeros => Ok(Pulled::Zeros(n)),
            (None, None) if self.unpushed == UnpushedKeys::Zeros => Err(format!(
                "key {key} was never pushed, and the pull does not say how many values it \
                 expects of it (a pull into a buffer of as many values for each key gets \
                 zeros)"
            )),
            (None, _) => Err(format!(
                "key {key} was never pushed (VANS_UNPUSHED_KEYS=error)"
            )),
        }
    }
}

/// What a pull gets for one key.
enum Pulled<'a, T: Value> {
    /// The stored values.
    Stored(&'a Arc<Vec<T>>),
    /// This many zeros: a key never pushed.
    Zeros(usize),
}

impl<T: Value> RequestHandler for SumHandler<T> {
    /// The store only: rounds in progress are not part of a snapshot (take one between
    /// rounds, after a barrier of the workers).
    fn snapshot(&self) -> std::result::Result<Vec<u8>, String> {
        Ok(encode_store(&self.store))
    }

    /// Replaces the store only: rounds in progress go on, so the requests they hold are
    /// still answered.
    fn restore(&mut self, state: &[u8]) -> std::result::Result<(), String> {
        self.store = decode_store(state)?;
        Ok(())
    }

    fn handle_or_hold(
        &mut self,
        meta: &KvMeta,
        request: KvPairs,
        context: &ShardContext,
    ) -> Handled {
        if meta.cmd == ROUND_CMD {
            return self.rounds.push_pull(meta, &request, context);
        }
        Handled::Answer(self.handle(meta, request))
    }

    fn take_released(&mut self, released: &mut Vec<Released>) {
        self.rounds.take_released(released);
    }

    fn handle(&mut self, meta: &KvMeta, request: KvPairs) -> std::result::Result<KvPairs, String> {
        if meta.cmd == ROUND_CMD {
            return Err("a round (ROUND_CMD) waits for every worker, which only \
                        handle_or_hold can do; KvServer calls that"
                .to_owned());
        }
        // A pure pull carries no values, so its declared type does not matter.
        let carries_values = meta.push || !meta.pull;
        if carries_values && meta.val_type != T::DATA_TYPE {
            return Err(format!(
                "values of type {:?} sent to a server summing {:?}",
                meta.val_type,
                T::DATA_TYPE
            ));
        }
        let keys = request.keys().map_err(|e| e.to_string())?;
        if meta.push {
            let offsets = request
                .value_offsets(std::mem::size_of::<T>())
                .map_err(|e| e.to_string())?;
            let vals = request.vals::<T>().map_err(|e| e.to_string())?;
            let elem = std::mem::size_of::<T>();
            for (i, key) in keys.iter().enumerate() {
                let value = &vals[offsets[i] / elem..offsets[i + 1] / elem];
                match self.store.get_mut(key) {
                    Some(acc) if acc.len() == value.len() => {
                        T::add_assign(Arc::make_mut(acc).as_mut_slice(), value)
                    }
                    Some(acc) => {
                        return Err(format!(
                            "key {key}: pushed {} values onto {} stored",
                            value.len(),
                            acc.len()
                        ))
                    }
                    None => {
                        self.store.insert(*key, Arc::new(value.to_vec()));
                    }
                }
            }
        }
        if !meta.pull {
            return Ok(KvPairs::default());
        }
        let len_of = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        // What the pull expects of each key, when it says (a pull into a buffer does),
        // viewed in place.
        let expected = match request.lens().map_err(|e| e.to_string())? {
            Some(lens) if !meta.push => Some(lens),
            _ => None,
        };
        // The answer is built from what the pull declares: check it (no negative length).
        if let Some(n) = expected
            .as_ref()
            .and_then(|e| e.iter().copied().find(|n| *n < 0))
        {
            return Err(format!("negative length {n}"));
        }
        // Zeros for keys never pushed are allocated from what the pull declares alone:
        // bounded (stored keys answer what they hold, however large the frame limit).
        let mut zero_bytes = 0u64;
        let mut zeros = |n: usize| -> Result<usize, String> {
            let bytes = (n as u64).saturating_mul(size_of::<T>() as u64);
            zero_bytes = zero_bytes.saturating_add(bytes);
            let limit = van_core::wire::DEFAULT_MAX_FRAME;
            if zero_bytes > limit {
                return Err(format!(
                    "the pull expects more than {limit} bytes of zeros for keys never pushed, \
                     more than one response carries"
                ));
            }
            Ok(n * size_of::<T>())
        };
        // Checked above: every length is non-negative.
        let expects = |i: usize| {
            let n = expected.as_ref()?.get(i)?;
            usize::try_from(*n).ok()
        };
        // One key (a tensor, a large value): its stored values go out as they are.
        if let [key] = &keys[..] {
            let (vals, n) = match self.pulled(*key, expects(0))? {
                Pulled::Stored(stored) => {
                    (Bytes::from_owner(Lent(Arc::clone(stored))), stored.len())
                }
                Pulled::Zeros(n) => (Bytes::from(vec![0u8; zeros(n)?]), n),
            };
            return Ok(KvPairs {
                keys: request.keys.clone(),
                vals,
                // Owned inline: one allocation, none more when the frame clones it.
                lens: Some(Bytes::from_owner(len_of(n).to_le_bytes())),
            });
        }
        let mut vals = BytesMut::new();
        let mut lens = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            let n = match self.pulled(*key, expects(i))? {
                Pulled::Stored(stored) => {
                    vals.extend_from_slice(bytemuck::cast_slice(stored.as_slice()));
                    stored.len()
                }
                Pulled::Zeros(n) => {
                    vals.resize(vals.len() + zeros(n)?, 0);
                    n
                }
            };
            lens.push(len_of(n));
        }
        Ok(KvPairs {
            keys: request.keys.clone(),
            vals: vals.freeze(),
            lens: Some(values::to_bytes(&lens)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use van_core::DataType;

    fn meta(push: bool, pull: bool) -> KvMeta {
        KvMeta {
            cmd: 0,
            push,
            pull,
            sender: 9,
            request_id: 0,
            app_id: 0,
            customer_id: 0,
            val_type: DataType::F32,
        }
    }

    #[test]
    fn a_single_key_pull_lends_the_stored_values_and_a_later_push_does_not_change_them() {
        let mut sum = SumHandler::<f32>::default();
        let push = |vals: &[f32]| KvPairs::from_slices(&[7u64], vals, None);
        sum.handle(&meta(true, false), push(&[1.0, 2.0])).unwrap();
        let pull = KvPairs::from_slices::<f32>(&[7u64], &[], None);
        let answer = sum.handle(&meta(false, true), pull.clone()).unwrap();
        // The response's bytes are the store's own (no copy).
        let stored = sum.store.get(&7).unwrap();
        assert_eq!(answer.vals.as_ptr(), stored.as_ptr().cast::<u8>());
        // A push while the response is still held copies first: the response keeps the sum it
        // answered with, the store gets the new one.
        sum.handle(&meta(true, false), push(&[10.0, 20.0])).unwrap();
        assert_eq!(&*answer.vals::<f32>().unwrap(), &[1.0, 2.0]);
        let again = sum.handle(&meta(false, true), pull).unwrap();
        assert_eq!(&*again.vals::<f32>().unwrap(), &[11.0, 22.0]);
        assert_eq!(&*again.lens().unwrap().unwrap(), &[2]);
        // Several keys are answered as before.
        let six = KvPairs::from_slices(&[6u64], &[5.0f32, 6.0], None);
        sum.handle(&meta(true, false), six).unwrap();
        let both = KvPairs::from_slices::<f32>(&[6u64, 7], &[], None);
        let answer = sum.handle(&meta(false, true), both).unwrap();
        assert_eq!(&*answer.vals::<f32>().unwrap(), &[5.0, 6.0, 11.0, 22.0]);
        assert_eq!(&*answer.lens().unwrap().unwrap(), &[2, 2]);
    }

    /// A pull of keys `keys` expecting `lens` values of each (`None`: not saying).
    fn pull(keys: &[u64], lens: Option<&[i32]>) -> KvPairs {
        KvPairs::from_slices::<f32>(keys, &[], lens)
    }

    #[test]
    fn a_key_never_pushed_is_answered_with_zeros_or_an_error_never_with_fewer_values() {
        let mut sum = SumHandler::<f32>::default();
        let both = KvPairs::from_slices(&[1u64, 5], &[1.0f32, 2.0, 3.0, 4.0], None);
        sum.handle(&meta(true, false), both).unwrap();
        // ps-lite's behaviour: zeros, as many as the pull expects, each key in its place.
        for keys in [&[1u64, 5, 999][..], &[999], &[0, 1, 5]] {
            let answer = sum
                .handle(&meta(false, true), pull(keys, Some(&vec![2; keys.len()])))
                .unwrap();
            let want: Vec<f32> = keys
                .iter()
                .flat_map(|k| match k {
                    1 => [1.0, 2.0],
                    5 => [3.0, 4.0],
                    _ => [0.0, 0.0],
                })
                .collect();
            assert_eq!(&*answer.vals::<f32>().unwrap(), &want[..], "{keys:?}");
            assert_eq!(answer.lens().unwrap().unwrap().len(), keys.len());
        }
        // A pull that does not say how many values it expects gets an error naming the key.
        let unsaid = sum
            .handle(&meta(false, true), pull(&[1, 5, 999], None))
            .unwrap_err();
        assert!(unsaid.contains("key 999 was never pushed"), "{unsaid}");
        assert!(unsaid.contains("pull into a buffer"), "{unsaid}");
        // One that expects another number of values than a key holds, too.
        let other = sum
            .handle(&meta(false, true), pull(&[1, 5], Some(&[2, 3])))
            .unwrap_err();
        assert_eq!(other, "key 5 holds 2 values; the pull expects 3");
        // VANS_UNPUSHED_KEYS=error: every pull of a key never pushed fails naming it.
        let mut strict = SumHandler::<f32>::new(UnpushedKeys::Error);
        let one = KvPairs::from_slices(&[1u64], &[1.0f32], None);
        strict.handle(&meta(true, false), one).unwrap();
        let refused = strict
            .handle(&meta(false, true), pull(&[1, 999], Some(&[1, 1])))
            .unwrap_err();
        assert!(refused.contains("key 999 was never pushed"), "{refused}");
        let one = strict
            .handle(&meta(false, true), pull(&[1], Some(&[1])))
            .unwrap();
        assert_eq!(&*one.vals::<f32>().unwrap(), &[1.0]);
        // What a pull declares is bounded before zeros are allocated for it.
        let huge = sum
            .handle(
                &meta(false, true),
                pull(&[998, 999], Some(&[i32::MAX, i32::MAX])),
            )
            .unwrap_err();
        assert!(huge.contains("more than one response carries"), "{huge}");
    }
}
