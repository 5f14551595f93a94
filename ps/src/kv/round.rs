//! Synchronous rounds, as BytePS's server aggregates: every worker push-pulls its value of a
//! key with [`ROUND_CMD`], and each gets back the sum of that round's pushes from all workers
//! once the last one is in; then the key starts a fresh round.
//!
//! [`SumHandler`](super::SumHandler) keeps one [`Rounds`] beside its ps-lite store and sends
//! it the requests whose `cmd` is [`ROUND_CMD`]; the store never sees them.

use std::collections::hash_map::Entry;

use bytes::Bytes;
use van_core::node_ids;

use super::hold::{Handled, HeldRequest, Released, ShardContext};
use super::{KvMeta, KvPairs};
use crate::values::Value;
use node::hash::IntMap;

/// The `cmd` of a synchronous round push-pull: the server adds the values into the key's
/// round accumulator (not the ps-lite store), holds the request, and once every worker
/// (`num_workers`, one push each) has pushed that key, answers all of the round's requests
/// with the round's sum (keys, values and lengths, like any one-key push-pull) and starts the
/// key's next round.
///
/// A round request is a push-pull ([`KvWorker::push_pull`](super::KvWorker::push_pull)) of
/// one key, with the server's value type, and with as many values as the round's first push.
/// Anything else, and a worker pushing the same key twice in one round, fails with
/// [`NodeError::HandlerFailed`](crate::NodeError::HandlerFailed) and leaves the round as it was.
///
/// Its value is `0x524F_554E` (`"ROUN"` in ASCII), far from the small commands
/// (0, 1, 2, …) applications give their own requests.
///
/// ```no_run
/// # async fn round(worker: ps::KvWorker<f32>, gradient: &[f32]) -> ps::Result<Vec<f32>> {
/// let id = worker.push_pull(&[42], gradient, None, ps::ROUND_CMD).await?;
/// // Answered once every worker has pushed key 42 in this round: the sum of their gradients.
/// Ok(worker.wait(id).await?.vals::<f32>()?.into_owned())
/// # }
/// ```
pub const ROUND_CMD: i32 = 0x524F_554E;

/// The synchronous rounds of one shard: each key's round in progress.
///
/// Not part of a [`SumHandler`](super::SumHandler)'s snapshot: a round lives only while its
/// workers wait for it (a checkpoint is taken between rounds, after a barrier), and restore
/// leaves the rounds in progress alone so the requests already held still get their answer.
#[derive(Debug)]
pub(super) struct Rounds<T: Value> {
    /// Each key's round in progress (a key is here from its first push to its last).
    open: IntMap<u64, Round<T>>,
    /// Answers of held requests, for the shard to collect
    /// ([`take_released`](Self::take_released)).
    released: Vec<Released>,
}

/// One key's round in progress.
#[derive(Debug)]
struct Round<T: Value> {
    /// The sum of the pushes so far.
    sum: Vec<T>,
    /// The requests of those pushes, held until the round completes (one per worker).
    held: Vec<HeldRequest>,
}

/// A round's sum lent to its responses as bytes: every worker's answer shares it.
struct RoundSum<T: Value>(Vec<T>);

impl<T: Value> AsRef<[u8]> for RoundSum<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(self.0.as_slice())
    }
}

impl<T: Value> Default for Rounds<T> {
    fn default() -> Self {
        Rounds {
            open: IntMap::default(),
            released: Vec::new(),
        }
    }
}

impl<T: Value> Rounds<T> {
    /// Adds one worker's push of a [`ROUND_CMD`] request: holds it, or completes the round
    /// (answering it now and releasing the others), or refuses it with the reason.
    pub(super) fn push_pull(
        &mut self,
        meta: &KvMeta,
        request: &KvPairs,
        context: &ShardContext,
    ) -> Handled {
        match self.add(meta, request, context) {
            Ok(Some(sum)) => Handled::Answer(Ok(sum)),
            Ok(None) => Handled::Held,
            Err(reason) => Handled::Answer(Err(reason)),
        }
    }

    /// Moves the answers of held requests completed since the last call into `out`.
    pub(super) fn take_released(&mut self, out: &mut Vec<Released>) {
        out.append(&mut self.released);
    }

    /// The round's sum when this push completes it, `None` when the request is held.
    fn add(
        &mut self,
        meta: &KvMeta,
        request: &KvPairs,
        context: &ShardContext,
    ) -> Result<Option<KvPairs>, String> {
        if !(meta.push && meta.pull) {
            return Err("a round (ROUND_CMD) is a push-pull: set both push and pull".to_owned());
        }
        if !node_ids::is_worker(meta.sender) {
            return Err(format!(
                "round requests come from workers; node {} is not one",
                meta.sender
            ));
        }
        if meta.val_type != T::DATA_TYPE {
            return Err(format!(
                "values of type {:?} sent to a server summing {:?}",
                meta.val_type,
                T::DATA_TYPE
            ));
        }
        let keys = request.keys().map_err(|e| e.to_string())?;
        let [key] = keys[..] else {
            return Err(format!(
                "a round push-pull carries one key per request, not {}",
                keys.len()
            ));
        };
        // Checks that the lengths, when given, agree with the values.
        request
            .value_offsets(std::mem::size_of::<T>())
            .map_err(|e| e.to_string())?;
        let vals = request.vals::<T>().map_err(|e| e.to_string())?;
        let workers = usize::try_from(context.num_workers)
            .unwrap_or(usize::MAX)
            .max(1);
        let pushed = match self.open.get(&key) {
            Some(round) => {
                if round.held.iter().any(|held| held.sender == meta.sender) {
                    return Err(format!(
                        "key {key}: worker {} already pushed in this round ({} of {workers} \
                         pushes in); wait for the round's answer before pushing again",
                        meta.sender,
                        round.held.len()
                    ));
                }
                if round.sum.len() != vals.len() {
                    return Err(format!(
                        "key {key}: pushed {} values into a round of {}",
                        vals.len(),
                        round.sum.len()
                    ));
                }
                round.held.len()
            }
            None => 0,
        };
        if pushed + 1 < workers {
            if context.hold_room == 0 {
                return Err(format!(
                    "key {key}: the server already holds as many round requests as it may \
                     (num_workers × keys in flight is beyond its limit); push fewer keys at once"
                ));
            }
            let me = HeldRequest::of(meta);
            match self.open.entry(key) {
                Entry::Occupied(mut round) => {
                    let round = round.get_mut();
                    T::add_assign(&mut round.sum, &vals);
                    round.held.push(me);
                }
                Entry::Vacant(slot) => {
                    slot.insert(Round {
                        sum: vals.into_owned(),
                        held: vec![me],
                    });
                }
            }
            return Ok(None);
        }
        // The last push of the round: everyone gets the sum, and the key starts over.
        let (sum, held) = match self.open.remove(&key) {
            Some(mut round) => {
                T::add_assign(&mut round.sum, &vals);
                (round.sum, round.held)
            }
            None => (vals.into_owned(), Vec::new()),
        };
        let len = i32::try_from(sum.len()).unwrap_or(i32::MAX);
        let answer = KvPairs {
            keys: Bytes::from_owner(key.to_le_bytes()),
            vals: Bytes::from_owner(RoundSum(sum)),
            lens: Some(Bytes::from_owner(len.to_le_bytes())),
        };
        self.released
            .extend(held.into_iter().map(|request| Released {
                request,
                answer: Ok(answer.clone()),
            }));
        Ok(Some(answer))
    }
}

#[cfg(test)]
mod tests {
    use van_core::DataType;

    use super::*;
    use crate::kv::hold::MAX_HELD_REQUESTS;
    use crate::kv::{RequestHandler, SumHandler};

    /// Worker ids of ranks 0, 1, 2.
    const WORKERS: [i32; 3] = [9, 11, 13];

    fn round_meta(sender: i32, request_id: i32) -> KvMeta {
        KvMeta {
            cmd: ROUND_CMD,
            push: true,
            pull: true,
            sender,
            request_id,
            app_id: 0,
            customer_id: 0,
            val_type: DataType::F32,
        }
    }

    fn context(num_workers: u32) -> ShardContext {
        ShardContext {
            num_workers,
            hold_room: MAX_HELD_REQUESTS,
        }
    }

    fn push(key: u64, vals: &[f32]) -> KvPairs {
        KvPairs::from_slices(&[key], vals, None)
    }

    /// The answer a request got now: its values, or the handler's reason.
    fn answered(handled: Handled) -> Result<Vec<f32>, String> {
        match handled {
            Handled::Answer(answer) => answer.map(|pairs| pairs.vals::<f32>().unwrap().to_vec()),
            Handled::Held => panic!("the request was held"),
        }
    }

    fn released(sum: &mut SumHandler<f32>) -> Vec<(HeldRequest, KvPairs)> {
        let mut out = Vec::new();
        sum.take_released(&mut out);
        out.into_iter()
            .map(|r| (r.request, r.answer.unwrap()))
            .collect()
    }

    /// One round of `values[i]` pushed by worker `i` to `key`: every worker's answer.
    fn round(sum: &mut SumHandler<f32>, key: u64, values: &[Vec<f32>], id: i32) -> Vec<Vec<f32>> {
        let ctx = context(values.len() as u32);
        let (last, first) = values.split_last().unwrap();
        for (i, vals) in first.iter().enumerate() {
            let handled = sum.handle_or_hold(&round_meta(WORKERS[i], id), push(key, vals), &ctx);
            assert!(matches!(handled, Handled::Held), "push {i} answered early");
            assert!(released(sum).is_empty());
        }
        let n = first.len();
        let handled = sum.handle_or_hold(&round_meta(WORKERS[n], id), push(key, last), &ctx);
        let mut answers = released(sum);
        assert_eq!(answers.len(), n, "held requests released");
        answers.sort_by_key(|(held, _)| held.sender);
        let mut out = Vec::new();
        for (i, (held, pairs)) in answers.into_iter().enumerate() {
            assert_eq!(
                held,
                HeldRequest {
                    sender: WORKERS[i],
                    request_id: id
                }
            );
            assert_eq!(&*pairs.keys().unwrap(), &[key]);
            assert_eq!(&*pairs.lens().unwrap().unwrap(), &[last.len() as i32]);
            out.push(pairs.vals::<f32>().unwrap().to_vec());
        }
        out.push(answered(handled).unwrap());
        out
    }

    #[test]
    fn two_and_three_workers_get_each_rounds_sum_and_rounds_start_over() {
        let mut sum = SumHandler::<f32>::default();
        // Two workers, key 5: three rounds in sequence, different values each round.
        for r in 0..3 {
            let r = r as f32;
            let answers = round(&mut sum, 5, &[vec![1.0 + r, 2.0], vec![10.0, 20.0 * r]], 1);
            assert_eq!(answers, vec![vec![11.0 + r, 2.0 + 20.0 * r]; 2]);
        }
        // Three workers on another key (its own rounds, of another length).
        for r in 0..3 {
            let r = r as f32;
            let values = vec![vec![r], vec![100.0], vec![-1.0 - r]];
            assert_eq!(round(&mut sum, 6, &values, 2), vec![vec![99.0]; 3]);
        }
    }

    #[test]
    fn rounds_of_several_keys_interleave() {
        let mut sum = SumHandler::<f32>::default();
        let ctx = context(2);
        let held = |h: Handled| matches!(h, Handled::Held);
        assert!(held(sum.handle_or_hold(
            &round_meta(9, 1),
            push(1, &[1.0]),
            &ctx
        )));
        assert!(held(sum.handle_or_hold(
            &round_meta(9, 2),
            push(2, &[2.0]),
            &ctx
        )));
        assert!(!held(sum.handle_or_hold(
            &round_meta(11, 7),
            push(2, &[20.0]),
            &ctx
        )));
        let answers = released(&mut sum);
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].0.request_id, 2);
        assert_eq!(&*answers[0].1.vals::<f32>().unwrap(), &[22.0]);
        let last = sum.handle_or_hold(&round_meta(11, 8), push(1, &[10.0]), &ctx);
        assert_eq!(answered(last).unwrap(), vec![11.0]);
        assert_eq!(released(&mut sum)[0].0.request_id, 1);
    }

    #[test]
    fn one_worker_is_answered_at_once() {
        let mut sum = SumHandler::<f32>::default();
        let handled = sum.handle_or_hold(&round_meta(9, 1), push(3, &[4.0, 5.0]), &context(1));
        assert_eq!(answered(handled).unwrap(), vec![4.0, 5.0]);
        assert!(released(&mut sum).is_empty());
    }

    /// What a ps-lite pull of `key` reads from the store: its values, `None` if never pushed.
    fn stored(sum: &mut SumHandler<f32>, key: u64) -> Option<Vec<f32>> {
        let meta = KvMeta {
            cmd: 0,
            push: false,
            ..round_meta(9, 0)
        };
        let pull = KvPairs::from_slices::<f32>(&[key], &[], None);
        match sum.handle(&meta, pull) {
            Ok(pairs) => Some(pairs.vals::<f32>().unwrap().to_vec()),
            Err(e) if e.contains("never pushed") => None,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn the_ps_lite_store_is_untouched_by_rounds() {
        let mut sum = SumHandler::<f32>::default();
        let plain_push = KvMeta {
            cmd: 0,
            pull: false,
            ..round_meta(9, 0)
        };
        sum.handle(&plain_push, push(5, &[1.0])).unwrap();
        round(&mut sum, 5, &[vec![100.0], vec![200.0]], 3);
        assert_eq!(stored(&mut sum, 5), Some(vec![1.0]));
        // A round of a key never pushed the ps-lite way leaves the store without it.
        round(&mut sum, 6, &[vec![1.0], vec![2.0]], 4);
        assert_eq!(stored(&mut sum, 6), None);
        // `handle` on its own cannot hold, so it refuses a round instead of summing it.
        let refused = sum.handle(&round_meta(9, 5), push(5, &[1.0])).unwrap_err();
        assert!(refused.contains("handle_or_hold"), "{refused}");
        // Round state is not in the snapshot, and a restore leaves the round in progress.
        let held = sum.handle_or_hold(&round_meta(9, 6), push(7, &[1.0]), &context(2));
        assert!(matches!(held, Handled::Held));
        let snapshot = sum.snapshot().unwrap();
        sum.restore(&snapshot).unwrap();
        let last = sum.handle_or_hold(&round_meta(11, 6), push(7, &[2.0]), &context(2));
        assert_eq!(answered(last).unwrap(), vec![3.0]);
        // A handler restored from the snapshot has the store and no round in progress: worker
        // 11's push of key 7 opens a round instead of completing one.
        let mut restored = SumHandler::<f32>::default();
        restored.restore(&snapshot).unwrap();
        assert_eq!(stored(&mut restored, 5), Some(vec![1.0]));
        let opened = restored.handle_or_hold(&round_meta(11, 6), push(7, &[2.0]), &context(2));
        assert!(matches!(opened, Handled::Held));
    }

    #[test]
    fn bad_round_requests_are_refused_and_leave_the_round_as_it_was() {
        let mut sum = SumHandler::<f32>::default();
        let ctx = context(3);
        let refused = |sum: &mut SumHandler<f32>, meta: KvMeta, pairs: KvPairs| {
            answered(sum.handle_or_hold(&meta, pairs, &ctx)).unwrap_err()
        };
        // More than one key.
        let two = KvPairs::from_slices(&[1u64, 2], &[1.0f32, 2.0], None);
        let e = refused(&mut sum, round_meta(9, 1), two);
        assert!(e.contains("one key per request"), "{e}");
        // A wrong value type.
        let wrong = KvMeta {
            val_type: DataType::F64,
            ..round_meta(9, 1)
        };
        let e = refused(
            &mut sum,
            wrong,
            KvPairs::from_slices(&[1u64], &[1.0f64], None),
        );
        assert!(e.contains("F64"), "{e}");
        // A push or pull alone.
        let push_only = KvMeta {
            pull: false,
            ..round_meta(9, 1)
        };
        let e = refused(&mut sum, push_only, push(1, &[1.0]));
        assert!(e.contains("push-pull"), "{e}");
        // Not from a worker (a server's id).
        let e = refused(&mut sum, round_meta(8, 1), push(1, &[1.0]));
        assert!(e.contains("not one"), "{e}");
        // Lengths that disagree with the values.
        let bad_lens = KvPairs::from_slices(&[1u64], &[1.0f32, 2.0], Some(&[3]));
        refused(&mut sum, round_meta(9, 1), bad_lens);
        // A round in progress: worker 9 pushed 2 values.
        let first = sum.handle_or_hold(&round_meta(9, 1), push(1, &[1.0, 2.0]), &ctx);
        assert!(matches!(first, Handled::Held));
        // The same worker again in the same round.
        let e = refused(&mut sum, round_meta(9, 2), push(1, &[1.0, 2.0]));
        assert!(e.contains("already pushed in this round"), "{e}");
        // Another length than the round's first push.
        let e = refused(&mut sum, round_meta(11, 1), push(1, &[1.0]));
        assert!(e.contains("pushed 1 values into a round of 2"), "{e}");
        // No room left to hold a request: refused, unless it completes the round.
        let full = ShardContext {
            hold_room: 0,
            ..ctx
        };
        let e = answered(sum.handle_or_hold(&round_meta(11, 1), push(1, &[1.0, 1.0]), &full));
        assert!(e.unwrap_err().contains("limit"));
        // The round goes on with what it had: 9's push plus the two that follow.
        let second = sum.handle_or_hold(&round_meta(11, 1), push(1, &[10.0, 20.0]), &ctx);
        assert!(matches!(second, Handled::Held));
        let last = sum.handle_or_hold(&round_meta(13, 1), push(1, &[100.0, 200.0]), &full);
        assert_eq!(answered(last).unwrap(), vec![111.0, 222.0]);
        assert_eq!(released(&mut sum).len(), 2);
        assert_eq!(stored(&mut sum, 1), None);
    }
}
