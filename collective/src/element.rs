//! What a collective reduces: element types ([`Element`]: `f32`, `f64`, `i32`, `i64`, `u8`,
//! `bf16`, `f16`) and reduction operators ([`ReduceOp`]).

use half::{bf16, f16};
use van_core::DataType;

/// How values of different ranks combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The sum divided by the number of ranks (integers: truncated toward zero).
    Mean,
    /// The smallest value.
    Min,
    /// The largest value.
    Max,
    /// The product (integers: wrapping).
    Product,
}

impl ReduceOp {
    /// The operator's name, as in error messages and benchmark reports.
    pub fn as_str(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Product => "product",
        }
    }
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ReduceOp {
    type Err = String;
    fn from_str(s: &str) -> Result<ReduceOp, String> {
        match s {
            "sum" => Ok(ReduceOp::Sum),
            "mean" => Ok(ReduceOp::Mean),
            "min" => Ok(ReduceOp::Min),
            "max" => Ok(ReduceOp::Max),
            "product" => Ok(ReduceOp::Product),
            other => Err(format!(
                "unknown reduction {other:?} (expected sum, mean, min, max or product)"
            )),
        }
    }
}

/// The name of the element type whose [`Element::TAG`] is `tag` (`f32`, `bf16`, …), for
/// messages; `an unknown element type` for another number.
pub fn tag_name(tag: u64) -> &'static str {
    match tag {
        1 => i32::NAME,
        2 => i64::NAME,
        3 => f32::NAME,
        4 => f64::NAME,
        5 => bf16::NAME,
        6 => f16::NAME,
        7 => u8::NAME,
        _ => "an unknown element type",
    }
}

/// A type a collective can carry and reduce. Implemented for `f32`, `f64`, `i32`, `i64`,
/// `u8`, [`half::bf16`] and [`half::f16`]; values travel in the machine's byte order (all ranks of a cluster share
/// it in practice; a message says its element type and a mismatch is an error).
pub trait Element: bytemuck::Pod + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    /// The element's name (`f32`, `bf16`, …).
    const NAME: &'static str;
    /// The wire tag of the type. `bf16` has none in ps-lite's list and travels as
    /// [`DataType::Other`]; [`TAG`](Self::TAG) tells it from other such types.
    const DATA_TYPE: DataType;
    /// A number unique among element types, checked on every message.
    const TAG: u64;
    /// `self ⊕ other` for `op` (for [`ReduceOp::Mean`], the sum).
    fn combine(self, other: Self, op: ReduceOp) -> Self;
    /// `self / n`, the last step of a mean.
    fn divide(self, n: usize) -> Self;
}

macro_rules! integer_element {
    ($t:ty, $name:literal, $dt:ident, $tag:literal) => {
        impl Element for $t {
            const NAME: &'static str = $name;
            const DATA_TYPE: DataType = DataType::$dt;
            const TAG: u64 = $tag;
            #[inline]
            fn combine(self, other: Self, op: ReduceOp) -> Self {
                match op {
                    // Wrapping, like MPI's and NCCL's integer sums: never a panic.
                    ReduceOp::Sum | ReduceOp::Mean => self.wrapping_add(other),
                    ReduceOp::Min => self.min(other),
                    ReduceOp::Max => self.max(other),
                    ReduceOp::Product => self.wrapping_mul(other),
                }
            }
            #[inline]
            fn divide(self, n: usize) -> Self {
                // A rank count beyond the type's range (u8) divides to zero, as the mean of
                // that many values of the type must be below the largest.
                match <$t>::try_from(n.max(1)) {
                    Ok(n) => self.wrapping_div(n),
                    Err(_) => 0,
                }
            }
        }
    };
}

/// The minimum or maximum (`$pick`) of two floats, the same bits whichever comes first:
/// IEEE's `min` and `max` may return either of two equal zeros (`-0.0` and `+0.0`) or two
/// NaNs, so two ranks combining the same pair in opposite orders (recursive doubling's
/// partners) could disagree. Equal values combine by `$bits` on their bit patterns (`|`
/// for min: `-0.0`; `&` for max: `+0.0`); two NaNs give the larger bit pattern.
macro_rules! symmetric {
    ($t:ty, $a:expr, $b:expr, $pick:ident, $bits:expr) => {{
        let (a, b): ($t, $t) = ($a, $b);
        let bits: fn(_, _) -> _ = $bits;
        if a == b {
            <$t>::from_bits(bits(a.to_bits(), b.to_bits()))
        } else if a.is_nan() && b.is_nan() {
            <$t>::from_bits(a.to_bits().max(b.to_bits()))
        } else {
            a.$pick(b)
        }
    }};
}

macro_rules! float_element {
    ($t:ty, $name:literal, $dt:ident, $tag:literal) => {
        impl Element for $t {
            const NAME: &'static str = $name;
            const DATA_TYPE: DataType = DataType::$dt;
            const TAG: u64 = $tag;
            #[inline]
            fn combine(self, other: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Mean => self + other,
                    ReduceOp::Min => symmetric!($t, self, other, min, |a, b| a | b),
                    ReduceOp::Max => symmetric!($t, self, other, max, |a, b| a & b),
                    ReduceOp::Product => self * other,
                }
            }
            #[inline]
            fn divide(self, n: usize) -> Self {
                self / n.max(1) as $t
            }
        }
    };
}

integer_element!(i32, "i32", I32, 1);
integer_element!(i64, "i64", I64, 2);
float_element!(f32, "f32", F32, 3);
float_element!(f64, "f64", F64, 4);

/// The 16-bit floats: combined in `f32` and rounded once per step (as NCCL's bf16 and
/// fp16 sums).
macro_rules! half_element {
    ($t:ty, $name:literal, $tag:literal) => {
        impl Element for $t {
            const NAME: &'static str = $name;
            // Neither has a tag in ps-lite's list: `TAG` tells them apart.
            const DATA_TYPE: DataType = DataType::Other;
            const TAG: u64 = $tag;
            #[inline]
            fn combine(self, other: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Mean => {
                        <$t>::from_f32(self.to_f32() + other.to_f32())
                    }
                    ReduceOp::Min => symmetric!($t, self, other, min, |a, b| a | b),
                    ReduceOp::Max => symmetric!($t, self, other, max, |a, b| a & b),
                    ReduceOp::Product => <$t>::from_f32(self.to_f32() * other.to_f32()),
                }
            }
            #[inline]
            fn divide(self, n: usize) -> Self {
                <$t>::from_f32(self.to_f32() / n.max(1) as f32)
            }
        }
    };
}

half_element!(bf16, "bf16", 5);
half_element!(f16, "f16", 6);
integer_element!(u8, "u8", U8, 7);

/// Combines `incoming` (the bytes of `acc.len()` elements, in any alignment) into `acc`.
/// The caller checked the length.
pub(crate) fn reduce_into<T: Element>(acc: &mut [T], incoming: &[u8], op: ReduceOp) {
    match bytemuck::try_cast_slice::<u8, T>(incoming) {
        Ok(other) => combine_slice(acc, other, op),
        // A misaligned segment: read each element unaligned.
        Err(_) => {
            let size = std::mem::size_of::<T>();
            for (a, b) in acc.iter_mut().zip(incoming.chunks_exact(size)) {
                *a = a.combine(bytemuck::pod_read_unaligned(b), op);
            }
        }
    }
}

/// Combines `other` into `acc` element by element (`acc[i] = acc[i] ⊕ other[i]`, over the
/// shorter of the two). One loop per operator, each a plain element-wise loop the compiler
/// vectorises: the operator is not looked at per element.
pub(crate) fn combine_slice<T: Element>(acc: &mut [T], other: &[T], op: ReduceOp) {
    combine_in_order::<T, false>(acc, other, op);
}

/// Combines `first` into `acc` with `first` on the left (`acc[i] = first[i] ⊕ acc[i]`, over
/// the shorter of the two): the same order as copying `first` into `acc` and combining
/// `acc`'s old values into it, without the copy. (Only the shared-memory all-reduce, feature
/// `ipc`, folds this way.)
#[cfg_attr(not(feature = "ipc"), allow(dead_code))]
pub(crate) fn combine_slice_after<T: Element>(acc: &mut [T], first: &[T], op: ReduceOp) {
    combine_in_order::<T, true>(acc, first, op);
}

/// [`combine_slice`] (`OTHER_FIRST` false) and [`combine_slice_after`] (true).
fn combine_in_order<T: Element, const OTHER_FIRST: bool>(acc: &mut [T], other: &[T], op: ReduceOp) {
    #[inline(always)]
    fn each<T: Element, const OTHER_FIRST: bool>(acc: &mut [T], other: &[T], op: ReduceOp) {
        for (a, b) in acc.iter_mut().zip(other) {
            *a = match OTHER_FIRST {
                true => b.combine(*a, op),
                false => a.combine(*b, op),
            };
        }
    }
    match op {
        ReduceOp::Sum | ReduceOp::Mean => each::<T, OTHER_FIRST>(acc, other, ReduceOp::Sum),
        ReduceOp::Min => each::<T, OTHER_FIRST>(acc, other, ReduceOp::Min),
        ReduceOp::Max => each::<T, OTHER_FIRST>(acc, other, ReduceOp::Max),
        ReduceOp::Product => each::<T, OTHER_FIRST>(acc, other, ReduceOp::Product),
    }
}

/// Copies `incoming` (the bytes of `out.len()` elements, in any alignment) into `out`.
pub(crate) fn copy_into<T: Element>(out: &mut [T], incoming: &[u8]) {
    bytemuck::cast_slice_mut::<T, u8>(out).copy_from_slice(incoming);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combining_after_keeps_the_first_operand_first() {
        // Two NaNs of different payloads: a sum keeps one of them, by operand order (on
        // x86, the first's), so the order shows in the bits.
        let (a, b) = (f32::from_bits(0x7fc0_0001), f32::from_bits(0x7fc0_0002));
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Product] {
            let mut acc = [b, 2.0];
            combine_slice_after(&mut acc, &[a, 3.0], op);
            assert_eq!(acc[0].to_bits(), a.combine(b, op).to_bits(), "{op:?}");
            assert_eq!(acc[1], 3.0f32.combine(2.0, op), "{op:?}");
        }
    }

    #[test]
    fn combines_each_type_and_operator() {
        assert_eq!(3i32.combine(4, ReduceOp::Sum), 7);
        assert_eq!(i32::MAX.combine(1, ReduceOp::Sum), i32::MIN);
        assert_eq!((-3i64).combine(4, ReduceOp::Min), -3);
        assert_eq!(2.5f32.combine(4.0, ReduceOp::Max), 4.0);
        // Either order, the same bits: signed zeros and NaNs included.
        let nan = |bits: u32| f32::from_bits(0x7fc0_0000 | bits);
        for (a, b) in [
            (0.0f32, -0.0f32),
            (nan(1), nan(2)),
            (nan(3), 1.0),
            (-0.0, 2.0),
        ] {
            for op in [ReduceOp::Min, ReduceOp::Max] {
                let (x, y) = (a.combine(b, op), b.combine(a, op));
                assert_eq!(x.to_bits(), y.to_bits(), "{a:?} {b:?} {op:?}");
            }
        }
        assert_eq!(
            0.0f32.combine(-0.0, ReduceOp::Max).to_bits(),
            0.0f32.to_bits()
        );
        assert_eq!(
            0.0f64.combine(-0.0, ReduceOp::Min).to_bits(),
            (-0.0f64).to_bits()
        );
        let (p, m) = (bf16::from_f32(0.0), bf16::from_f32(-0.0));
        assert_eq!(
            m.combine(p, ReduceOp::Max).to_bits(),
            p.combine(m, ReduceOp::Max).to_bits()
        );
        assert_eq!(7i32.divide(2), 3);
        assert_eq!((-7i64).divide(2), -3);
        assert_eq!(3.0f64.divide(4), 0.75);
        let x = bf16::from_f32(1.5);
        assert_eq!(x.combine(bf16::from_f32(2.0), ReduceOp::Sum).to_f32(), 3.5);
        assert_eq!(x.divide(3).to_f32(), bf16::from_f32(0.5).to_f32());
        assert_eq!(3i32.combine(-4, ReduceOp::Product), -12);
        assert_eq!(200u8.combine(100, ReduceOp::Sum), 44);
        assert_eq!(16u8.combine(16, ReduceOp::Product), 0);
        assert_eq!(250u8.divide(5), 50);
        assert_eq!(250u8.divide(300), 0);
        assert_eq!(1.5f64.combine(-2.0, ReduceOp::Product), -3.0);
        let y = f16::from_f32(1.5);
        assert_eq!(
            y.combine(f16::from_f32(2.0), ReduceOp::Product).to_f32(),
            3.0
        );
        assert_eq!(y.combine(f16::from_f32(-2.0), ReduceOp::Min).to_f32(), -2.0);
        assert_eq!(y.divide(3).to_f32(), f16::from_f32(0.5).to_f32());
    }

    #[test]
    fn reduces_aligned_and_misaligned_bytes_alike() {
        let incoming: Vec<f64> = (0..9).map(|i| i as f64 * 0.5).collect();
        let bytes = bytemuck::cast_slice::<f64, u8>(&incoming);
        let mut shifted = vec![0u8; bytes.len() + 1];
        shifted[1..].copy_from_slice(bytes);
        let mut a = vec![1.0f64; 9];
        let mut b = vec![1.0f64; 9];
        reduce_into(&mut a, bytes, ReduceOp::Sum);
        reduce_into(&mut b, &shifted[1..], ReduceOp::Sum);
        assert_eq!(a, b);
        assert_eq!(a[8], 5.0);
        let mut c = vec![0.0f64; 9];
        copy_into(&mut c, &shifted[1..]);
        assert_eq!(c, incoming);
    }

    #[test]
    fn parses_operator_names() {
        for op in [
            ReduceOp::Sum,
            ReduceOp::Mean,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::Product,
        ] {
            assert_eq!(op.as_str().parse::<ReduceOp>(), Ok(op));
        }
        assert!("avg".parse::<ReduceOp>().is_err());
    }
}
