//! The C entry points `vans.tensorflow`'s TensorFlow ops call: a table of functions the op
//! library gets from `vans_tf_api()` (exported by this module, which the library links), and
//! a worker named by its handle (`Worker._tf_handle()`), an op attribute. A graph carries only
//! the handle, never an address: a graph built by hand, or by another process, can only name
//! a worker this process registered, or fail with an error. The ops run on TensorFlow's
//! threads, outside Python: each call blocks that thread until the servers answered (never
//! holding the GIL), and pulls write each server's answer straight into the op's output
//! tensor.

use std::collections::BTreeMap;
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use ps::handle::Worker as EmbedWorker;
use ps::KvPairs;

/// The table's layout version; the ops refuse another.
const VERSION: u32 = 2;

/// What an op's kernel calls. Every function returns 0, or 1 with a NUL-terminated message in
/// `err` (at most `err_len` bytes).
#[repr(C)]
pub(crate) struct TfApi {
    version: u32,
    /// Pulls `n` sorted unique keys' values into `out` (`out_len` floats, the same number per
    /// key), with `cmd`.
    pull: unsafe extern "C" fn(
        worker: u64,
        keys: *const u64,
        n: usize,
        out: *mut f32,
        out_len: usize,
        cmd: i32,
        err: *mut c_char,
        err_len: usize,
    ) -> i32,
    /// Pushes `vals` (`len` floats) for `n` sorted unique keys, with `cmd`, and waits.
    push: unsafe extern "C" fn(
        worker: u64,
        keys: *const u64,
        n: usize,
        vals: *const f32,
        len: usize,
        cmd: i32,
        err: *mut c_char,
        err_len: usize,
    ) -> i32,
    /// Pushes `vals` as `push` does, then pulls the updated rows into `out` as `pull` does,
    /// in one request per server.
    push_pull: unsafe extern "C" fn(
        worker: u64,
        keys: *const u64,
        n: usize,
        vals: *const f32,
        len: usize,
        out: *mut f32,
        out_len: usize,
        cmd: i32,
        err: *mut c_char,
        err_len: usize,
    ) -> i32,
}

static TF_API: TfApi = TfApi {
    version: VERSION,
    pull,
    push,
    push_pull,
};

/// The function table the TensorFlow ops call (exported: the op library links this module).
#[no_mangle]
pub(crate) extern "C" fn vans_tf_api() -> *const TfApi {
    std::ptr::addr_of!(TF_API)
}

/// The workers the ops may name, by handle. Weak: an op whose `vans.Worker` is gone fails
/// with an error instead of using freed memory.
static WORKERS: Mutex<BTreeMap<u64, Weak<EmbedWorker>>> = Mutex::new(BTreeMap::new());
/// The next handle: never 0, never reused.
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

fn workers() -> std::sync::MutexGuard<'static, BTreeMap<u64, Weak<EmbedWorker>>> {
    // Map operations only: a poisoned lock still holds a consistent map.
    WORKERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A new handle for `worker`, which ops may name from now on (entries of dropped workers
/// go as new ones come).
pub(crate) fn register(worker: &Arc<EmbedWorker>) -> u64 {
    let handle = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
    let mut workers = workers();
    workers.retain(|_, w| w.strong_count() > 0);
    workers.insert(handle, Arc::downgrade(worker));
    handle
}

/// The worker of `handle`, held for one call.
fn worker(handle: u64) -> Result<Arc<EmbedWorker>, String> {
    match workers().get(&handle) {
        None => Err(format!(
            "no vans worker has handle {handle} in this process (the op's `worker` \
             attribute comes from vans.tensorflow's functions in the process that runs it; \
             a graph built by hand or by another process cannot name one)"
        )),
        Some(weak) => weak.upgrade().ok_or_else(|| {
            format!(
                "the vans.Worker of handle {handle} is gone: keep it alive while its ops can run"
            )
        }),
    }
}

/// An op's output tensor lent to a pull for the duration of one blocking call.
struct Lent {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the memory is the op's output tensor, written only by the pull that owns this value,
// while the op's thread blocks in `pull` until that pull has completed: `blocking_thread`
// refuses the one thread where a wait would return at once (leaving the pull running).
unsafe impl Send for Lent {}

/// Fails on an async runtime's thread (a vans I/O thread, say from a Python callback): there
/// a blocking wait returns at once, and a pull would go on writing into memory the op frees.
fn blocking_thread() -> Result<(), String> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(
            "a vans TensorFlow op cannot run on an async runtime thread (a vans I/O \
                    thread, e.g. inside a request's callback)"
                .to_owned(),
        );
    }
    Ok(())
}

/// `floats` float values as bytes, or an error when that does not fit in memory.
fn float_bytes(floats: usize) -> Result<usize, String> {
    floats
        .checked_mul(4)
        .ok_or_else(|| format!("{floats} floats do not fit in memory"))
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len` bytes at `ptr`, valid while the op waits (see `Send`).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl AsMut<[u8]> for Lent {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `as_ref`, and the only writer.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// Writes `message` into the caller's `err` buffer, cut to fit, NUL-terminated.
///
/// # Safety
///
/// `err` must be NULL or writable for `err_len` bytes.
unsafe fn report(err: *mut c_char, err_len: usize, message: &str) -> i32 {
    if !err.is_null() && err_len > 0 {
        let n = message.len().min(err_len - 1);
        // SAFETY: writable for `err_len` bytes by the caller's contract; `n < err_len`.
        unsafe {
            std::ptr::copy_nonoverlapping(message.as_ptr(), err.cast::<u8>(), n);
            *err.add(n) = 0;
        }
    }
    1
}

/// Runs `call`, turning an error or a panic into the caller's message.
///
/// # Safety
///
/// As [`report`].
unsafe fn guarded(
    err: *mut c_char,
    err_len: usize,
    call: impl FnOnce() -> Result<(), String>,
) -> i32 {
    let outcome = catch_unwind(AssertUnwindSafe(call))
        .unwrap_or_else(|_| Err("a vans TensorFlow op panicked (a bug in vans)".to_owned()));
    match outcome {
        Ok(()) => 0,
        // SAFETY: forwarded contract.
        Err(message) => unsafe { report(err, err_len, &message) },
    }
}

/// The keys of a call, checked and copied (8 bytes a key: small beside the values).
///
/// # Safety
///
/// `keys` readable for `n` values.
unsafe fn key_bytes(keys: *const u64, n: usize) -> Result<Bytes, String> {
    if n == 0 {
        return Ok(Bytes::new());
    }
    if keys.is_null() {
        return Err("keys is NULL".to_owned());
    }
    // SAFETY: readable for `n` values by the caller's contract.
    let keys = unsafe { std::slice::from_raw_parts(keys, n) };
    if keys.windows(2).any(|w| w[0] >= w[1]) {
        return Err("keys are not sorted and unique (as unsigned 64-bit)".to_owned());
    }
    Ok(ps::values::to_bytes(keys))
}

/// What every op does: push `vals` (`len` floats) when given, then pull into `out`
/// (`out_len` floats) when given, for `n` sorted unique keys, and wait.
///
/// # Safety
///
/// `worker` any handle (checked); `keys` readable for `n` values; `vals` readable for `len` floats and `out` writable for `out_len` floats (or
/// NULL: an error).
unsafe fn run(
    worker: u64,
    keys: *const u64,
    n: usize,
    vals: Option<(*const f32, usize)>,
    out: Option<(*mut f32, usize)>,
    cmd: i32,
) -> Result<(), String> {
    let worker = self::worker(worker)?;
    // SAFETY: the caller's contract.
    let keys = unsafe { key_bytes(keys, n) }?;
    if n == 0 {
        return Ok(());
    }
    let pairs = match vals {
        // SAFETY: the caller's contract.
        Some((vals, len)) => unsafe { pairs(keys, vals, len) }?,
        None => KvPairs {
            keys,
            ..KvPairs::default()
        },
    };
    blocking_thread()?;
    let lent = match out {
        Some((out, _)) if out.is_null() => return Err("out is NULL".to_owned()),
        Some((out, out_len)) => Some(Lent {
            ptr: out.cast(),
            len: float_bytes(out_len)?,
        }),
        None => None,
    };
    let done = match (vals.is_some(), lent) {
        (true, None) => worker.push(pairs, cmd).wait(),
        (false, Some(lent)) => worker.pull_into(pairs.keys, lent, cmd).wait().map(drop),
        (true, Some(lent)) => worker.push_pull_into(pairs, lent, cmd).wait().map(drop),
        (false, None) => Ok(()),
    };
    done.map_err(|e| e.to_string())
}

/// The pairs of a push: `keys`, and `len` floats at `vals`, copied (the op's input tensor may
/// be freed once the op returns, and a push's bytes can outlive the wait: a resend buffer or
/// a send to a failed server may still hold them).
///
/// # Safety
///
/// `vals` NULL or readable for `len` floats.
unsafe fn pairs(keys: Bytes, vals: *const f32, len: usize) -> Result<KvPairs, String> {
    if vals.is_null() {
        return Err("vals is NULL".to_owned());
    }
    // SAFETY: readable for `len` floats by the caller's contract.
    let vals = unsafe { std::slice::from_raw_parts(vals.cast::<u8>(), float_bytes(len)?) };
    Ok(KvPairs {
        keys,
        vals: Bytes::copy_from_slice(vals),
        lens: None,
    })
}

/// # Safety
///
/// As [`run`]; `err` as [`report`].
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn pull(
    worker: u64,
    keys: *const u64,
    n: usize,
    out: *mut f32,
    out_len: usize,
    cmd: i32,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: forwarded contract.
    unsafe {
        guarded(err, err_len, || {
            run(worker, keys, n, None, Some((out, out_len)), cmd)
        })
    }
}

/// # Safety
///
/// As [`run`]; `err` as [`report`].
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn push(
    worker: u64,
    keys: *const u64,
    n: usize,
    vals: *const f32,
    len: usize,
    cmd: i32,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: forwarded contract.
    unsafe {
        guarded(err, err_len, || {
            run(worker, keys, n, Some((vals, len)), None, cmd)
        })
    }
}

/// # Safety
///
/// As [`run`]; `err` as [`report`].
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn push_pull(
    worker: u64,
    keys: *const u64,
    n: usize,
    vals: *const f32,
    len: usize,
    out: *mut f32,
    out_len: usize,
    cmd: i32,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: forwarded contract.
    unsafe {
        guarded(err, err_len, || {
            run(
                worker,
                keys,
                n,
                Some((vals, len)),
                Some((out, out_len)),
                cmd,
            )
        })
    }
}
