//! `vans_server`: ps-lite's `KVServer` for C, with the built-in sum or a C request handler
//! that answers through a `vans_response` (values and lengths written straight into buffers
//! the response owns, which then go out without another copy).

use ps::handle::KvNode;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use bytes::Bytes;
use ps::optim::TableSpec;
use ps::{KvMeta, KvPairs, RequestHandler};
use van_core::DataType;

use crate::args;
use crate::error::{guard, Failure};
use crate::node::Node;

/// Most shards one server runs.
const MAX_SHARDS: usize = 1024;

/// One request as a C request handler sees it. Every pointer is valid only during the
/// handler call, aligned for its type, and never NULL when its count is non-zero.
#[repr(C)]
#[derive(Debug)]
pub struct Request {
    /// The worker's command (`cmd` of `vans_push` / `vans_pull`).
    pub cmd: c_int,
    /// The request carries values to store (a push or a push-pull).
    pub push: bool,
    /// The request wants values back (a pull or a push-pull).
    pub pull: bool,
    /// The requesting worker's node id.
    pub sender: c_int,
    /// The application id.
    pub app_id: c_int,
    /// The customer id.
    pub customer_id: c_int,
    /// The value type the worker declared (`VANS_F32`, ...); for a push it is always the
    /// server's own type (other pushes are refused before the handler runs).
    pub dtype: c_int,
    /// Which shard of the server this handler call belongs to (from 0).
    pub shard: usize,
    /// The keys, sorted ascending.
    pub keys: *const u64,
    /// Number of keys.
    pub num_keys: usize,
    /// The pushed values, all keys' back to back (empty for a pull).
    pub vals: *const c_void,
    /// Size of `vals` in bytes.
    pub vals_bytes: usize,
    /// Each key's number of values (`num_keys` entries), or NULL when every key has the same
    /// number (`vals_bytes / value size / num_keys`). On a pull (no values), the number of
    /// values the worker expects of each key, when it says (a pull into a buffer of as many
    /// values per key does), or NULL.
    pub lens: *const i32,
}

/// The answer a C request handler builds; opaque to C. Valid only during the handler call.
#[derive(Debug)]
pub struct Response {
    num_keys: usize,
    value_size: usize,
    vals: Option<Words>,
    /// `num_keys` `i32`s, once set.
    lens: Option<Words>,
    error: Option<String>,
}

/// `len` bytes in 8-byte words: aligned for every value type.
#[derive(Debug)]
struct Words {
    words: Vec<u64>,
    len: usize,
}

impl Words {
    fn zeroed(len: usize) -> Words {
        Words {
            words: vec![0; len.div_ceil(8)],
            len,
        }
    }

    /// The `i32`s these words hold (aligned, since words are).
    fn as_i32s(&self) -> &[i32] {
        &bytemuck::cast_slice(&self.words)[..self.len / 4]
    }

    fn copy_of(bytes: &[u8]) -> Words {
        let mut words = Words::zeroed(bytes.len());
        words.bytes_mut().copy_from_slice(bytes);
        words
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut bytemuck::cast_slice_mut(&mut self.words)[..len]
    }
}

impl AsRef<[u8]> for Words {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
}

impl Response {
    /// The answer's pairs for the request's `keys`, checking that lengths and values agree.
    fn into_pairs(self, keys: Bytes) -> Result<KvPairs, String> {
        let vals = self.vals.map_or_else(Bytes::new, Bytes::from_owner);
        let expected = match &self.lens {
            Some(lens) => lens.as_i32s().iter().try_fold(0usize, |total, len| {
                let len = usize::try_from(*len)
                    .map_err(|_| format!("negative length {len} in the response"))?;
                Ok::<usize, String>(total.saturating_add(len.saturating_mul(self.value_size)))
            })?,
            None if self.num_keys == 0 => 0,
            None => vals.len() - vals.len() % (self.num_keys * self.value_size),
        };
        if expected != vals.len() {
            return Err(match self.lens {
                Some(_) => format!(
                    "the response's lengths cover {expected} bytes of values but it holds {}",
                    vals.len()
                ),
                None => format!(
                    "the response's {} bytes of values do not divide evenly among {} keys \
                     (set per-key lengths with vans_response_lens)",
                    vals.len(),
                    self.num_keys
                ),
            });
        }
        if vals.is_empty() && self.lens.is_none() {
            return Ok(KvPairs::default());
        }
        Ok(KvPairs {
            keys,
            vals,
            lens: self.lens.map(Bytes::from_owner),
        })
    }
}

/// A C request handler: `handler(user_data, request, response)`, called for each request (or
/// each shard's part of one) on a vans I/O thread. Return 0 to answer with what `response`
/// holds (nothing, for a push); return non-zero to fail the request: the worker's call then
/// fails with `VANS_ERR_HANDLER_FAILED` and the text set with `vans_response_error` (or the
/// code).
///
/// Calls for one shard never overlap; calls for different shards may run at the same time on
/// different I/O threads (`VANS_IO_THREADS`), all with the same `user_data`. The handler must
/// not block, must not call blocking `vans_*` functions, and must not throw or `longjmp`.
pub type Handler = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        request: *const Request,
        response: *mut Response,
    ) -> c_int,
>;

/// A server application; opaque to C. It answers for as long as its node runs.
#[derive(Debug)]
pub struct Server {
    _server: ps::handle::Server,
}

/// The caller's handler and its `user_data`, shared by every shard.
#[derive(Clone, Copy)]
struct CHandler {
    handler: unsafe extern "C" fn(*mut c_void, *const Request, *mut Response) -> c_int,
    user_data: *mut c_void,
    dtype: DataType,
    value_size: usize,
    shard: usize,
}

// SAFETY: the pointer is only handed to the caller's handler; the documented contract of
// vans_server_new makes the caller responsible for using `user_data` from several threads.
unsafe impl Send for CHandler {}

impl RequestHandler for CHandler {
    fn handle(&mut self, meta: &KvMeta, request: KvPairs) -> Result<KvPairs, String> {
        // A panic here (a bug in vans) fails this request instead of the shard's task.
        catch_unwind(AssertUnwindSafe(|| self.answer(meta, request))).unwrap_or_else(|_| {
            Err("answering through the C request handler panicked (a bug in vans)".to_owned())
        })
    }
}

impl CHandler {
    /// The handler of shard `shard` (a method, so that closures capture the whole value).
    fn for_shard(self, shard: usize) -> CHandler {
        CHandler { shard, ..self }
    }

    /// Calls the C handler with `request` and builds its answer.
    fn answer(&self, meta: &KvMeta, request: KvPairs) -> Result<KvPairs, String> {
        if meta.push && meta.val_type != self.dtype {
            return Err(format!(
                "values of type {:?} pushed to a server of {:?}",
                meta.val_type, self.dtype
            ));
        }
        // Keys and lengths come borrowed when aligned (frames arrive 8-byte aligned), copied
        // otherwise; values likewise, into words aligned for every value type.
        let keys = request.keys().map_err(|e| e.to_string())?;
        let lens = request.lens().map_err(|e| e.to_string())?;
        let copied;
        let vals: *const u8 = if (request.vals.as_ptr() as usize) % self.value_size == 0 {
            request.vals.as_ptr()
        } else {
            copied = Words::copy_of(&request.vals);
            copied.words.as_ptr().cast()
        };
        let num_keys = keys.len();
        let c_request = Request {
            cmd: meta.cmd,
            push: meta.push,
            pull: meta.pull,
            sender: meta.sender,
            app_id: meta.app_id,
            customer_id: meta.customer_id,
            dtype: crate::data_type_code(meta.val_type),
            shard: self.shard,
            keys: keys.as_ptr(),
            num_keys,
            vals: vals.cast(),
            vals_bytes: request.vals.len(),
            lens: lens.as_deref().map_or(std::ptr::null(), <[i32]>::as_ptr),
        };
        let mut response = Response {
            num_keys,
            value_size: self.value_size,
            vals: None,
            lens: None,
            error: None,
        };
        // SAFETY: the caller's handler with its own user data (contract of vans_server_new);
        // the request's pointers are valid, aligned and of the stated lengths for the call,
        // and the response lives across it.
        let code = unsafe { (self.handler)(self.user_data, &c_request, &mut response) };
        if code != 0 {
            return Err(response
                .error
                .unwrap_or_else(|| format!("the C request handler returned {code}")));
        }
        response.into_pairs(request.keys.clone())
    }
}

/// Checks the arguments both server constructors take.
///
/// # Safety
///
/// `node` must be a live node or NULL.
unsafe fn server_args<'a>(
    node: *const Node,
    dtype: c_int,
    shards: usize,
    out: *mut *mut Server,
) -> Result<(&'a Node, DataType, usize), Failure> {
    // SAFETY: live or NULL by the caller's contract.
    let node = unsafe { args::handle(node, "node") }?;
    let dtype = crate::data_type(dtype)?;
    if shards > MAX_SHARDS {
        return Err(Failure::invalid(format!(
            "{shards} shards asked for; a server runs at most {MAX_SHARDS}"
        )));
    }
    args::check_out(out, "out")?;
    Ok((node, dtype, shards.max(1)))
}

fn store(out: *mut *mut Server, server: ps::handle::Server) -> crate::error::Outcome {
    // SAFETY: writable by the caller's contract.
    unsafe { args::write_handle(out, "out", Server { _server: server }) }
}

/// Starts a server application of type `dtype` for `app_id` / `customer_id` that sums pushed
/// values into its store and answers pulls from it (ps-lite's `KVServerDefaultHandle`: the
/// first push of a key sets it; a key never pushed pulls as zeros when the pull says how many
/// values it expects, and fails naming the key otherwise, `VANS_UNPUSHED_KEYS`). Its key range is cut
/// into `shards` shards (0 means 1), each owned by one task. Blocks until registered.
///
/// Ownership: the caller owns `*out` and releases it with `vans_server_free`; the server
/// answers for as long as the node runs, whether or not the handle is kept. Thread-safety:
/// any thread except a vans I/O thread.
///
/// # Safety
///
/// `node` must be a live node or NULL; `out` valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn vans_server_new_sum(
    node: *const Node,
    dtype: c_int,
    app_id: c_int,
    customer_id: c_int,
    shards: usize,
    out: *mut *mut Server,
) -> c_int {
    guard("vans_server_new_sum", || {
        // SAFETY: forwarded contract.
        let (node, dtype, shards) = unsafe { server_args(node, dtype, shards, out) }?;
        let server = node
            .handle
            .sum_server(dtype, app_id, customer_id, shards)
            .wait()?;
        store(out, server)
    })
}

/// Starts a server application for `app_id` / `customer_id` that holds an embedding table of
/// `float` rows (`VANS_F32` workers) with an optimizer applied on the server. `spec` is the
/// table's settings as `name=value` text separated by spaces or commas, e.g.
/// `"optimizer=adam dim=16 lr=0.001 init=normal std=0.01 seed=7"`: `dim` (values per key) is
/// required; `optimizer` is `sgd` (the default), `momentum`, `adagrad`, `adam` or `ftrl`
/// with their settings (`lr`, `momentum`, `nesterov`, `initial_accumulator`, `eps`, `beta1`,
/// `beta2`, `beta`, `l1`, `l2`); rows start on first touch from `init` (`zeros`, `uniform`
/// with `scale`, `normal` with `std`) seeded by `seed` and the key, the same on any server.
/// A push applies its gradients at once, or, with `VANS_ACCUMULATE_CMD`, adds them to each
/// row's pending sum that a pull with `VANS_APPLY_CMD` applies. A bad spec fails with
/// `VANS_ERR_INVALID_ARGUMENT` naming the setting. Key range cut into `shards` shards (0
/// means 1). Blocks until registered.
///
/// Ownership: `spec` is read before this returns; the caller owns `*out` and releases it
/// with `vans_server_free`. Thread-safety: any thread except a vans I/O thread.
///
/// # Safety
///
/// `node` must be a live node or NULL; `spec` NULL or a NUL-terminated string; `out` valid
/// for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn vans_server_new_table(
    node: *const Node,
    spec: *const c_char,
    app_id: c_int,
    customer_id: c_int,
    shards: usize,
    out: *mut *mut Server,
) -> c_int {
    guard("vans_server_new_table", || {
        // SAFETY: forwarded contract.
        let (node, _, shards) = unsafe { server_args(node, crate::VANS_F32, shards, out) }?;
        // SAFETY: NULL or NUL-terminated by the caller's contract.
        let spec: TableSpec = unsafe { args::text(spec, "spec") }?.parse()?;
        let server = node
            .handle
            .table_server(spec, app_id, customer_id, shards)
            .wait()?;
        store(out, server)
    })
}

/// Starts a server application of type `dtype` for `app_id` / `customer_id` whose requests
/// are answered by the C function `handler` (see `vans_handler`) with `user_data`, in
/// `shards` shards (0 means 1). Blocks until registered.
///
/// Ownership and lifetime: `user_data` is the caller's and must stay valid, and `handler`
/// callable, until the node has stopped (`vans_node_finalize` or `vans_node_stop` returned).
/// The caller owns `*out` and releases it with `vans_server_free`. Thread-safety: any thread
/// except a vans I/O thread; the handler's own rules are those of `vans_handler`.
///
/// # Safety
///
/// `node` must be a live node or NULL; `out` valid for writing one pointer; `handler` and
/// `user_data` as above.
#[no_mangle]
pub unsafe extern "C" fn vans_server_new(
    node: *const Node,
    dtype: c_int,
    app_id: c_int,
    customer_id: c_int,
    shards: usize,
    handler: Handler,
    user_data: *mut c_void,
    out: *mut *mut Server,
) -> c_int {
    guard("vans_server_new", || {
        // SAFETY: forwarded contract.
        let (node, dtype, shards) = unsafe { server_args(node, dtype, shards, out) }?;
        let handler = handler.ok_or_else(|| Failure::invalid("handler is NULL"))?;
        let value_size = dtype.size();
        let template = CHandler {
            handler,
            user_data,
            dtype,
            value_size,
            shard: 0,
        };
        let server = node
            .handle
            .server(dtype, app_id, customer_id, shards, move |shard| {
                template.for_shard(shard)
            })
            .wait()?;
        store(out, server)
    })
}

/// Releases a server handle; NULL is ignored. The server goes on answering until its node
/// stops.
///
/// # Safety
///
/// `server` must come from `vans_server_new*` and not be used after this call.
#[no_mangle]
pub unsafe extern "C" fn vans_server_free(server: *mut Server) {
    // SAFETY: forwarded contract.
    unsafe { args::free_handle("vans_server_free", server) }
}

/// Gives the response a value buffer of `vals_bytes` bytes (a whole number of values),
/// zero-filled and aligned for every value type, and stores its address in `*vals` for the
/// handler to fill. The values of all keys go back to back in key order; without
/// `vans_response_lens`, every key of the request gets `vals_bytes / value size / num_keys`
/// values. Calling it again replaces the buffer.
///
/// Ownership and lifetime: the buffer belongs to the response and goes to the worker without
/// a copy; write it only until the handler returns. Thread-safety: only inside the handler
/// call that received `response`.
///
/// # Safety
///
/// `response` must be the one passed to the running handler, or NULL; `vals` writable.
#[no_mangle]
pub unsafe extern "C" fn vans_response_values(
    response: *mut Response,
    vals_bytes: usize,
    vals: *mut *mut c_void,
) -> c_int {
    guard("vans_response_values", || {
        // SAFETY: the running handler's response or NULL, by the caller's contract.
        let response = unsafe { args::handle_mut(response, "response") }?;
        args::check_out(vals, "vals")?;
        if vals_bytes % response.value_size != 0 || vals_bytes > isize::MAX as usize {
            return Err(Failure::invalid(format!(
                "vals_bytes {vals_bytes} is not a whole number of {}-byte values",
                response.value_size
            )));
        }
        let buffer = response.vals.insert(Words::zeroed(vals_bytes));
        let address = buffer.words.as_mut_ptr().cast::<c_void>();
        // SAFETY: checked non-null; writable by contract.
        unsafe { args::write_out(vals, "vals", address) }
    })
}

/// Gives the response per-key lengths: an array of the request's `num_keys` `int32_t`,
/// zero-filled, whose address is stored in `*lens` for the handler to fill with each key's
/// number of values. They must add up to the values set with `vans_response_values`.
///
/// Ownership and lifetime: the array belongs to the response; write it only until the
/// handler returns. Thread-safety: only inside the handler call that received `response`.
///
/// # Safety
///
/// `response` must be the one passed to the running handler, or NULL; `lens` writable.
#[no_mangle]
pub unsafe extern "C" fn vans_response_lens(response: *mut Response, lens: *mut *mut i32) -> c_int {
    guard("vans_response_lens", || {
        // SAFETY: the running handler's response or NULL, by the caller's contract.
        let response = unsafe { args::handle_mut(response, "response") }?;
        args::check_out(lens, "lens")?;
        let num_keys = response.num_keys;
        let array = response.lens.insert(Words::zeroed(num_keys * 4));
        let address = array.words.as_mut_ptr().cast::<i32>();
        // SAFETY: checked non-null; writable by contract.
        unsafe { args::write_out(lens, "lens", address) }
    })
}

/// Sets the text the worker sees when the handler fails the request (returns non-zero).
///
/// Ownership: `message` is copied. Thread-safety: only inside the handler call that received
/// `response`.
///
/// # Safety
///
/// `response` must be the one passed to the running handler, or NULL; `message` a
/// NUL-terminated string or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_response_error(
    response: *mut Response,
    message: *const c_char,
) -> c_int {
    guard("vans_response_error", || {
        // SAFETY: the running handler's response or NULL, by the caller's contract.
        let response = unsafe { args::handle_mut(response, "response") }?;
        // SAFETY: NUL-terminated or NULL by the caller's contract.
        let message = unsafe { args::text(message, "message") }?;
        response.error = Some(message.to_owned());
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_values_and_lens_go_out_without_a_copy() {
        let mut response = Response {
            num_keys: 2,
            value_size: 4,
            vals: None,
            lens: None,
            error: None,
        };
        let mut vals: *mut c_void = std::ptr::null_mut();
        let mut lens: *mut i32 = std::ptr::null_mut();
        // SAFETY: a live response and out-pointers, as in a handler call.
        unsafe {
            assert_eq!(vans_response_values(&mut response, 12, &mut vals), 0);
            assert_eq!(vans_response_lens(&mut response, &mut lens), 0);
            vals.cast::<f32>().write(1.0);
            lens.write(1);
            lens.add(1).write(2);
        }
        let keys = Bytes::from_static(&[0; 16]);
        let pairs = response.into_pairs(keys).unwrap();
        assert_eq!(pairs.vals.as_ptr(), vals.cast::<u8>().cast_const());
        let sent = pairs.lens.unwrap();
        assert_eq!(sent.as_ptr(), lens.cast::<u8>().cast_const());
        assert_eq!(&sent[..], bytemuck::cast_slice::<i32, u8>(&[1, 2]));
        assert_eq!(&pairs.vals[..4], &1.0f32.to_ne_bytes());
    }

    #[test]
    fn response_lens_must_cover_the_values() {
        let mut response = Response {
            num_keys: 2,
            value_size: 4,
            vals: None,
            lens: None,
            error: None,
        };
        let mut vals: *mut c_void = std::ptr::null_mut();
        let mut lens: *mut i32 = std::ptr::null_mut();
        // SAFETY: as above.
        unsafe {
            assert_eq!(vans_response_values(&mut response, 8, &mut vals), 0);
            assert_eq!(vans_response_lens(&mut response, &mut lens), 0);
            lens.write(1);
            lens.add(1).write(2);
        }
        let error = response.into_pairs(Bytes::new()).unwrap_err();
        assert!(error.contains("cover 12 bytes"), "{error}");
    }
}
