//! Caller memory the library borrows or fills: values lent to a request without a copy (the
//! request learns when the last reference is gone), values lent to the rendezvous with a
//! release callback, keys and lengths copied in, pulled values copied out, and the caller's
//! `user_data` pointers carried to its callbacks.

use std::ffi::c_void;

use bytes::Bytes;
use ps::KvPairs;
use tokio::sync::oneshot;

use crate::args;
use crate::error::{Failure, Outcome};

/// The caller's `user_data`, handed back to its callback on an I/O thread.
pub(crate) struct UserData(pub(crate) *mut c_void);

// SAFETY: the pointer is only handed back to the caller's callback, never dereferenced here;
// the documented contract makes the caller responsible for its thread-safety.
unsafe impl Send for UserData {}

/// A caller's value buffer lent to the library: read through the raw pointer until the last
/// [`Bytes`] made from it is dropped, which drops this owner and tells the request.
struct Lent {
    ptr: *const u8,
    len: usize,
    /// Dropped with the owner: the receiver learns the buffer is no longer referenced.
    _released: oneshot::Sender<()>,
}

// SAFETY: the buffer is only read, and the caller guarantees (documented contract of
// vans_push / vans_push_pull) that it stays valid and unmodified until the request has
// completed, which happens only after this owner is dropped; reading from any thread is
// then sound.
unsafe impl Send for Lent {}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` is non-null and valid for `len` bytes (checked in `lend`, and kept so
        // by the caller's contract while this owner lives).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Wraps the caller's `len` bytes at `ptr` without copying; the receiver resolves once no
/// reference to them is left.
pub(crate) fn lend(
    ptr: *const c_void,
    len: usize,
    what: &str,
) -> Result<(Bytes, oneshot::Receiver<()>), Failure> {
    let (released, on_release) = oneshot::channel();
    if len == 0 {
        return Ok((Bytes::new(), on_release));
    }
    args::check_array(ptr.cast::<u8>(), len, what)?;
    let owner = Lent {
        ptr: ptr.cast(),
        len,
        _released: released,
    };
    Ok((Bytes::from_owner(owner), on_release))
}

/// A copy of the caller's `count` elements of `size` bytes at `ptr` (keys, lengths).
///
/// # Safety
///
/// A non-null `ptr` must be readable for `count * size` bytes.
unsafe fn copy_in(
    ptr: *const c_void,
    count: usize,
    size: usize,
    what: &str,
) -> Result<Bytes, Failure> {
    if ptr.is_null() && count > 0 {
        return Err(Failure::invalid(format!(
            "{what} is NULL but num_keys is {count}"
        )));
    }
    let bytes = count
        .checked_mul(size)
        .ok_or_else(|| Failure::invalid(format!("{what} has an impossible length of {count}")))?;
    // SAFETY: readable for `bytes` bytes by the caller's contract (byte arrays need no
    // alignment).
    let slice = unsafe { args::slice(ptr.cast::<u8>(), bytes, what) }?;
    Ok(Bytes::copy_from_slice(slice))
}

/// Where a pull writes: the caller's value buffer and, optionally, its per-key lengths.
pub(crate) struct Output {
    vals: *mut u8,
    vals_len: usize,
    lens: *mut i32,
    num_keys: usize,
}

// SAFETY: written once, by the completion, and the caller guarantees (documented contract of
// vans_pull / vans_push_pull) that the buffers stay valid and are not accessed until the
// request has completed.
unsafe impl Send for Output {}

impl Output {
    /// Checks the caller's output buffers before the request is made.
    pub(crate) fn new(
        vals: *mut c_void,
        vals_len: usize,
        lens: *mut i32,
        num_keys: usize,
        value_size: usize,
    ) -> Result<Output, Failure> {
        if vals_len % value_size != 0 {
            return Err(Failure::invalid(format!(
                "the output buffer of {vals_len} bytes does not hold whole values of \
                 {value_size} bytes"
            )));
        }
        if vals_len > 0 {
            args::check_array(vals.cast::<u8>(), vals_len, "vals")?;
        }
        if !lens.is_null() && num_keys > 0 {
            args::check_array(lens.cast::<u8>(), num_keys * 4, "lens")?;
        }
        Ok(Output {
            vals: vals.cast(),
            vals_len,
            lens,
            num_keys,
        })
    }

    /// What a pull into this output expects of each key, when it can say: without `lens`
    /// to receive lengths, the buffer holds the same number of values for every key. The
    /// pull sends it, so that a server answers a key no one pushed with that many zeros.
    pub(crate) fn expected_lens(&self, value_size: usize) -> Option<Bytes> {
        let values = self.vals_len / value_size;
        if !self.lens.is_null() || self.num_keys == 0 || values == 0 || values % self.num_keys != 0
        {
            return None;
        }
        let per_key = i32::try_from(values / self.num_keys).ok()?;
        Some(ps::values::repeated(per_key, self.num_keys))
    }

    /// Copies the pulled values (and lengths) into the caller's buffers: the pull's one copy.
    pub(crate) fn fill(self, pulled: &KvPairs, value_size: usize) -> Outcome {
        let vals: &mut [u8] = if self.vals_len == 0 {
            &mut []
        } else {
            // SAFETY: non-null and of this length (checked in `new`); valid and not accessed
            // by anyone else until the request completes (the caller's contract).
            unsafe { std::slice::from_raw_parts_mut(self.vals, self.vals_len) }
        };
        pulled.copy_vals_into(vals)?;
        if self.lens.is_null() || self.num_keys == 0 {
            return Ok(());
        }
        let lens = match pulled.lens()? {
            Some(lens) => lens,
            None => {
                let per_key = pulled.vals.len() / value_size / self.num_keys;
                vec![i32::try_from(per_key).unwrap_or(i32::MAX); self.num_keys].into()
            }
        };
        if lens.len() != self.num_keys {
            return Err(Failure::invalid(format!(
                "{} lengths arrived for the {} keys pulled",
                lens.len(),
                self.num_keys
            )));
        }
        // SAFETY: `self.lens` is valid for `num_keys` i32s (checked in `new` and the caller's
        // contract); byte-wise, so no alignment is assumed.
        unsafe {
            std::ptr::copy_nonoverlapping(
                lens.as_ptr().cast::<u8>(),
                self.lens.cast::<u8>(),
                self.num_keys * 4,
            )
        };
        Ok(())
    }
}

/// Copies the caller's keys and (optional) lengths.
///
/// # Safety
///
/// `keys` readable for `num_keys` `u64`, `lens` NULL or readable for `num_keys` `i32`.
pub(crate) unsafe fn pairs_in(
    keys: *const u64,
    num_keys: usize,
    lens: *const i32,
) -> Result<KvPairs, Failure> {
    // SAFETY: forwarded contract.
    let keys = unsafe { copy_in(keys.cast(), num_keys, 8, "keys") }?;
    let lens = if lens.is_null() {
        None
    } else {
        // SAFETY: forwarded contract.
        Some(unsafe { copy_in(lens.cast(), num_keys, 4, "lens") }?)
    };
    Ok(KvPairs {
        keys,
        vals: Bytes::new(),
        lens,
    })
}

/// A buffer lent to the rendezvous: read until the last [`Bytes`] made from it is dropped,
/// then given back through the caller's `release`. Dropped without being turned into bytes
/// (a call that failed first), it is given back at once: `release` runs exactly once.
pub(crate) struct LentUntilRelease {
    ptr: *const u8,
    len: usize,
    release: unsafe extern "C" fn(*mut c_void),
    user_data: *mut c_void,
}

// SAFETY: the buffer is only read, and the caller guarantees (contract of
// vans_rendezvous_send) that it stays valid and unmodified until `release` is called, which
// happens only when this owner is dropped; `release` may be called on any thread (contract).
unsafe impl Send for LentUntilRelease {}

impl LentUntilRelease {
    /// Takes charge of calling `release(user_data)` once, before anything is checked.
    pub(crate) fn new(
        release: unsafe extern "C" fn(*mut c_void),
        user_data: *mut c_void,
    ) -> LentUntilRelease {
        LentUntilRelease {
            ptr: std::ptr::null(),
            len: 0,
            release,
            user_data,
        }
    }

    /// The caller's `len` bytes at `ptr`, without a copy.
    pub(crate) fn into_bytes(
        mut self,
        ptr: *const c_void,
        len: usize,
        what: &str,
    ) -> Result<Bytes, Failure> {
        if len > 0 {
            args::check_array(ptr.cast::<u8>(), len, what)?;
        }
        self.ptr = ptr.cast();
        self.len = len;
        Ok(Bytes::from_owner(self))
    }
}

impl AsRef<[u8]> for LentUntilRelease {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: non-null and valid for `len` bytes while this owner lives (checked in
        // `into_bytes` and the caller's contract).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for LentUntilRelease {
    fn drop(&mut self) {
        // SAFETY: the caller's release function with its own user data, called exactly once
        // (this owner is dropped once).
        unsafe { (self.release)(self.user_data) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lent_values_are_not_copied_and_report_their_release() {
        let values = [1.0f32, 2.0, 3.0, 4.0];
        let (bytes, mut released) = lend(values.as_ptr().cast(), 16, "vals").unwrap();
        // The same memory, not a copy.
        assert_eq!(bytes.as_ptr(), values.as_ptr().cast::<u8>());
        let slice = bytes.slice(4..8);
        drop(bytes);
        // A slice still refers to the buffer: not released yet.
        assert!(matches!(
            released.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        assert_eq!(&slice[..], &2.0f32.to_ne_bytes());
        drop(slice);
        assert!(matches!(
            released.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
    }

    #[test]
    fn lending_checks_the_pointer() {
        assert!(lend(std::ptr::null(), 8, "vals").is_err());
        let (empty, mut released) = lend(std::ptr::null(), 0, "vals").unwrap();
        assert!(empty.is_empty());
        assert!(released.try_recv().is_err());
    }
}
