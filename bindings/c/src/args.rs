//! Checks of what the C caller passes: handles, arrays with their lengths, strings and
//! out-pointers. Null pointers, lengths that cannot be, misaligned arrays and non-UTF-8 text
//! are errors naming the argument; only what cannot be checked (a dangling pointer, a buffer
//! shorter than its stated length) is left to the documented contract.

use std::ffi::{c_char, CStr};

use crate::error::{guard, Failure};

/// The object behind a handle, or an error naming `what` when it is null.
///
/// # Safety
///
/// A non-null `ptr` must point to a live `T` for `'a`.
pub(crate) unsafe fn handle<'a, T>(ptr: *const T, what: &str) -> Result<&'a T, Failure> {
    // SAFETY: non-null pointers are live `T`s by the caller's contract.
    unsafe { ptr.as_ref() }.ok_or_else(|| Failure::invalid(format!("{what} is NULL")))
}

/// The mutable object behind a handle, or an error naming `what` when it is null.
///
/// # Safety
///
/// A non-null `ptr` must point to a live `T` for `'a`, used by nobody else meanwhile.
pub(crate) unsafe fn handle_mut<'a, T>(ptr: *mut T, what: &str) -> Result<&'a mut T, Failure> {
    // SAFETY: non-null pointers are live, exclusive `T`s by the caller's contract.
    unsafe { ptr.as_mut() }.ok_or_else(|| Failure::invalid(format!("{what} is NULL")))
}

/// Writes `value` through the out-pointer `ptr`, or fails naming `what` when it is null.
///
/// # Safety
///
/// A non-null `ptr` must be valid for writing one `T`.
pub(crate) unsafe fn write_out<T>(ptr: *mut T, what: &str, value: T) -> Result<(), Failure> {
    check_out(ptr, what)?;
    // SAFETY: non-null (checked) and writable by the caller's contract; `write` does not
    // drop whatever garbage was there.
    unsafe { ptr.write(value) };
    Ok(())
}

/// Boxes `value` and writes the box through `ptr` as a handle the caller owns (released with
/// [`free_handle`]), or fails naming `what` when `ptr` is null (then nothing is boxed).
///
/// # Safety
///
/// A non-null `ptr` must be valid for writing one pointer.
pub(crate) unsafe fn write_handle<T>(
    ptr: *mut *mut T,
    what: &str,
    value: T,
) -> Result<(), Failure> {
    check_out(ptr, what)?;
    // SAFETY: non-null (checked, so the box is not leaked) and writable by the caller's
    // contract.
    unsafe { write_out(ptr, what, Box::into_raw(Box::new(value))) }
}

/// The body of the `*_free` entry point `name`: releases a handle made by [`write_handle`];
/// NULL is ignored.
///
/// # Safety
///
/// `ptr` must be NULL or come from [`write_handle`], and not be used after this call.
pub(crate) unsafe fn free_handle<T>(name: &str, ptr: *mut T) {
    let _ = guard(name, || {
        if !ptr.is_null() {
            // SAFETY: from `Box::into_raw` in `write_handle`, released once (contract).
            drop(unsafe { Box::from_raw(ptr) });
        }
        Ok(())
    });
}

/// Fails naming `what` when the out-pointer `ptr` is null (checked before any work is done).
pub(crate) fn check_out<T>(ptr: *mut T, what: &str) -> Result<(), Failure> {
    if ptr.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    Ok(())
}

/// `len` elements at `ptr` as a slice: empty when `len` is 0 (whatever `ptr` is), an error
/// naming `what` when `ptr` is null or misaligned for `T` or the byte size overflows.
///
/// # Safety
///
/// A non-null `ptr` must be valid for reading `len` elements for `'a`, not written meanwhile.
pub(crate) unsafe fn slice<'a, T>(
    ptr: *const T,
    len: usize,
    what: &str,
) -> Result<&'a [T], Failure> {
    if len == 0 {
        return Ok(&[]);
    }
    check_array(ptr, len, what)?;
    // SAFETY: non-null, aligned and of a size that fits `isize` (checked); readable for `len`
    // elements by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Checks an array argument that is not a zero-length one: non-null, aligned for `T`, and of a
/// byte size that fits `isize`.
pub(crate) fn check_array<T>(ptr: *const T, len: usize, what: &str) -> Result<(), Failure> {
    if ptr.is_null() {
        return Err(Failure::invalid(format!(
            "{what} is NULL but its length is {len}"
        )));
    }
    if (ptr as usize) % std::mem::align_of::<T>() != 0 {
        return Err(Failure::invalid(format!(
            "{what} ({ptr:p}) is not aligned to {} bytes",
            std::mem::align_of::<T>()
        )));
    }
    let fits = len
        .checked_mul(std::mem::size_of::<T>())
        .is_some_and(|bytes| bytes <= isize::MAX as usize);
    if !fits {
        return Err(Failure::invalid(format!(
            "{what} has an impossible length of {len} elements"
        )));
    }
    Ok(())
}

/// A NUL-terminated UTF-8 string argument.
///
/// # Safety
///
/// A non-null `ptr` must point to a NUL-terminated string that lives for `'a`.
pub(crate) unsafe fn text<'a>(ptr: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if ptr.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-null, and NUL-terminated and live by the caller's contract.
    let text = unsafe { CStr::from_ptr(ptr) };
    text.to_str()
        .map_err(|e| Failure::invalid(format!("{what} is not UTF-8: {e}")))
}
