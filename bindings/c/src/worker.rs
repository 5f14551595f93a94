//! `vans_worker`: ps-lite's `KVWorker` for C. Push, pull and push-pull with caller-owned
//! buffers, answered either through a request id and `vans_wait` or through a completion
//! callback.
//!
//! Pushed values are not copied: the caller's buffer is wrapped as `bytes::Bytes` (through an
//! owner that borrows the pointer) and goes to the vans as it is. The request completes only
//! once every reference to that buffer is gone, so after `vans_wait` returns or the callback
//! runs, nothing in the library reads it any more. Keys and lengths are copied when the
//! request is made (8 and 4 bytes per key), so their arrays may be reused at once. Pulled
//! values are copied once, from the received frame into the caller's buffer.

use ps::handle::KvNode;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use node::handle::Call;
use ps::{KvPairs, NodeError, Op};
use tokio::sync::oneshot;

use crate::args;
use crate::buffers::{lend, pairs_in, Output, UserData};
use crate::error::{
    guard, set_last_error, Failure, Outcome, VANS_ERR_PANIC, VANS_ERR_UNKNOWN_REQUEST, VANS_OK,
};
use crate::node::Node;

/// Requests one worker keeps for `vans_wait` at once; more fail until some are waited for.
const MAX_WAITABLE: usize = 1 << 16;

/// A completion callback: `done(user_data, request_id, status)`, run once on a vans I/O thread
/// when the request has completed. `status` is `VANS_OK` or a `VANS_ERR_*` code; on failure
/// `vans_last_error()` called inside the callback describes it. The callback must return
/// quickly and must not block, call a blocking `vans_*` function, throw or `longjmp`.
pub type Callback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, request_id: i64, status: c_int)>;

/// A worker application pushing and pulling values of one type; opaque to C. Thread-safe.
#[derive(Debug)]
pub struct Worker {
    kv: ps::handle::Worker,
    requests: Arc<Requests>,
}

/// The worker's request ids, and the completions kept for `vans_wait`.
#[derive(Debug, Default)]
struct Requests {
    next_id: AtomicI64,
    waitable: Mutex<HashMap<i64, Arc<Completion>>>,
}

/// How a request ended, once it has.
#[derive(Debug, Default)]
struct Completion {
    status: Mutex<Option<(c_int, String)>>,
    done: Condvar,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; a poisoned one still holds consistent data.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Completion {
    fn finish(&self, status: c_int, message: String) {
        *lock(&self.status) = Some((status, message));
        self.done.notify_all();
    }
}

/// How a request's end is reported.
enum Notify {
    /// To `vans_wait`, through the completion kept in the worker's table.
    Wait(Arc<Completion>),
    /// To the caller's callback, with its user data.
    Callback(unsafe extern "C" fn(*mut c_void, i64, c_int), UserData),
}

impl Worker {
    /// Hands out a request id, keeping a completion for `vans_wait` unless a callback will
    /// report instead.
    fn register(&self, done: Callback, user_data: *mut c_void) -> Result<(i64, Notify), Failure> {
        let id = self.requests.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(done) = done {
            return Ok((id, Notify::Callback(done, UserData(user_data))));
        }
        let mut table = lock(&self.requests.waitable);
        if table.len() >= MAX_WAITABLE {
            return Err(Failure::invalid(format!(
                "{MAX_WAITABLE} requests of this worker are not waited for yet; call vans_wait \
                 on some first"
            )));
        }
        let completion = Arc::new(Completion::default());
        table.insert(id, Arc::clone(&completion));
        Ok((id, Notify::Wait(completion)))
    }

    /// Reports the end of request `id` through `notify`, once the result of `call` is in,
    /// `finish` has filled the caller's output, and no reference to its lent values is left.
    fn complete<T: Send + 'static>(
        &self,
        id: i64,
        call: Call<T>,
        lent: oneshot::Receiver<()>,
        finish: impl FnOnce(ps::Result<T>) -> Outcome + Send + 'static,
        notify: Notify,
    ) {
        self.kv.node().runtime().spawn(async move {
            let result = call.await;
            // Resolves (with an error) when the owner of the lent bytes is dropped.
            let _ = lent.await;
            let outcome = catch_unwind(AssertUnwindSafe(|| finish(result))).unwrap_or_else(|_| {
                Err(Failure {
                    code: VANS_ERR_PANIC,
                    message: format!("completing request {id} panicked (a bug in vans)"),
                })
            });
            let (status, message) = match outcome {
                Ok(()) => (VANS_OK, String::new()),
                Err(failure) => (failure.code, failure.message),
            };
            match notify {
                Notify::Wait(completion) => completion.finish(status, message),
                Notify::Callback(done, user_data) => {
                    if status != VANS_OK {
                        set_last_error(&message);
                    }
                    // SAFETY: the caller's callback with its own user data, as documented; it
                    // cannot unwind into Rust (an `extern "C"` function that unwinds aborts).
                    unsafe { done(user_data.0, id, status) };
                }
            }
        });
    }

    /// Issues one request: registers it, builds it with `start` and reports its end.
    fn issue<T: Send + 'static>(
        &self,
        start: impl FnOnce(&ps::handle::Worker) -> Result<(Call<T>, oneshot::Receiver<()>), Failure>,
        finish: impl FnOnce(ps::Result<T>) -> Outcome + Send + 'static,
        done: Callback,
        user_data: *mut c_void,
        request_id: *mut i64,
    ) -> Outcome {
        if done.is_none() {
            args::check_out(request_id, "request_id (needed without a callback)")?;
        }
        let (id, notify) = self.register(done, user_data)?;
        let (call, lent) = match start(&self.kv) {
            Ok(started) => started,
            Err(failure) => {
                lock(&self.requests.waitable).remove(&id);
                return Err(failure);
            }
        };
        if !request_id.is_null() {
            // SAFETY: non-null, and writable by the caller's contract.
            unsafe { request_id.write(id) };
        }
        self.complete(id, call, lent, finish, notify);
        Ok(())
    }

    fn check_values(&self, vals_bytes: usize) -> Outcome {
        if vals_bytes % self.kv.dtype().size() != 0 {
            return Err(Failure::invalid(format!(
                "vals_bytes {vals_bytes} is not a multiple of the value size {}",
                self.kv.dtype().size()
            )));
        }
        Ok(())
    }
}

/// Creates a worker application pushing and pulling values of type `dtype` (`VANS_F32`,
/// `VANS_F64`, `VANS_I32`, `VANS_I64`, `VANS_U8`, `VANS_U64`) for application `app_id`,
/// customer `customer_id` (ps-lite's `KVWorker<T>(app_id, customer_id)`); servers must use
/// the same ids and type. Blocks until registered.
///
/// Ownership: the caller owns `*out` and releases it with `vans_worker_free`; the worker
/// keeps its node running. Thread-safety: any thread except a vans I/O thread.
///
/// # Safety
///
/// `node` must be a live node or NULL; `out` valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn vans_worker_new(
    node: *const Node,
    dtype: c_int,
    app_id: c_int,
    customer_id: c_int,
    out: *mut *mut Worker,
) -> c_int {
    guard("vans_worker_new", || {
        // SAFETY: live or NULL by the caller's contract.
        let node = unsafe { args::handle(node, "node") }?;
        let dtype = crate::data_type(dtype)?;
        args::check_out(out, "out")?;
        let kv = node.handle.worker(dtype, app_id, customer_id).wait()?;
        let worker = Worker {
            kv,
            requests: Arc::default(),
        };
        // SAFETY: writable by the caller's contract.
        unsafe { args::write_handle(out, "out", worker) }
    })
}

/// Releases a worker; NULL is ignored. Requests in flight are not cancelled: their callbacks
/// still run, and their buffers must stay valid until they complete, which the caller can no
/// longer wait for, so wait for every request first.
///
/// # Safety
///
/// `worker` must come from `vans_worker_new` and not be used after this call (nor during it).
#[no_mangle]
pub unsafe extern "C" fn vans_worker_free(worker: *mut Worker) {
    // SAFETY: forwarded contract.
    unsafe { args::free_handle("vans_worker_free", worker) }
}

/// Pushes values (ps-lite's `ZPush`): `num_keys` keys, sorted ascending, and their values,
/// `vals_bytes` bytes of the worker's value type, back to back in key order; `lens` (or NULL
/// when every key has the same number of values) gives each key's number of values. `cmd` is
/// passed to the servers' handlers.
///
/// Asynchronous: returns once the request is on its way. Either pass `done` (then the
/// callback reports the end; `request_id`, if not NULL, gets the id it will be called with)
/// or pass `done = NULL` and a `request_id` to wait for with `vans_wait` (exactly once).
///
/// Ownership and lifetime: `keys` and `lens` are copied before this returns. `vals` is NOT
/// copied: it must stay valid and unmodified until the request has completed (`vans_wait`
/// returned or `done` ran), whatever the outcome. Thread-safety: any thread; any number of
/// requests may be in flight.
///
/// # Safety
///
/// `worker` must be a live worker or NULL; `keys` readable for `num_keys` `uint64_t`; `vals`
/// readable for `vals_bytes` bytes as above; `lens` NULL or readable for `num_keys`
/// `int32_t`; `request_id` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vans_push(
    worker: *const Worker,
    keys: *const u64,
    num_keys: usize,
    vals: *const c_void,
    vals_bytes: usize,
    lens: *const i32,
    cmd: c_int,
    done: Callback,
    user_data: *mut c_void,
    request_id: *mut i64,
) -> c_int {
    guard("vans_push", || {
        // SAFETY: live or NULL by the caller's contract.
        let worker = unsafe { args::handle(worker, "worker") }?;
        worker.check_values(vals_bytes)?;
        // SAFETY: readable for `num_keys` elements by the caller's contract.
        let pairs = unsafe { pairs_in(keys, num_keys, lens) }?;
        worker.issue(
            |kv| {
                let (vals, lent) = lend(vals, vals_bytes, "vals")?;
                Ok((kv.push(KvPairs { vals, ..pairs }, cmd), lent))
            },
            |result| Ok(result?),
            done,
            user_data,
            request_id,
        )
    })
}

/// Pulls the values of `num_keys` sorted keys into the caller's buffer (ps-lite's `ZPull`):
/// `vals` must hold exactly the pulled values, `vals_bytes` bytes (a request whose answer has
/// another size fails with `VANS_ERR_INVALID_ARGUMENT` naming both sizes, leaving `vals`
/// untouched). `lens`, if not NULL, receives each key's number of values (`num_keys`
/// entries). With `lens` NULL, `vals` holds the same number of values for every key and the
/// pull says so: a summing server answers a key no one pushed with that many zeros
/// (`VANS_UNPUSHED_KEYS`); with `lens`, such a key fails the pull with
/// `VANS_ERR_HANDLER_FAILED` naming it. Completion as for `vans_push`.
///
/// Ownership and lifetime: `keys` is copied before this returns. `vals` and `lens` are
/// written by an I/O thread before the request completes: they must stay valid, and the
/// caller must not access them, until the request has completed. Thread-safety: any thread.
///
/// # Safety
///
/// `worker` must be a live worker or NULL; `keys` readable for `num_keys` `uint64_t`; `vals`
/// writable for `vals_bytes` bytes and `lens` NULL or writable for `num_keys` `int32_t`, as
/// above; `request_id` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vans_pull(
    worker: *const Worker,
    keys: *const u64,
    num_keys: usize,
    vals: *mut c_void,
    vals_bytes: usize,
    lens: *mut i32,
    cmd: c_int,
    done: Callback,
    user_data: *mut c_void,
    request_id: *mut i64,
) -> c_int {
    guard("vans_pull", || {
        // SAFETY: live or NULL by the caller's contract.
        let worker = unsafe { args::handle(worker, "worker") }?;
        let value_size = worker.kv.dtype().size();
        let output = Output::new(vals, vals_bytes, lens, num_keys, value_size)?;
        // SAFETY: readable for `num_keys` elements by the caller's contract.
        let mut pairs = unsafe { pairs_in(keys, num_keys, std::ptr::null()) }?;
        pairs.lens = output.expected_lens(value_size);
        worker.issue(
            |kv| {
                let (_, nothing_lent) = lend(std::ptr::null(), 0, "vals")?;
                Ok((kv.request(Op::Pull, pairs, cmd), nothing_lent))
            },
            move |result| output.fill(&result?, value_size),
            done,
            user_data,
            request_id,
        )
    })
}

/// Pushes values and pulls the updated ones in one round trip (ps-lite's `ZPushPull`): the
/// push arguments of `vans_push` (`vals`, `vals_bytes`, `lens`) and the pull arguments of
/// `vans_pull` (`out_vals`, `out_bytes`, `out_lens`). Completion as for `vans_push`.
///
/// Ownership and lifetime: `keys` and `lens` are copied; `vals` must stay valid and
/// unmodified, and `out_vals` / `out_lens` valid and untouched, until the request has
/// completed. Thread-safety: any thread.
///
/// # Safety
///
/// As `vans_push` for the push arguments and `vans_pull` for the output arguments.
#[no_mangle]
pub unsafe extern "C" fn vans_push_pull(
    worker: *const Worker,
    keys: *const u64,
    num_keys: usize,
    vals: *const c_void,
    vals_bytes: usize,
    lens: *const i32,
    out_vals: *mut c_void,
    out_bytes: usize,
    out_lens: *mut i32,
    cmd: c_int,
    done: Callback,
    user_data: *mut c_void,
    request_id: *mut i64,
) -> c_int {
    guard("vans_push_pull", || {
        // SAFETY: live or NULL by the caller's contract.
        let worker = unsafe { args::handle(worker, "worker") }?;
        worker.check_values(vals_bytes)?;
        let value_size = worker.kv.dtype().size();
        let output = Output::new(out_vals, out_bytes, out_lens, num_keys, value_size)?;
        // SAFETY: readable for `num_keys` elements by the caller's contract.
        let pairs = unsafe { pairs_in(keys, num_keys, lens) }?;
        worker.issue(
            |kv| {
                let (vals, lent) = lend(vals, vals_bytes, "vals")?;
                Ok((kv.push_pull(KvPairs { vals, ..pairs }, cmd), lent))
            },
            move |result| output.fill(&result?, value_size),
            done,
            user_data,
            request_id,
        )
    })
}

/// Waits for the request `request_id` of this worker (issued without a callback) and returns
/// its status (ps-lite's `Wait`). Afterwards its buffers are the caller's again and the id is
/// forgotten (waiting again is `VANS_ERR_UNKNOWN_REQUEST`).
///
/// Thread-safety: any thread except a vans I/O thread (a callback must not wait:
/// `VANS_ERR_INVALID_ARGUMENT`); several threads may wait for different requests at once.
///
/// # Safety
///
/// `worker` must be a live worker or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_wait(worker: *const Worker, request_id: i64) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { wait(worker, request_id, None, "vans_wait") }
}

/// Like `vans_wait`, giving up after `timeout_ms` milliseconds with `VANS_ERR_TIMEOUT`; the
/// request goes on, keeps its buffers, and can be waited for again.
///
/// # Safety
///
/// `worker` must be a live worker or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_wait_timeout(
    worker: *const Worker,
    request_id: i64,
    timeout_ms: u64,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        wait(
            worker,
            request_id,
            Some(Duration::from_millis(timeout_ms)),
            "vans_wait_timeout",
        )
    }
}

/// # Safety
///
/// `worker` must be a live worker or NULL.
unsafe fn wait(
    worker: *const Worker,
    request_id: i64,
    timeout: Option<Duration>,
    name: &str,
) -> c_int {
    guard(name, || {
        // SAFETY: live or NULL by the caller's contract.
        let worker = unsafe { args::handle(worker, "worker") }?;
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(Failure::invalid(format!(
                "{name} was called on a vans I/O thread (from a callback?), where blocking \
                 would stall the very requests it waits for"
            )));
        }
        let completion = lock(&worker.requests.waitable)
            .get(&request_id)
            .cloned()
            .ok_or_else(|| Failure {
                code: VANS_ERR_UNKNOWN_REQUEST,
                message: format!(
                    "unknown request id {request_id}: never issued by this worker, already \
                     waited for, or issued with a callback"
                ),
            })?;
        let status = lock(&completion.status);
        let status = match timeout {
            None => completion
                .done
                .wait_while(status, |status| status.is_none())
                .unwrap_or_else(PoisonError::into_inner),
            Some(timeout) => {
                let (status, _) = completion
                    .done
                    .wait_timeout_while(status, timeout, |status| status.is_none())
                    .unwrap_or_else(PoisonError::into_inner);
                status
            }
        };
        let Some((code, message)) = status.clone() else {
            return Err(NodeError::Timeout {
                waited: timeout.unwrap_or_default(),
            }
            .into());
        };
        drop(status);
        lock(&worker.requests.waitable).remove(&request_id);
        match code {
            VANS_OK => Ok(()),
            code => Err(Failure { code, message }),
        }
    })
}
