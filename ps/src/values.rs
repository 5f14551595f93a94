//! Typed views of key-value data carried as bytes.
//!
//! Keys travel as little-endian `u64`, values as the native little-endian layout of their
//! type, per-key lengths as `i32` (ps-lite's `SArray<int>`). Segments arrive 8-byte aligned
//! (see `van_core::wire`), so [`view`] borrows them in place; a buffer that is not aligned
//! (for example one built by hand) is copied once instead.

use std::borrow::Cow;

use bytes::Bytes;
use van_core::DataType;

use node::error::NodeError;

/// A value type the parameter server can carry: plain old data with a wire type.
pub trait Value: bytemuck::Pod + Default + Send + Sync + 'static {
    /// The type's code in a message's `data_types`.
    const DATA_TYPE: DataType;

    /// `acc += other`, element-wise (wrapping for integers, so a peer cannot make it panic).
    fn add_assign(acc: &mut [Self], other: &[Self]);
}

macro_rules! float_value {
    ($($t:ty => $d:ident),*) => {$(
        impl Value for $t {
            const DATA_TYPE: DataType = DataType::$d;
            fn add_assign(acc: &mut [Self], other: &[Self]) {
                for (a, b) in acc.iter_mut().zip(other) {
                    *a += *b;
                }
            }
        }
    )*};
}

macro_rules! int_value {
    ($($t:ty => $d:ident),*) => {$(
        impl Value for $t {
            const DATA_TYPE: DataType = DataType::$d;
            fn add_assign(acc: &mut [Self], other: &[Self]) {
                for (a, b) in acc.iter_mut().zip(other) {
                    *a = a.wrapping_add(*b);
                }
            }
        }
    )*};
}

float_value!(f32 => F32, f64 => F64);
int_value!(i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16, u32 => U32, u64 => U64);

/// `values` as bytes (one copy).
pub fn to_bytes<T: Value>(values: &[T]) -> Bytes {
    Bytes::copy_from_slice(bytemuck::cast_slice(values))
}

/// `value` `n` times, as bytes (one allocation): the per-key lengths of a request whose
/// keys all have the same number of values.
pub fn repeated<T: Value>(value: T, n: usize) -> Bytes {
    Bytes::from(bytemuck::bytes_of(&value).repeat(n))
}

/// `bytes` viewed as `[T]`: borrowed when aligned, copied otherwise. Fails when the length
/// is not a multiple of the element size.
pub fn view<T: Value>(bytes: &[u8]) -> Result<Cow<'_, [T]>, NodeError> {
    let size = std::mem::size_of::<T>();
    if bytes.len() % size != 0 {
        return Err(NodeError::InvalidArgument(format!(
            "{} bytes is not a whole number of {}-byte values",
            bytes.len(),
            size
        )));
    }
    Ok(match bytemuck::try_cast_slice(bytes) {
        Ok(slice) => Cow::Borrowed(slice),
        Err(_) => {
            let mut owned = vec![T::default(); bytes.len() / size];
            bytemuck::cast_slice_mut::<T, u8>(&mut owned).copy_from_slice(bytes);
            Cow::Owned(owned)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_viewed_in_place() {
        let bytes = to_bytes(&[1.5f32, -2.0, 3.25]);
        let values = view::<f32>(&bytes).unwrap();
        assert!(matches!(values, Cow::Borrowed(_)) || bytes.as_ptr() as usize % 4 != 0);
        assert_eq!(&*values, &[1.5, -2.0, 3.25]);
    }

    #[test]
    fn unaligned_buffers_are_copied_and_bad_lengths_refused() {
        let raw = [0u8, 1, 0, 0, 0, 2, 0, 0, 0];
        // Offset 1 of an array is misaligned for u32 wherever the array starts... unless the
        // array itself starts at 3 mod 4, so only check the values, not the variant.
        assert_eq!(&*view::<u32>(&raw[1..]).unwrap(), &[1, 2]);
        assert!(view::<u32>(&raw[..3]).is_err());
    }

    #[test]
    fn integer_sums_wrap_instead_of_panicking() {
        let mut acc = [i32::MAX, 1];
        i32::add_assign(&mut acc, &[1, 2]);
        assert_eq!(acc, [i32::MIN, 3]);
        let mut f = [0.5f64];
        f64::add_assign(&mut f, &[0.25]);
        assert_eq!(f, [0.75]);
    }
}
