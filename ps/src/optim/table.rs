//! [`TableHandler`]: one shard of an embedding table, with its optimizer state, and its
//! snapshot.
//!
//! # Snapshot layout (version 1, little-endian)
//!
//! | size | field |
//! | --- | --- |
//! | 4 | magic `b"VTBL"` |
//! | 4 | version, 1 |
//! | 4 + n | the table's spec, as text ([`TableSpec`]'s display) |
//! | 8 | row count |
//! | per row: 8 + 4 + 4 × width | key, update count, weights then optimizer state |
//!
//! Rows are in key order, so a table gives the same bytes whatever order it was touched in.
//! Pending sums ([`ACCUMULATE_CMD`](super::ACCUMULATE_CMD)) are not part of a snapshot: take
//! one between steps.

use bytes::{Buf, BufMut, BytesMut};

use super::rule::{apply, init_value, initial_state};
use super::{TableSpec, ACCUMULATE_CMD, APPLY_CMD};
use crate::kv::{KvMeta, KvPairs, RequestHandler};
use crate::values::Value;
use node::hash::IntMap;

const MAGIC: &[u8; 4] = b"VTBL";
const VERSION: u32 = 1;

/// A shard of an embedding table: answers pulls with rows, applies pushed gradients with the
/// table's optimizer (see [the module](super) for the commands). Values are `f32`.
#[derive(Debug)]
pub struct TableHandler {
    spec: TableSpec,
    /// Values per row in `data`: the weights, then each optimizer slot.
    width: usize,
    /// Row index of each key.
    rows: IntMap<u64, u32>,
    /// The key of each row.
    keys: Vec<u64>,
    /// Each row's update count (Adam's `t`).
    steps: Vec<u32>,
    /// Rows back to back, `width` values each.
    data: Vec<f32>,
    /// Gradient sums not yet applied, by row.
    pending: IntMap<u32, Vec<f32>>,
}

impl TableHandler {
    /// An empty shard of a table described by `spec`.
    pub fn new(spec: TableSpec) -> TableHandler {
        TableHandler {
            width: spec.dim * (1 + spec.optimizer.slots()),
            spec,
            rows: IntMap::default(),
            keys: Vec::new(),
            steps: Vec::new(),
            data: Vec::new(),
            pending: IntMap::default(),
        }
    }

    /// The table's spec.
    pub fn spec(&self) -> &TableSpec {
        &self.spec
    }

    /// Rows created so far.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no row has been created.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The row of `key`, created from the initializer on its first touch.
    fn row(&mut self, key: u64) -> Result<usize, String> {
        if let Some(&row) = self.rows.get(&key) {
            return Ok(row as usize);
        }
        let row = u32::try_from(self.keys.len())
            .map_err(|_| "the table shard holds 2^32 rows already".to_owned())?;
        let state = initial_state(&self.spec.optimizer);
        self.data.extend(initial_row(&self.spec, key));
        self.data
            .extend(std::iter::repeat_n(state, self.width - self.spec.dim));
        self.keys.push(key);
        self.steps.push(0);
        self.rows.insert(key, row);
        Ok(row as usize)
    }

    /// Applies `grad` to row `row`.
    fn step(&mut self, row: usize, grad: &[f32]) {
        let dim = self.spec.dim;
        let step = self.steps[row].saturating_add(1);
        self.steps[row] = step;
        let values = &mut self.data[row * self.width..(row + 1) * self.width];
        let (weights, state) = values.split_at_mut(dim);
        apply(&self.spec.optimizer, weights, state, step, grad);
    }

    /// The gradients of a push, `dim` per key, checked.
    fn gradients<'a>(
        &self,
        request: &'a KvPairs,
        keys: usize,
    ) -> Result<std::borrow::Cow<'a, [f32]>, String> {
        let grads = request.vals::<f32>().map_err(|e| e.to_string())?;
        if grads.len() != keys * self.spec.dim {
            return Err(format!(
                "{} gradient values for {keys} keys of a table with dim {} (expected {})",
                grads.len(),
                self.spec.dim,
                keys * self.spec.dim
            ));
        }
        if let Some(lens) = request.lens().map_err(|e| e.to_string())? {
            if let Some(len) = lens.iter().find(|&&l| l as usize != self.spec.dim) {
                return Err(format!(
                    "a key pushed {len} values to a table with dim {}",
                    self.spec.dim
                ));
            }
        }
        Ok(grads)
    }
}

impl RequestHandler for TableHandler {
    fn handle(&mut self, meta: &KvMeta, request: KvPairs) -> Result<KvPairs, String> {
        let carries_values = meta.push || !meta.pull;
        if carries_values && meta.val_type != f32::DATA_TYPE {
            return Err(format!(
                "gradients of type {:?} pushed to an embedding table of f32",
                meta.val_type
            ));
        }
        let keys = request.keys().map_err(|e| e.to_string())?;
        let dim = self.spec.dim;
        if meta.push {
            let grads = self.gradients(&request, keys.len())?;
            for (key, grad) in keys.iter().zip(grads.chunks_exact(dim)) {
                let row = self.row(*key)?;
                if meta.cmd == ACCUMULATE_CMD {
                    let sum = self
                        .pending
                        .entry(row as u32)
                        .or_insert_with(|| vec![0.0; dim]);
                    for (s, g) in sum.iter_mut().zip(grad) {
                        *s += g;
                    }
                } else {
                    self.step(row, grad);
                }
            }
        } else if meta.cmd == ACCUMULATE_CMD {
            return Err("ACCUMULATE_CMD is a push (gradients to add)".into());
        }
        if !meta.pull {
            return Ok(KvPairs::default());
        }
        let mut vals = BytesMut::with_capacity(keys.len() * dim * 4);
        for key in keys.iter() {
            let row = self.row(*key)?;
            if meta.cmd == APPLY_CMD {
                if let Some(sum) = self.pending.remove(&(row as u32)) {
                    self.step(row, &sum);
                }
            }
            let weights = &self.data[row * self.width..row * self.width + dim];
            vals.extend_from_slice(bytemuck::cast_slice(weights));
        }
        Ok(KvPairs {
            keys: request.keys.clone(),
            vals: vals.freeze(),
            lens: None,
        })
    }

    fn snapshot(&self) -> Result<Vec<u8>, String> {
        let spec = self.spec.to_string();
        let mut order: Vec<usize> = (0..self.keys.len()).collect();
        order.sort_unstable_by_key(|&row| self.keys[row]);
        let mut out = Vec::with_capacity(16 + spec.len() + self.keys.len() * (12 + 4 * self.width));
        out.put_slice(MAGIC);
        out.put_u32_le(VERSION);
        out.put_u32_le(spec.len() as u32);
        out.put_slice(spec.as_bytes());
        out.put_u64_le(self.keys.len() as u64);
        for row in order {
            out.put_u64_le(self.keys[row]);
            out.put_u32_le(self.steps[row]);
            for v in &self.data[row * self.width..(row + 1) * self.width] {
                out.put_f32_le(*v);
            }
        }
        Ok(out)
    }

    /// Replaces the shard's rows with a snapshot's, which must come from a table of the same
    /// spec (optimizer settings included).
    fn restore(&mut self, state: &[u8]) -> Result<(), String> {
        let mut buf = state;
        let truncated = || "the table snapshot is truncated".to_owned();
        if buf.remaining() < 12 || &buf[..4] != MAGIC {
            return Err("not an embedding table snapshot (no VTBL header)".into());
        }
        buf.advance(4);
        let version = buf.get_u32_le();
        if version != VERSION {
            return Err(format!(
                "table snapshot version {version}; this build reads {VERSION}"
            ));
        }
        let spec_len = buf.get_u32_le() as usize;
        if buf.remaining() < spec_len {
            return Err(truncated());
        }
        let (spec_bytes, rest) = buf.split_at(spec_len);
        buf = rest;
        let spec_text = String::from_utf8_lossy(spec_bytes);
        let spec: TableSpec = spec_text.parse().map_err(|e| format!("{e}"))?;
        if spec != self.spec {
            return Err(format!(
                "the snapshot is of a table \"{spec}\"; this one is \"{}\"",
                self.spec
            ));
        }
        if buf.remaining() < 8 {
            return Err(truncated());
        }
        let count = buf.get_u64_le();
        let row_bytes = 12 + 4 * self.width;
        let count = usize::try_from(count)
            .ok()
            .filter(|c| c.checked_mul(row_bytes) == Some(buf.remaining()))
            .ok_or_else(|| {
                format!(
                    "the table snapshot says {count} rows but holds {} bytes of rows",
                    buf.remaining()
                )
            })?;
        let mut fresh = TableHandler::new(self.spec);
        fresh.data.reserve(count * self.width);
        for _ in 0..count {
            let key = buf.get_u64_le();
            let step = buf.get_u32_le();
            if fresh.rows.insert(key, fresh.keys.len() as u32).is_some() {
                return Err(format!("the table snapshot holds key {key} twice"));
            }
            fresh.keys.push(key);
            fresh.steps.push(step);
            fresh.data.extend((0..self.width).map(|_| buf.get_f32_le()));
        }
        *self = fresh;
        Ok(())
    }
}

/// The rows `keys` would start with in a table of `spec`, back to back: what a
/// single-process reference needs to start from the same weights.
pub fn initial_rows(spec: &TableSpec, keys: &[u64]) -> Vec<f32> {
    keys.iter()
        .flat_map(|&key| initial_row(spec, key))
        .collect()
}

/// The weights key `key`'s row starts with.
fn initial_row(spec: &TableSpec, key: u64) -> impl Iterator<Item = f32> + '_ {
    (0..spec.dim).map(move |col| init_value(spec.init, spec.seed, key, col))
}

#[cfg(test)]
mod tests {
    use van_core::DataType;

    use super::*;
    use crate::optim::{Init, Optimizer};

    fn meta(cmd: i32, push: bool, pull: bool) -> KvMeta {
        KvMeta {
            cmd,
            push,
            pull,
            sender: 9,
            request_id: 0,
            app_id: 0,
            customer_id: 0,
            val_type: DataType::F32,
        }
    }

    fn spec(text: &str) -> TableSpec {
        text.parse().unwrap()
    }

    fn pull(table: &mut TableHandler, cmd: i32, keys: &[u64]) -> Vec<f32> {
        let request = KvPairs::from_slices::<f32>(keys, &[], None);
        let answer = table.handle(&meta(cmd, false, true), request).unwrap();
        assert_eq!(answer.keys, crate::values::to_bytes(keys));
        answer.vals::<f32>().unwrap().into_owned()
    }

    fn push(table: &mut TableHandler, cmd: i32, keys: &[u64], grads: &[f32]) {
        let request = KvPairs::from_slices(keys, grads, None);
        table.handle(&meta(cmd, true, false), request).unwrap();
    }

    #[test]
    fn rows_start_from_the_seeded_initializer_and_step_with_their_own_counts() {
        let spec = spec("optimizer=adam dim=3 lr=0.1 init=normal std=0.5 seed=4");
        let mut table = TableHandler::new(spec);
        let rows = pull(&mut table, 0, &[7, 70]);
        assert_eq!(rows, initial_rows(&spec, &[7, 70]));
        assert_eq!(table.len(), 2);
        // Key 7 twice (two steps), key 70 once, in one push.
        let grads = [1.0, 2.0, 3.0, 0.5, 0.5, 0.5, -1.0, 0.0, 1.0];
        push(&mut table, 0, &[7, 7, 70], &grads);
        let mut expect = initial_rows(&spec, &[7, 70]);
        let mut state = [0.0; 12];
        apply(
            &spec.optimizer,
            &mut expect[..3],
            &mut state[..6],
            1,
            &grads[..3],
        );
        apply(
            &spec.optimizer,
            &mut expect[..3],
            &mut state[..6],
            2,
            &grads[3..6],
        );
        apply(
            &spec.optimizer,
            &mut expect[3..],
            &mut state[6..],
            1,
            &grads[6..],
        );
        assert_eq!(pull(&mut table, 0, &[7, 70]), expect);
        // A push-pull answers with the rows after the step.
        let request = KvPairs::from_slices(&[70], &[1.0f32, 1.0, 1.0], None);
        let answer = table.handle(&meta(0, true, true), request).unwrap();
        apply(
            &spec.optimizer,
            &mut expect[3..],
            &mut state[6..],
            2,
            &[1.0; 3],
        );
        assert_eq!(&*answer.vals::<f32>().unwrap(), &expect[3..]);
    }

    #[test]
    fn accumulated_gradients_are_applied_once_as_their_sum() {
        let spec = spec("optimizer=adagrad dim=2 lr=0.5 init=zeros");
        let mut table = TableHandler::new(spec);
        push(&mut table, ACCUMULATE_CMD, &[1, 2], &[1.0, 2.0, 3.0, 4.0]);
        push(&mut table, ACCUMULATE_CMD, &[1], &[0.5, 0.5]);
        // Not applied yet.
        assert_eq!(pull(&mut table, 0, &[1, 2]), vec![0.0; 4]);
        let applied = pull(&mut table, APPLY_CMD, &[1]);
        let mut expect = vec![0.0f32; 2];
        apply(&spec.optimizer, &mut expect, &mut [0.0; 2], 1, &[1.5, 2.5]);
        assert_eq!(applied, expect);
        // A second APPLY of the same key finds nothing pending.
        assert_eq!(pull(&mut table, APPLY_CMD, &[1]), expect);
        let mut two = vec![0.0f32; 2];
        apply(&spec.optimizer, &mut two, &mut [0.0; 2], 1, &[3.0, 4.0]);
        assert_eq!(pull(&mut table, APPLY_CMD, &[2, 1]), [two, expect].concat());
    }

    #[test]
    fn bad_requests_are_refused_and_change_nothing() {
        let mut table = TableHandler::new(spec("dim=2 init=zeros"));
        let three = KvPairs::from_slices(&[1], &[1.0f32, 2.0, 3.0], None);
        let err = table.handle(&meta(0, true, false), three).unwrap_err();
        assert!(err.contains("3 gradient values for 1 keys"), "{err}");
        let mut m = meta(0, true, false);
        m.val_type = DataType::F64;
        let err = table
            .handle(&m, KvPairs::from_slices(&[1], &[1.0f64], None))
            .unwrap_err();
        assert!(err.contains("F64"), "{err}");
        let err = table
            .handle(
                &meta(ACCUMULATE_CMD, false, true),
                KvPairs::from_slices::<f32>(&[1], &[], None),
            )
            .unwrap_err();
        assert!(err.contains("is a push"), "{err}");
        assert!(table.is_empty());
    }

    #[test]
    fn a_restored_snapshot_continues_exactly_and_bad_bytes_are_refused() {
        let spec = spec("optimizer=adam dim=4 lr=0.05 seed=3");
        let mut table = TableHandler::new(spec);
        let grads: Vec<f32> = (0..12).map(|i| (i as f32 - 5.0) / 4.0).collect();
        push(&mut table, 0, &[30, 10, 20], &grads);
        push(&mut table, 0, &[10], &grads[..4]);
        let snapshot = table.snapshot().unwrap();
        let mut restored = TableHandler::new(spec);
        restored.restore(&snapshot).unwrap();
        assert_eq!(restored.snapshot().unwrap(), snapshot);
        for t in [&mut table, &mut restored] {
            push(t, 0, &[10, 20], &grads[4..]);
        }
        assert_eq!(
            pull(&mut table, 0, &[10, 20, 30]),
            pull(&mut restored, 0, &[10, 20, 30])
        );
        // Another spec, a cut anywhere, garbage: refused, and the table is unchanged.
        let before = restored.snapshot().unwrap();
        let mut other = TableHandler::new(self::spec("optimizer=adam dim=4 lr=0.01 seed=3"));
        let err = other.restore(&snapshot).unwrap_err();
        assert!(err.contains("lr=0.05") && err.contains("lr=0.01"), "{err}");
        for cut in 0..snapshot.len() {
            assert!(restored.restore(&snapshot[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(
            restored.snapshot().unwrap(),
            before,
            "a refused restore changed it"
        );
        let mut noise = snapshot.clone();
        for i in 12..noise.len() {
            noise[i] = noise[i].wrapping_mul(31).wrapping_add(i as u8);
            let _ = restored.restore(&noise);
        }
        restored.restore(&before).unwrap();
        assert_eq!(restored.snapshot().unwrap(), before);
    }

    #[test]
    fn ftrl_with_l1_keeps_small_weights_at_zero() {
        let spec = TableSpec {
            dim: 2,
            optimizer: Optimizer::Ftrl {
                lr: 0.1,
                beta: 1.0,
                l1: 1.0,
                l2: 0.0,
            },
            init: Init::Zeros,
            seed: 0,
        };
        let mut table = TableHandler::new(spec);
        push(&mut table, 0, &[5], &[0.3, 4.0]);
        let row = pull(&mut table, 0, &[5]);
        assert_eq!(row[0], 0.0, "|z| = 0.3 <= l1");
        assert!(row[1] < 0.0, "a large gradient moves the weight: {row:?}");
    }
}
