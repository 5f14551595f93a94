//! `vans_rendezvous`: TensorFlow-style step-scoped tensor exchange for C
//! ([`RendezvousHandle`]), and `vans_buffer`, the library-owned bytes a receive hands out.

use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use bytes::Bytes;
use node::handle::Call;
use rendezvous::handle::RendezvousHandle;
use rendezvous::{cpu_device, create_key, Protocol};
use van_core::rendezvous::Received;

use crate::args;
use crate::buffers::{LentUntilRelease, UserData};
use crate::error::{guard, guard_value, report, set_last_error, Failure, VANS_ERR_PANIC, VANS_OK};
use crate::node::Node;
use crate::{VANS_RENDEZVOUS_PULL, VANS_RENDEZVOUS_PUSH};

/// Largest header `vans_rendezvous_send_with_header` takes: it describes a tensor, it is not
/// one (TensorFlow's shapes have at most 254 dimensions).
const MAX_HEADER_BYTES: usize = 64 << 10;

/// A node's rendezvous; opaque to C. Thread-safe.
#[derive(Debug)]
pub struct Rendezvous {
    handle: RendezvousHandle,
}

/// Bytes owned by the library (a received tensor); opaque to C. Read it with
/// `vans_buffer_data` / `vans_buffer_len`, release it with `vans_buffer_free`.
#[derive(Debug)]
pub struct Buffer {
    bytes: Bytes,
    header: Bytes,
}

impl From<Received> for Buffer {
    fn from(received: Received) -> Buffer {
        Buffer {
            bytes: received.value,
            header: received.header,
        }
    }
}

/// Called once when the library no longer needs a buffer lent to `vans_rendezvous_send`:
/// `release(user_data)`, on any thread, possibly before `vans_rendezvous_send` returns. It must
/// not block, call a blocking `vans_*` function, throw or `longjmp`.
pub type Release = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

/// A receive's completion callback: `done(user_data, status, value, is_dead)` on a vans I/O
/// thread (or, with `vans_rendezvous_recv_async_inline`, on the calling thread). On success `value` is the received tensor, owned by the callee (release it with
/// `vans_buffer_free`, on any thread, whenever); on failure it is NULL and `vans_last_error()`
/// inside the callback describes the failure. Same rules as every callback: return quickly,
/// no blocking, no throw or `longjmp`.
pub type RecvCallback = Option<
    unsafe extern "C" fn(user_data: *mut c_void, status: c_int, value: *mut Buffer, is_dead: bool),
>;

/// The step's key as text.
///
/// # Safety
///
/// `key` must be NULL or a NUL-terminated string.
unsafe fn key_text<'a>(key: *const c_char) -> Result<&'a str, Failure> {
    // SAFETY: forwarded contract.
    unsafe { args::text(key, "key") }
}

/// Starts the rendezvous of `node` with `protocol` (`VANS_RENDEZVOUS_PULL` or
/// `VANS_RENDEZVOUS_PUSH`; every task of the job must use the same), blocking until it is
/// registered.
///
/// Ownership: the caller owns `*out` and releases it with `vans_rendezvous_free`; it keeps
/// the node running. Thread-safety: any thread except a vans I/O thread.
///
/// # Safety
///
/// `node` must be a live node or NULL; `out` valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn vans_rendezvous_start(
    node: *const Node,
    protocol: c_int,
    out: *mut *mut Rendezvous,
) -> c_int {
    guard("vans_rendezvous_start", || {
        // SAFETY: live or NULL by the caller's contract.
        let node = unsafe { args::handle(node, "node") }?;
        let protocol = match protocol {
            VANS_RENDEZVOUS_PULL => Protocol::Pull,
            VANS_RENDEZVOUS_PUSH => Protocol::Push,
            other => {
                return Err(Failure::invalid(format!(
                    "protocol {other} is neither VANS_RENDEZVOUS_PULL nor VANS_RENDEZVOUS_PUSH"
                )))
            }
        };
        args::check_out(out, "out")?;
        let handle = RendezvousHandle::start(&node.handle, protocol).wait()?;
        // SAFETY: writable by the caller's contract.
        unsafe { args::write_handle(out, "out", Rendezvous { handle }) }
    })
}

/// Releases a rendezvous; NULL is ignored. When it is the node's last, every step ends:
/// pending receives fail.
///
/// # Safety
///
/// `rendezvous` must come from `vans_rendezvous_start` and not be used after this call.
#[no_mangle]
pub unsafe extern "C" fn vans_rendezvous_free(rendezvous: *mut Rendezvous) {
    // SAFETY: forwarded contract.
    unsafe { args::free_handle("vans_rendezvous_free", rendezvous) }
}

/// Writes the rendezvous key of tensor `name` sent by node `src_node` (incarnation
/// `src_incarnation`) to node `dst_node`, in frame `frame_id` and iteration `iter_id`, as
/// TensorFlow spells it with the nodes' CPU devices
/// (`/job:worker/replica:0/task:0/device:CPU:0;<incarnation hex>;/job:ps/...;name;0:0`), into
/// `out` (`capacity` bytes, NUL included). `*len` gets the key's length without the NUL, even
/// when `out` is too small (`VANS_ERR_INVALID_ARGUMENT`) or NULL with capacity 0 (a size query).
///
/// Ownership: `name` is read, `out` written, during the call only. Thread-safety: any thread.
///
/// # Safety
///
/// `name` must be a NUL-terminated string or NULL; `out` NULL or writable for `capacity`
/// bytes; `len` writable.
#[no_mangle]
pub unsafe extern "C" fn vans_rendezvous_key(
    src_node: c_int,
    src_incarnation: u64,
    dst_node: c_int,
    name: *const c_char,
    frame_id: u64,
    iter_id: u64,
    out: *mut c_char,
    capacity: usize,
    len: *mut usize,
) -> c_int {
    guard("vans_rendezvous_key", || {
        // SAFETY: NUL-terminated or NULL by the caller's contract.
        let name = unsafe { args::text(name, "name") }?;
        let device = |node: c_int, what: &str| {
            cpu_device(node).ok_or_else(|| {
                Failure::invalid(format!("{what} {node} is not a node id (1, 8, 9, 10, ...)"))
            })
        };
        let src = device(src_node, "src_node")?;
        let dst = device(dst_node, "dst_node")?;
        let key = create_key(&src, src_incarnation, &dst, name, (frame_id, iter_id));
        // SAFETY: writable by the caller's contract.
        unsafe { args::write_out(len, "len", key.len()) }?;
        if out.is_null() && capacity == 0 {
            return Ok(());
        }
        if capacity <= key.len() {
            return Err(Failure::invalid(format!(
                "the key needs {} bytes with its NUL but out holds {capacity}",
                key.len() + 1
            )));
        }
        args::check_array(out.cast::<u8>(), capacity, "out")?;
        // SAFETY: `out` is writable for `capacity` > key.len() bytes (checked above and the
        // caller's contract).
        unsafe {
            std::ptr::copy_nonoverlapping(key.as_ptr(), out.cast::<u8>(), key.len());
            out.add(key.len()).write(0);
        }
        Ok(())
    })
}

/// Makes `len` bytes at `data` available under `key` in step `step_id` (TensorFlow's
/// `Send`); never blocks. `is_dead` marks a tensor of an untaken branch. Fails on a
/// malformed key, a key whose source device is not this node, or an aborted step.
///
/// Ownership and lifetime: with `release` NULL the bytes are copied before this returns.
/// With `release` set they are not copied: they must stay valid and unmodified until
/// `release(release_user_data)` is called, exactly once, on any thread, in every case
/// (also when this call fails, and possibly before it returns). Thread-safety: any thread.
///
/// # Safety
///
/// `rendezvous` must be a live rendezvous or NULL; `key` a NUL-terminated string or NULL;
/// `data` readable for `len` bytes as above.
#[no_mangle]
pub unsafe extern "C" fn vans_rendezvous_send(
    rendezvous: *const Rendezvous,
    step_id: i64,
    key: *const c_char,
    data: *const c_void,
    len: usize,
    is_dead: bool,
    release: Release,
    release_user_data: *mut c_void,
) -> c_int {
    // SAFETY: forwarded contract; no header.
    unsafe {
        send(
            "vans_rendezvous_send",
            rendezvous,
            step_id,
            key,
            (std::ptr::null(), 0),
            (data, len, is_dead),
            release,
            release_user_data,
        )
    }
}

/// Like `vans_rendezvous_send`, with a header: `header_len` bytes at `header` (copied before
/// this returns; at most 64 KiB) that describe the tensor, such as its data type and shape.
/// The header reaches the receiver beside the tensor's bytes (`vans_buffer_header`), so
/// neither is copied into the other. Ownership of `data` and `release` as for
/// `vans_rendezvous_send`. Thread-safety: any thread.
///
/// # Safety
///
/// As `vans_rendezvous_send`; `header` readable for `header_len` bytes (NULL when 0).
#[no_mangle]
pub unsafe extern "C" fn vans_rendezvous_send_with_header(
    rendezvous: *const Rendezvous,
    step_id: i64,
    key: *const c_char,
    header: *const c_void,
    header_len: usize,
    data: *const c_void,
    len: usize,
    is_dead: bool,
    release: Release,
    release_user_data: *mut c_void,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        send(
            "vans_rendezvous_send_with_header",
            rendezvous,
            step_id,
            key,
            (header, header_len),
            (data, len, is_dead),
            release,
            release_user_data,
        )
    }
}

/// The sends: `header` (address and length) copied, `value` (data, length, dead flag) lent
/// or copied as `release` says.
///
/// # Safety
///
/// The contract of `vans_rendezvous_send_with_header`.
#[allow(clippy::too_many_arguments)]
unsafe fn send(
    name: &str,
    rendezvous: *const Rendezvous,
    step_id: i64,
    key: *const c_char,
    (header, header_len): (*const c_void, usize),
    (data, len, is_dead): (*const c_void, usize, bool),
    release: Release,
    release_user_data: *mut c_void,
) -> c_int {
    guard(name, || {
        // Taken first, so that `release` runs (when this owner drops) whatever fails below.
        let lent = release.map(|release| LentUntilRelease::new(release, release_user_data));
        // SAFETY: live or NULL by the caller's contract.
        let rendezvous = unsafe { args::handle(rendezvous, "rendezvous") }?;
        // SAFETY: NUL-terminated or NULL by the caller's contract.
        let key = unsafe { key_text(key) }?;
        if header_len > MAX_HEADER_BYTES {
            return Err(Failure::invalid(format!(
                "a header of {header_len} bytes is over the {MAX_HEADER_BYTES} allowed"
            )));
        }
        let header = match header_len {
            0 => Bytes::new(),
            // SAFETY: readable for `header_len` bytes by the caller's contract.
            _ => Bytes::copy_from_slice(unsafe {
                args::slice(header.cast::<u8>(), header_len, "header")
            }?),
        };
        let value = match lent {
            Some(lent) => lent.into_bytes(data, len, "data")?,
            // SAFETY: readable for `len` bytes by the caller's contract (NULL is refused).
            None => Bytes::copy_from_slice(unsafe { args::slice(data.cast::<u8>(), len, "data") }?),
        };
        let value = Received {
            value,
            is_dead,
            header,
        };
        Ok(rendezvous.handle.send_received(step_id, key, value)?)
    })
}

/// Starts receiving `key` in step `step_id`.
///
/// # Safety
///
/// `rendezvous` must be a live rendezvous or NULL; `key` a NUL-terminated string or NULL.
unsafe fn receive(
    rendezvous: *const Rendezvous,
    step_id: i64,
    key: *const c_char,
) -> Result<Call<Received>, Failure> {
    // SAFETY: live or NULL by the caller's contract.
    let rendezvous = unsafe { args::handle(rendezvous, "rendezvous") }?;
    // SAFETY: NUL-terminated or NULL by the caller's contract.
    let key = unsafe { key_text(key) }?;
    Ok(rendezvous.handle.recv(step_id, key))
}

/// Waits for `call`, up to `timeout_ms` milliseconds unless that is 0.
fn wait_for(mut call: Call<Received>, timeout_ms: u64) -> Result<Received, Failure> {
    Ok(match timeout_ms {
        0 => call.wait()?,
        ms => call.wait_timeout(Duration::from_millis(ms))?,
    })
}

/// Receives the tensor under `key` in step `step_id` (TensorFlow's `Recv`), blocking until it
/// arrives, the step is cleaned up or aborted (`VANS_ERR_RENDEZVOUS`), the node stops, or
/// `timeout_ms` milliseconds pass (0: no limit; `VANS_ERR_TIMEOUT`, and a value arriving
/// later is dropped). `*value` gets the bytes, `*is_dead` (if not NULL) the dead flag.
///
/// Ownership: the caller owns `*value` and releases it with `vans_buffer_free`; no copy was
/// made from the received frame. Thread-safety: any thread except a vans I/O thread.
///
/// # Safety
///
/// `rendezvous` must be a live rendezvous or NULL; `key` a NUL-terminated string or NULL;
/// `value` writable; `is_dead` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vans_rendezvous_recv(
    rendezvous: *const Rendezvous,
    step_id: i64,
    key: *const c_char,
    timeout_ms: u64,
    value: *mut *mut Buffer,
    is_dead: *mut bool,
) -> c_int {
    guard("vans_rendezvous_recv", || {
        args::check_out(value, "value")?;
        // SAFETY: forwarded contract.
        let received = wait_for(unsafe { receive(rendezvous, step_id, key) }?, timeout_ms)?;
        if !is_dead.is_null() {
            // SAFETY: non-null and writable by the caller's contract.
            unsafe { is_dead.write(received.is_dead) };
        }
        let buffer = Buffer::from(received);
        // SAFETY: writable by the caller's contract.
        unsafe { args::write_handle(value, "value", buffer) }
    })
}

/// Like `vans_rendezvous_recv`, copying the tensor into the caller's `buffer` of `capacity`
/// bytes. `*len` gets the tensor's size; when that exceeds `capacity` the call fails with
/// `VANS_ERR_INVALID_ARGUMENT` naming both sizes and the tensor is dropped.
///
/// Ownership: `buffer` is written during the call only. Thread-safety: any thread except a
/// vans I/O thread.
///
/// # Safety
///
/// `rendezvous` must be a live rendezvous or NULL; `key` a NUL-terminated string or NULL;
/// `buffer` NULL or writable for `capacity` bytes; `len` writable; `is_dead` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vans_rendezvous_recv_into(
    rendezvous: *const Rendezvous,
    step_id: i64,
    key: *const c_char,
    timeout_ms: u64,
    buffer: *mut c_void,
    capacity: usize,
    len: *mut usize,
    is_dead: *mut bool,
) -> c_int {
    guard("vans_rendezvous_recv_into", || {
        args::check_out(len, "len")?;
        if capacity > 0 {
            args::check_array(buffer.cast::<u8>(), capacity, "buffer")?;
        }
        // SAFETY: forwarded contract.
        let received = wait_for(unsafe { receive(rendezvous, step_id, key) }?, timeout_ms)?;
        let size = received.value.len();
        // SAFETY: checked non-null; writable by contract.
        unsafe { args::write_out(len, "len", size) }?;
        if !is_dead.is_null() {
            // SAFETY: non-null and writable by the caller's contract.
            unsafe { is_dead.write(received.is_dead) };
        }
        if size > capacity {
            return Err(Failure::invalid(format!(
                "the tensor under this key has {size} bytes but the buffer holds {capacity}"
            )));
        }
        if size > 0 {
            // SAFETY: `buffer` is non-null and writable for `capacity` >= `size` bytes
            // (checked above and the caller's contract).
            unsafe {
                std::ptr::copy_nonoverlapping(received.value.as_ptr(), buffer.cast::<u8>(), size)
            };
        }
        Ok(())
    })
}

/// Receives the tensor under `key` in step `step_id` without blocking (TensorFlow's
/// `RecvAsync`): `done` (see `vans_recv_callback`) runs once, on a vans I/O thread, when it
/// arrives or the receive fails. Returns an error (and never calls `done`) only when the
/// arguments are invalid.
///
/// Ownership: `user_data` is the caller's, handed back to `done`. Thread-safety: any thread,
/// callbacks included.
///
/// # Safety
///
/// `rendezvous` must be a live rendezvous or NULL; `key` a NUL-terminated string or NULL;
/// `done` and `user_data` as above.
#[no_mangle]
pub unsafe extern "C" fn vans_rendezvous_recv_async(
    rendezvous: *const Rendezvous,
    step_id: i64,
    key: *const c_char,
    done: RecvCallback,
    user_data: *mut c_void,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        recv_async(
            "vans_rendezvous_recv_async",
            rendezvous,
            step_id,
            key,
            false,
            done,
            user_data,
        )
    }
}

/// As `vans_rendezvous_recv_async`, except that a receive that ends at once (the tensor is
/// already there, as it mostly is with the push protocol, or the receive fails) runs `done`
/// on the calling thread before this returns, instead of on a vans thread. That saves a
/// thread switch per such receive, for callers that hold no lock `done` takes (TensorFlow's
/// `RecvAsync` callbacks may run inline). Returns an error (and never calls `done`) only when
/// the arguments are invalid.
///
/// Ownership: `user_data` is the caller's, handed back to `done`. Thread-safety: any thread,
/// callbacks included.
///
/// # Safety
///
/// `rendezvous` must be a live rendezvous or NULL; `key` a NUL-terminated string or NULL;
/// `done` and `user_data` as above.
#[no_mangle]
pub unsafe extern "C" fn vans_rendezvous_recv_async_inline(
    rendezvous: *const Rendezvous,
    step_id: i64,
    key: *const c_char,
    done: RecvCallback,
    user_data: *mut c_void,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        recv_async(
            "vans_rendezvous_recv_async_inline",
            rendezvous,
            step_id,
            key,
            true,
            done,
            user_data,
        )
    }
}

/// The body of both asynchronous receives (`name` is the entry point, for errors): checks
/// the arguments, then `done` once with the buffer or the error; on the calling thread only
/// when `inline`.
///
/// # Safety
///
/// As the entry points'.
unsafe fn recv_async(
    name: &'static str,
    rendezvous: *const Rendezvous,
    step_id: i64,
    key: *const c_char,
    inline: bool,
    done: RecvCallback,
    user_data: *mut c_void,
) -> c_int {
    guard(name, || {
        let done = done.ok_or_else(|| Failure::invalid("done is NULL"))?;
        // SAFETY: live or NULL by the caller's contract.
        let rendezvous = unsafe { args::handle(rendezvous, "rendezvous") }?;
        // SAFETY: NUL-terminated or NULL by the caller's contract.
        let key = unsafe { key_text(key) }?;
        start_recv(rendezvous, step_id, key, inline, done, user_data);
        Ok(())
    })
}

/// Starts the receive of checked arguments.
fn start_recv(
    rendezvous: &Rendezvous,
    step_id: i64,
    key: &str,
    inline: bool,
    done: unsafe extern "C" fn(*mut c_void, c_int, *mut Buffer, bool),
    user_data: *mut c_void,
) {
    let user_data = UserData(user_data);
    let done = move |result: node::Result<Received>| {
        let user_data = user_data;
        let outcome = catch_unwind(AssertUnwindSafe(|| match result {
            Ok(received) => {
                let is_dead = received.is_dead;
                let value = Box::into_raw(Box::new(Buffer::from(received)));
                (VANS_OK, value, is_dead)
            }
            Err(error) => (report(Err(error.into())), std::ptr::null_mut(), false),
        }));
        let (status, value, is_dead) = outcome.unwrap_or_else(|_| {
            set_last_error("completing a receive panicked (a bug in vans)");
            (VANS_ERR_PANIC, std::ptr::null_mut(), false)
        });
        // SAFETY: the caller's callback with its own user data (documented contract); an
        // `extern "C"` function cannot unwind into Rust.
        unsafe { done(user_data.0, status, value, is_dead) };
    };
    if inline {
        rendezvous.handle.recv_now_or_then(step_id, key, done);
    } else {
        rendezvous.handle.recv_then(step_id, key, done);
    }
}

/// Ends step `step_id` (TensorFlow's `Cleanup`): its pending receives fail with
/// `VANS_ERR_RENDEZVOUS`, its table goes. Thread-safety: any thread, callbacks included.
///
/// # Safety
///
/// `rendezvous` must be a live rendezvous or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_rendezvous_cleanup(
    rendezvous: *const Rendezvous,
    step_id: i64,
) -> c_int {
    guard("vans_rendezvous_cleanup", || {
        // SAFETY: live or NULL by the caller's contract.
        let rendezvous = unsafe { args::handle(rendezvous, "rendezvous") }?;
        rendezvous.handle.cleanup(step_id);
        Ok(())
    })
}

/// Exempts step `step_id` from the limits that end steps never cleaned up (10,000 live
/// steps, one hour), now or, if it is not live yet, once it is created: for a step that may
/// live as long as the task (TensorFlow's eager collectives run in one). Only
/// `vans_rendezvous_cleanup`, which also ends the pin, or the rendezvous' end, ends it.
/// Thread-safety: any thread.
///
/// # Safety
///
/// `rendezvous` must be a live rendezvous or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_rendezvous_pin(rendezvous: *const Rendezvous, step_id: i64) -> c_int {
    guard("vans_rendezvous_pin", || {
        // SAFETY: live or NULL by the caller's contract.
        let rendezvous = unsafe { args::handle(rendezvous, "rendezvous") }?;
        rendezvous.handle.pin(step_id);
        Ok(())
    })
}

/// The first byte of a library-owned buffer (NULL for a NULL buffer; any non-NULL address
/// for an empty one). Valid until `vans_buffer_free`. Thread-safety: any thread.
///
/// # Safety
///
/// `buffer` must be a live buffer or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_buffer_data(buffer: *const Buffer) -> *const c_void {
    guard_value("vans_buffer_data", std::ptr::null(), || {
        // SAFETY: live or NULL by the caller's contract.
        match unsafe { buffer.as_ref() } {
            Some(buffer) => buffer.bytes.as_ptr().cast(),
            None => {
                set_last_error("vans_buffer_data: buffer is NULL");
                std::ptr::null()
            }
        }
    })
}

/// The size in bytes of a library-owned buffer (0 for a NULL buffer). Thread-safety: any
/// thread.
///
/// # Safety
///
/// `buffer` must be a live buffer or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_buffer_len(buffer: *const Buffer) -> usize {
    guard_value("vans_buffer_len", 0, || {
        // SAFETY: live or NULL by the caller's contract.
        unsafe { buffer.as_ref() }.map_or(0, |buffer| buffer.bytes.len())
    })
}

/// The header the sender gave the tensor in `buffer` (`vans_rendezvous_send_with_header`):
/// its first byte, with its length in `*len` (0, and any non-NULL address, when it gave
/// none, or for a NULL buffer). Valid until `vans_buffer_free`. Thread-safety: any thread.
///
/// # Safety
///
/// `buffer` must be a live buffer or NULL; `len` writable or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_buffer_header(
    buffer: *const Buffer,
    len: *mut usize,
) -> *const c_void {
    guard_value("vans_buffer_header", std::ptr::null(), || {
        // SAFETY: live or NULL by the caller's contract.
        let header = unsafe { buffer.as_ref() }.map_or(&[][..], |buffer| &buffer.header[..]);
        if !len.is_null() {
            // SAFETY: writable by the caller's contract (checked non-NULL).
            unsafe { len.write(header.len()) };
        }
        header.as_ptr().cast()
    })
}

/// Releases a library-owned buffer; NULL is ignored. Thread-safety: any thread, once.
///
/// # Safety
///
/// `buffer` must come from the library and not be used after this call.
#[no_mangle]
pub unsafe extern "C" fn vans_buffer_free(buffer: *mut Buffer) {
    // SAFETY: forwarded contract.
    unsafe { args::free_handle("vans_buffer_free", buffer) }
}
