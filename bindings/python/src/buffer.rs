//! Python memory borrowed without copies: any object exporting the buffer protocol (numpy
//! arrays, `bytes`, `memoryview`, …) or `__dlpack__` (torch and JAX CPU tensors, through
//! `numpy.from_dlpack`), viewed as [`Bytes`] that keep the exporter's buffer pinned.
//!
//! Releasing a buffer needs the interpreter, and the last reference to a push's bytes is
//! usually dropped on an I/O thread that does not hold it. Rather than wait for the GIL
//! there (which would stall the I/O thread for up to Python's switch interval), a released
//! view goes to a small queue that the next call into the module empties while it holds the
//! GIL ([`release_pending`]).

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::Mutex;

use bytes::Bytes;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use van_core::DataType;

/// Views released on threads without the interpreter, waiting for the next call that has it.
static RELEASED: Mutex<Vec<PyUntypedBuffer>> = Mutex::new(Vec::new());

/// Releases the buffer views dropped by I/O threads since the last call (needs the GIL).
pub(crate) fn release_pending(py: Python<'_>) {
    let views: Vec<PyUntypedBuffer> = match RELEASED.lock() {
        Ok(mut views) if !views.is_empty() => std::mem::take(&mut *views),
        Ok(_) => return,
        Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
    };
    for view in views {
        view.release(py);
    }
}

/// A contiguous Python buffer, pinned for as long as this value lives.
pub(crate) struct Pinned {
    ptr: *mut c_void,
    len: usize,
    view: ManuallyDrop<PyUntypedBuffer>,
}

// SAFETY: the view pins an exporter's memory, which stays valid and in place until the view
// is released, from whichever thread (Python's buffer protocol has no thread affinity); the
// raw pointer is only read (`AsRef`) or written by the one owner of an output buffer.
unsafe impl Send for Pinned {}
// SAFETY: shared access only reads through the pointer (see `Send`).
unsafe impl Sync for Pinned {}

impl Pinned {
    /// Pins `obj`'s buffer; it must be C-contiguous (and writable when `writable`).
    pub(crate) fn new(obj: &Bound<'_, PyAny>, what: &str, writable: bool) -> PyResult<Pinned> {
        let view = match PyUntypedBuffer::get(obj) {
            Ok(view) => view,
            Err(buffer_error) => {
                if !obj.hasattr("__dlpack__")? {
                    return Err(PyTypeError::new_err(format!(
                        "{what}: a {} exports neither the buffer protocol nor __dlpack__ ({buffer_error}); \
                         pass a numpy array or a CPU tensor",
                        obj.get_type().name()?
                    )));
                }
                // numpy views a CPU DLPack tensor in place; the array keeps the producer alive.
                let array = numpy(obj.py())?.getattr("from_dlpack")?.call1((obj,))?;
                PyUntypedBuffer::get(&array)?
            }
        };
        if !view.is_c_contiguous() {
            return Err(PyValueError::new_err(format!(
                "{what} is not C-contiguous; pass numpy.ascontiguousarray(...) of it"
            )));
        }
        if writable && view.readonly() {
            return Err(PyValueError::new_err(format!(
                "{what} is read-only; pass a writable array"
            )));
        }
        Ok(Pinned {
            ptr: view.buf_ptr(),
            len: view.len_bytes(),
            view: ManuallyDrop::new(view),
        })
    }

    /// The buffer's element type, when it is one the parameter server carries.
    pub(crate) fn data_type(&self) -> Option<DataType> {
        data_type_of(self.view.format().to_bytes(), self.view.item_size())
    }

    /// The buffer's element type, for error messages.
    pub(crate) fn format(&self) -> String {
        if let Some(dtype) = self.data_type() {
            return dtype_name(dtype).to_owned();
        }
        format!(
            "{}-byte '{}'",
            self.view.item_size(),
            self.view.format().to_string_lossy()
        )
    }

    /// The buffer as [`Bytes`] that keep it pinned (no copy).
    pub(crate) fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }

    /// Copies `data` into the buffer, which must be exactly as long. The caller owns the
    /// buffer for writing (an `out=` array).
    pub(crate) fn write(&mut self, data: &[u8]) -> Result<(), String> {
        if data.len() != self.len {
            return Err(format!(
                "the output holds {} bytes but {} bytes arrived",
                self.len,
                data.len()
            ));
        }
        if self.len > 0 {
            // SAFETY: the view is writable (checked in `new` for outputs), C-contiguous and
            // `len` bytes long, and stays pinned while `self` lives; `data` is a distinct
            // Rust allocation, so the two do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.cast::<u8>(), self.len)
            };
        }
        Ok(())
    }
}

impl AsRef<[u8]> for Pinned {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the view pins `len` contiguous bytes at `ptr` for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: `view` is taken once, here, and never used again.
        let view = unsafe { ManuallyDrop::take(&mut self.view) };
        let mut released = RELEASED.lock().unwrap_or_else(|e| e.into_inner());
        released.push(view);
    }
}

/// The element type of a buffer format (struct-module syntax) with items of `size` bytes.
fn data_type_of(format: &[u8], size: usize) -> Option<DataType> {
    let code = match format {
        [b'<' | b'=' | b'@', code] | [code] => *code,
        _ => return None,
    };
    match (code, size) {
        (b'f', 4) => Some(DataType::F32),
        (b'd', 8) => Some(DataType::F64),
        (b'i' | b'l', 4) => Some(DataType::I32),
        (b'l' | b'q', 8) => Some(DataType::I64),
        (b'L' | b'Q', 8) => Some(DataType::U64),
        (b'B' | b'c', 1) => Some(DataType::U8),
        _ => None,
    }
}

/// The numpy dtype name of `dtype`.
pub(crate) fn dtype_name(dtype: DataType) -> &'static str {
    dtype.name()
}

/// The type named `name` (a numpy dtype name such as `"float32"`), if values can have it.
pub(crate) fn parse_dtype(name: &str) -> PyResult<DataType> {
    let types = ps::handle::VALUE_TYPES;
    DataType::from_name(name)
        .filter(|dtype| types.contains(dtype))
        .ok_or_else(|| {
            let names: Vec<&str> = types.iter().map(|t| t.name()).collect();
            PyTypeError::new_err(format!(
                "dtype {name} is not supported; use {}",
                names.join(", ")
            ))
        })
}

/// The value type a `dtype=` argument names: a numpy dtype, a numpy scalar type
/// (`numpy.float32`) or its name; float32 when not given.
pub(crate) fn dtype_arg(dtype: Option<&Bound<'_, PyAny>>) -> PyResult<DataType> {
    let Some(dtype) = dtype else {
        return Ok(DataType::F32);
    };
    if let Ok(name) = dtype.extract::<String>() {
        return parse_dtype(&name);
    }
    let name: String = numpy(dtype.py())?
        .getattr("dtype")?
        .call1((dtype,))?
        .getattr("name")?
        .extract()?;
    parse_dtype(&name)
}

/// Sorted `u64` keys from a buffer of `uint64` or `int64` values, pinned. `int64` keys are
/// read as their bits (hashed ids may be negative), so they must be sorted as `uint64`: keys
/// that are not, and hold a negative one, are refused naming it, instead of as "not sorted".
pub(crate) fn keys(obj: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    let pinned = Pinned::new(obj, "keys", false)?;
    match pinned.data_type() {
        Some(DataType::U64) => Ok(pinned.into_bytes()),
        Some(DataType::I64) => {
            let bytes = pinned.into_bytes();
            let key = |b: &[u8]| i64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
            let keys = bytes.chunks_exact(8).map(key);
            let as_unsigned = |k: i64| u64::from_le_bytes(k.to_le_bytes());
            // The common case (no negative key) costs one pass. With one, only keys ascending
            // as int64 but not as uint64 are blamed on it; any other disorder is named by the
            // request's own check.
            let Some((at, negative)) = keys.clone().enumerate().find(|(_, k)| *k < 0) else {
                return Ok(bytes);
            };
            let pairs = || keys.clone().zip(keys.clone().skip(1));
            let signed_only = pairs().all(|(a, b)| a < b)
                && !pairs().all(|(a, b)| as_unsigned(a) < as_unsigned(b));
            if !signed_only {
                return Ok(bytes);
            }
            Err(PyValueError::new_err(format!(
                "key {negative} at position {at} is negative: int64 keys are read as \
                 uint64 ({negative} is {}), so they must be sorted as uint64 \
                 (keys.view(numpy.uint64).sort())",
                as_unsigned(negative)
            )))
        }
        _ => Err(PyTypeError::new_err(format!(
            "keys must be uint64 (or int64), not {}; use numpy.asarray(keys, dtype=numpy.uint64)",
            pinned.format()
        ))),
    }
}

/// Values of type `dtype` from a buffer, pinned.
pub(crate) fn values(obj: &Bound<'_, PyAny>, dtype: DataType) -> PyResult<Bytes> {
    let pinned = Pinned::new(obj, "values", false)?;
    if pinned.data_type() != Some(dtype) {
        return Err(PyTypeError::new_err(format!(
            "values are {} but this worker carries {}; convert with .astype(numpy.{})",
            pinned.format(),
            dtype_name(dtype),
            dtype_name(dtype)
        )));
    }
    Ok(pinned.into_bytes())
}

/// Per-key lengths (`int32`), pinned.
pub(crate) fn lens(obj: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    let pinned = Pinned::new(obj, "lens", false)?;
    if pinned.data_type() != Some(DataType::I32) {
        return Err(PyTypeError::new_err(format!(
            "lens must be int32, not {}",
            pinned.format()
        )));
    }
    Ok(pinned.into_bytes())
}

/// An output array: writable, contiguous, of type `dtype`.
pub(crate) fn output(obj: &Bound<'_, PyAny>, dtype: DataType) -> PyResult<Pinned> {
    let pinned = Pinned::new(obj, "out", true)?;
    if pinned.data_type() != Some(dtype) {
        return Err(PyTypeError::new_err(format!(
            "out is {} but this worker carries {}",
            pinned.format(),
            dtype_name(dtype)
        )));
    }
    Ok(pinned)
}

/// An output array lent to a pull that writes each server's answer straight into it
/// (`ps::handle::Worker::pull_into`): writable, contiguous, of the worker's type.
pub(crate) struct Output(Pinned);

impl Output {
    /// `obj` as an output of `dtype` values (see [`output`]).
    pub(crate) fn new(obj: &Bound<'_, PyAny>, dtype: DataType) -> PyResult<Output> {
        output(obj, dtype).map(Output)
    }
}

impl AsRef<[u8]> for Output {
    fn as_ref(&self) -> &[u8] {
        self.0.as_ref()
    }
}

impl AsMut<[u8]> for Output {
    fn as_mut(&mut self) -> &mut [u8] {
        if self.0.len == 0 {
            return &mut [];
        }
        // SAFETY: the view is writable (checked by `output`), C-contiguous and `len` bytes
        // long, pinned while `self` lives, and lent to the one request that owns `self`.
        unsafe { std::slice::from_raw_parts_mut(self.0.ptr.cast::<u8>(), self.0.len) }
    }
}

/// The `numpy` module, imported once.
pub(crate) fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    NUMPY
        .get_or_try_init(py, || Ok::<_, PyErr>(py.import("numpy")?.unbind()))
        .map(|m| m.bind(py))
}

/// A new numpy array of `dtype` holding a copy of `data` (whose length is a whole number of
/// values: the caller checked it).
pub(crate) fn new_array<'py>(
    py: Python<'py>,
    data: &[u8],
    dtype: DataType,
) -> PyResult<Bound<'py, PyAny>> {
    let size = dtype.size();
    if data.len() % size != 0 {
        return Err(PyValueError::new_err(format!(
            "{} bytes arrived, not a whole number of {}",
            data.len(),
            dtype_name(dtype)
        )));
    }
    let array = numpy(py)?
        .getattr("empty")?
        .call1((data.len() / size, dtype_name(dtype)))?;
    let mut out = Pinned::new(&array, "array", true)?;
    out.write(data).map_err(PyValueError::new_err)?;
    drop(out);
    release_pending(py);
    Ok(array)
}
