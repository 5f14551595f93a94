//! Status codes, the thread-local last-error message, and the guard every entry point runs
//! its body in (no panic crosses the boundary, every failure leaves a message).

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use ps::NodeError;

/// Success.
pub const VANS_OK: c_int = 0;
/// A null pointer, a bad length, a misaligned buffer, an unsorted key list, a value type the
/// library does not carry, an output buffer of the wrong size, or a call made where it would
/// block an I/O thread. `vans_last_error()` names the argument.
pub const VANS_ERR_INVALID_ARGUMENT: c_int = -1;
/// A node of the cluster died or its connection broke; the message names the node (ps-lite
/// numbering) and its role.
pub const VANS_ERR_NODE_FAILED: c_int = -2;
/// A wait with a time limit ran out; the operation goes on and can be waited for again when
/// the function says so.
pub const VANS_ERR_TIMEOUT: c_int = -3;
/// The node has stopped (finalized, stopped, or its scheduler is gone).
pub const VANS_ERR_STOPPED: c_int = -4;
/// The cluster did not form before the bootstrap deadline; the message says which roles joined.
pub const VANS_ERR_BOOTSTRAP: c_int = -5;
/// The configuration is invalid (a `DMLC_*` variable, `TF_CONFIG`, an endpoint map); the
/// message names the variable and what was expected.
pub const VANS_ERR_CONFIG: c_int = -6;
/// A rendezvous operation failed: aborted or cleaned-up step, bad key, remote failure.
pub const VANS_ERR_RENDEZVOUS: c_int = -7;
/// The library panicked (a bug in vans); the message says where. The call did nothing else.
pub const VANS_ERR_PANIC: c_int = -8;
/// A transport (van) failed: bind, connect, a device, a feature that was not compiled in.
pub const VANS_ERR_VAN: c_int = -9;
/// A barrier cannot complete because members of its group died.
pub const VANS_ERR_BARRIER_FAILED: c_int = -10;
/// A peer sent something that does not follow the protocol.
pub const VANS_ERR_PROTOCOL: c_int = -11;
/// A request id that this worker never issued, already waited for, or issued with a
/// completion callback (which is not waited for).
pub const VANS_ERR_UNKNOWN_REQUEST: c_int = -12;
/// A live server's request handler refused or failed the request (it returned non-zero); the
/// message names the server and carries the handler's text (`vans_response_error`). Unlike
/// `VANS_ERR_NODE_FAILED`, the server goes on serving: only this request failed.
pub const VANS_ERR_HANDLER_FAILED: c_int = -13;
/// A collective failed: a member of the generation died, the membership is changing (a
/// worker joins), or the ranks called different collectives; the message says which. Call
/// `vans_collective_settle`, then redo the step.
pub const VANS_ERR_COLLECTIVE: c_int = -14;

/// A failed call: its status code and the message `vans_last_error()` will return.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: c_int,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn invalid(message: impl Into<String>) -> Failure {
        Failure {
            code: VANS_ERR_INVALID_ARGUMENT,
            message: message.into(),
        }
    }
}

impl From<NodeError> for Failure {
    fn from(error: NodeError) -> Failure {
        let code = match &error {
            NodeError::InvalidArgument(_) => VANS_ERR_INVALID_ARGUMENT,
            NodeError::NodeFailed { .. } => VANS_ERR_NODE_FAILED,
            NodeError::Timeout { .. } => VANS_ERR_TIMEOUT,
            NodeError::Stopped => VANS_ERR_STOPPED,
            NodeError::Bootstrap { .. } => VANS_ERR_BOOTSTRAP,
            NodeError::Config(_) => VANS_ERR_CONFIG,
            NodeError::Rendezvous(_) => VANS_ERR_RENDEZVOUS,
            NodeError::Van(_) => VANS_ERR_VAN,
            NodeError::BarrierFailed { .. } => VANS_ERR_BARRIER_FAILED,
            NodeError::Protocol { .. } => VANS_ERR_PROTOCOL,
            NodeError::UnknownRequest(_) => VANS_ERR_UNKNOWN_REQUEST,
            NodeError::HandlerFailed { .. } => VANS_ERR_HANDLER_FAILED,
        };
        Failure {
            code,
            message: error.to_string(),
        }
    }
}

impl From<van_core::ConfigError> for Failure {
    fn from(error: van_core::ConfigError) -> Failure {
        Failure {
            code: VANS_ERR_CONFIG,
            message: error.to_string(),
        }
    }
}

/// What a body returns; `Ok` is [`VANS_OK`].
pub(crate) type Outcome = Result<(), Failure>;

thread_local! {
    /// The message of the last failed call on this thread.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error.
pub(crate) fn set_last_error(message: &str) {
    // A NUL inside the text would cut it short in C; show it instead.
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // `try_with`: during thread teardown there is nowhere to record it, and nobody to read it.
    let _ = LAST_ERROR.try_with(|last| *last.borrow_mut() = text);
}

/// This thread's last error message (a pointer into thread-local storage).
pub(crate) fn last_error_ptr() -> *const c_char {
    static EMPTY: &[u8] = b"\0";
    LAST_ERROR
        .try_with(|last| last.borrow().as_ptr())
        .unwrap_or(EMPTY.as_ptr().cast())
}

/// Reports `outcome` as a status code, recording the message of a failure.
pub(crate) fn report(outcome: Outcome) -> c_int {
    match outcome {
        Ok(()) => VANS_OK,
        Err(failure) => {
            set_last_error(&failure.message);
            failure.code
        }
    }
}

/// Runs the body of the entry point `name`: its failure becomes a status code and this
/// thread's last error, and so does a panic (which never unwinds into C).
pub(crate) fn guard(name: &str, body: impl FnOnce() -> Outcome) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(outcome) => report(outcome),
        Err(payload) => {
            set_last_error(&format!(
                "{name} panicked (a bug in vans): {}",
                panic_text(&*payload)
            ));
            // Dropping a payload can itself panic; keep that inside too.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            VANS_ERR_PANIC
        }
    }
}

/// Like [`guard`] for entry points that return a value instead of a status: `fallback` on a
/// panic (after recording it as the last error).
pub(crate) fn guard_value<T>(name: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            set_last_error(&format!(
                "{name} panicked (a bug in vans): {}",
                panic_text(&*payload)
            ));
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            fallback
        }
    }
}

fn panic_text(payload: &(dyn Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "(no message)"
    }
}

/// The name of a status code, e.g. `"VANS_ERR_TIMEOUT"`.
pub(crate) fn status_name(status: c_int) -> &'static std::ffi::CStr {
    match status {
        VANS_OK => c"VANS_OK",
        VANS_ERR_INVALID_ARGUMENT => c"VANS_ERR_INVALID_ARGUMENT",
        VANS_ERR_NODE_FAILED => c"VANS_ERR_NODE_FAILED",
        VANS_ERR_TIMEOUT => c"VANS_ERR_TIMEOUT",
        VANS_ERR_STOPPED => c"VANS_ERR_STOPPED",
        VANS_ERR_BOOTSTRAP => c"VANS_ERR_BOOTSTRAP",
        VANS_ERR_CONFIG => c"VANS_ERR_CONFIG",
        VANS_ERR_RENDEZVOUS => c"VANS_ERR_RENDEZVOUS",
        VANS_ERR_PANIC => c"VANS_ERR_PANIC",
        VANS_ERR_VAN => c"VANS_ERR_VAN",
        VANS_ERR_BARRIER_FAILED => c"VANS_ERR_BARRIER_FAILED",
        VANS_ERR_PROTOCOL => c"VANS_ERR_PROTOCOL",
        VANS_ERR_UNKNOWN_REQUEST => c"VANS_ERR_UNKNOWN_REQUEST",
        VANS_ERR_HANDLER_FAILED => c"VANS_ERR_HANDLER_FAILED",
        VANS_ERR_COLLECTIVE => c"VANS_ERR_COLLECTIVE",
        _ => c"VANS_ERR_UNKNOWN_STATUS",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_status_and_a_message() {
        let status = guard("vans_test", || panic!("boom"));
        assert_eq!(status, VANS_ERR_PANIC);
        // SAFETY: the pointer is this thread's last error, valid until the next set.
        let text = unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) };
        assert_eq!(
            text.to_str().ok(),
            Some("vans_test panicked (a bug in vans): boom")
        );
    }

    #[test]
    fn failures_keep_their_code_and_text() {
        let status = guard("vans_test", || Err(NodeError::Stopped.into()));
        assert_eq!(status, VANS_ERR_STOPPED);
        assert_eq!(status_name(status).to_str().ok(), Some("VANS_ERR_STOPPED"));
        set_last_error("a\0b");
        // SAFETY: as above.
        let text = unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) };
        assert_eq!(text.to_str().ok(), Some("a\\0b"));
    }
}
