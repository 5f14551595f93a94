//! # vans-c: the C ABI of vans (`libvans.so`, `libvans.a`, `include/vans.h`)
//!
//! A thin layer over [`ps::handle`] and `rendezvous::handle`: opaque handles that own the
//! Rust handles, `int` status codes with a thread-local message, and C callbacks. No logic
//! lives here that Rust callers do not also get; what this crate adds is checking what C
//! passes and keeping panics out of C.
//!
//! - [`error`]: status codes, the guard every entry point runs in;
//! - `args`: checks of pointers, lengths, alignment and strings from the caller;
//! - `buffers`: caller memory lent without a copy (values, tensors), copied in (keys,
//!   lengths) or filled (pulled values), and `user_data` carried to callbacks;
//! - [`config`]: `vans_config`, a node's configuration as `DMLC_*`-named key/value pairs;
//! - [`node`]: `vans_node`: start from the environment or a config, queries, barrier, stop;
//! - [`worker`]: `vans_worker`: push, pull, push-pull with caller buffers, wait or callback;
//! - [`server`]: `vans_server`: the built-in sum or a C request handler, and its response;
//! - [`rendezvous`]: `vans_rendezvous` send and receive, and `vans_buffer`.
//! - [`collective`]: `vans_collective`: all-reduce, broadcast and barrier among the workers,
//!   in place on caller arrays, with elastic generations (`vans_collective_settle`).
//!
//! Conventions, valid for every function unless its documentation says otherwise:
//!
//! - Functions return `VANS_OK` (0) or a negative `VANS_ERR_*` code; after a failure,
//!   `vans_last_error()` describes it on the calling thread.
//! - Handles are created by `vans_*_new` / `vans_*_start` and released by the matching
//!   `vans_*_free`; passing NULL where a handle is expected is `VANS_ERR_INVALID_ARGUMENT`.
//! - Handles are thread-safe: any thread may call any function on them concurrently, except
//!   that a `*_free` must not race with other calls on the same handle.
//! - Callbacks run on one of the node's I/O threads: they must return quickly, must not block
//!   (no blocking `vans_*` call, no waiting on a lock held by a thread that waits on vans), and
//!   must not throw C++ exceptions or `longjmp` out.

// In the order of the header: errors first, then configuration, nodes, workers, servers and
// the rendezvous, collectives (cbindgen follows the declarations; blank lines keep rustfmt from sorting).
pub mod error;

mod args;

mod buffers;

pub mod config;

pub mod node;

pub mod worker;

pub mod server;

pub mod rendezvous;

pub mod collective;

use std::ffi::{c_char, c_int};

pub use collective::Collective;
pub use config::Config;
pub use error::*;
pub use node::Node;
pub use rendezvous::{Buffer, Rendezvous};
pub use server::{Request, Response, Server};
pub use worker::Worker;

/// Value type `int32_t` (ps-lite's `INT32`).
pub const VANS_I32: c_int = 3;
/// Value type `int64_t` (ps-lite's `INT64`).
pub const VANS_I64: c_int = 4;
/// Value type `uint8_t` (ps-lite's `UINT8`).
pub const VANS_U8: c_int = 5;
/// Value type `uint64_t` (ps-lite's `UINT64`).
pub const VANS_U64: c_int = 8;
/// Value type `float` (ps-lite's `FLOAT`).
pub const VANS_F32: c_int = 9;
/// Value type `double` (ps-lite's `DOUBLE`).
pub const VANS_F64: c_int = 10;

/// Role of a server node (ps-lite's `Node::SERVER`).
pub const VANS_ROLE_SERVER: c_int = 0;
/// Role of a worker node (ps-lite's `Node::WORKER`).
pub const VANS_ROLE_WORKER: c_int = 1;
/// Role of the scheduler (ps-lite's `Node::SCHEDULER`).
pub const VANS_ROLE_SCHEDULER: c_int = 2;

/// Barrier group of the scheduler (ps-lite's `kScheduler`).
pub const VANS_SCHEDULER: c_int = 1;
/// Barrier group of every server (ps-lite's `kServerGroup`).
pub const VANS_SERVER_GROUP: c_int = 2;
/// Barrier group of every worker (ps-lite's `kWorkerGroup`).
pub const VANS_WORKER_GROUP: c_int = 4;
/// Barrier group of every node.
pub const VANS_ALL_GROUPS: c_int = 7;

/// `cmd` of a push to a table server (`vans_server_new_table`) that adds each row's gradient
/// to its pending sum without applying it (the first phase of a synchronous step).
pub const VANS_ACCUMULATE_CMD: c_int = 0x4143_434D;
/// `cmd` of a pull from a table server that applies each row's pending gradient sum with
/// the table's optimizer, then answers the rows (the second phase of a synchronous step).
pub const VANS_APPLY_CMD: c_int = 0x4150_504C;

/// Rendezvous protocol where the receiver asks the producer (TensorFlow's `grpc+seastar`).
pub const VANS_RENDEZVOUS_PULL: c_int = 0;
/// Rendezvous protocol where the producer delivers to the receiver (StarServer's `star_server`).
pub const VANS_RENDEZVOUS_PUSH: c_int = 1;

/// Reduction of `vans_allreduce`: the sum.
pub const VANS_OP_SUM: c_int = 0;
/// Reduction of `vans_allreduce`: the sum divided by the number of ranks (integers:
/// truncated toward zero).
pub const VANS_OP_MEAN: c_int = 1;
/// Reduction of `vans_allreduce`: the smallest value.
pub const VANS_OP_MIN: c_int = 2;
/// Reduction of `vans_allreduce`: the largest value.
pub const VANS_OP_MAX: c_int = 3;

/// The message of the last call that failed on the calling thread, or `""` if none has.
///
/// Ownership: borrowed from the library; do not free it. Lifetime: valid until the next
/// `vans_*` call on the same thread (copy it to keep it). Thread-safety: each thread has its
/// own message; inside a completion callback it is the message of that completion.
#[no_mangle]
pub extern "C" fn vans_last_error() -> *const c_char {
    error::guard_value("vans_last_error", c"".as_ptr(), error::last_error_ptr)
}

/// The name of a status code, e.g. `"VANS_ERR_TIMEOUT"` for `VANS_ERR_TIMEOUT`, or
/// `"VANS_ERR_UNKNOWN_STATUS"`.
///
/// Ownership: a static string; never free it. Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn vans_status_name(status: c_int) -> *const c_char {
    error::guard_value("vans_status_name", c"".as_ptr(), || {
        error::status_name(status).as_ptr()
    })
}

/// The library's version, e.g. `"0.1.0"`.
///
/// Ownership: a static string; never free it. Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn vans_version() -> *const c_char {
    const VERSION: &std::ffi::CStr = match std::ffi::CStr::from_bytes_with_nul(
        concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes(),
    ) {
        Ok(version) => version,
        Err(_) => c"unknown",
    };
    VERSION.as_ptr()
}

/// The value type of a `VANS_*` type code, if the library carries it.
pub(crate) fn data_type(code: c_int) -> Result<van_core::DataType, Failure> {
    let types = ps::handle::VALUE_TYPES;
    let dtype = u8::try_from(code)
        .ok()
        .and_then(van_core::DataType::from_code)
        .filter(|dtype| types.contains(dtype));
    dtype.ok_or_else(|| {
        let names: Vec<String> = types.iter().map(|t| c_name(*t)).collect();
        Failure::invalid(format!(
            "value type {code} is not one of {}",
            names.join(", ")
        ))
    })
}

/// The `VANS_*` code of a value type (its ps-lite number).
pub(crate) fn data_type_code(dtype: van_core::DataType) -> c_int {
    c_int::from(dtype.code())
}

/// The C name of a value type's code: `VANS_F32` for float32, … (`vans.h`).
fn c_name(dtype: van_core::DataType) -> String {
    format!("VANS_{dtype:?}").to_uppercase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use van_core::DataType;

    #[test]
    fn type_codes_are_ps_lite_numbers() {
        for (code, dtype) in [
            (VANS_I32, DataType::I32),
            (VANS_I64, DataType::I64),
            (VANS_U8, DataType::U8),
            (VANS_U64, DataType::U64),
            (VANS_F32, DataType::F32),
            (VANS_F64, DataType::F64),
        ] {
            assert_eq!(data_type(code).ok(), Some(dtype));
            assert_eq!(data_type_code(dtype), code);
        }
        assert!(data_type(0).is_err()); // char: not a value type here
        assert!(data_type(-1).is_err());
        assert!(data_type(99).is_err());
    }
}
