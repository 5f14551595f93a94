//! Fencing: what keeps a process the cluster went on without (a *zombie*: cut off by a
//! partition, declared dead, replaced) from acting on it when it comes back. Three checks,
//! each on by default:
//!
//! - a node cut off from its scheduler for `PS_HEARTBEAT_TIMEOUT` stops itself (a lease:
//!   the scheduler has declared it dead by then);
//! - a node the scheduler declares dead stops (both are
//!   [`member::Action::Evicted`](crate::member::Action::Evicted));
//! - with `PS_RESEND`, a message from a process that a new one replaced, or meant for the
//!   process before the recipient, is dropped (the resender's incarnation checks).
//!
//! `VANS_TEST_NO_FENCING=1` turns all three off, for one purpose only: to show that the
//! fault tests would catch a zombie without them (`examples/tests/network_faults.rs`). A
//! node with it set says so at start, loudly. Never set it in a real job.

use std::sync::OnceLock;

/// The variable that turns fencing off (tests of the tests only).
pub const NO_FENCING: &str = "VANS_TEST_NO_FENCING";

/// Whether fencing is on (it is unless [`NO_FENCING`] is `1`).
pub fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        let off = std::env::var(NO_FENCING).is_ok_and(|v| v == "1");
        if off {
            tracing::error!(
                "{NO_FENCING}=1: zombies are NOT fenced (a node cut off and replaced goes on, \
                 and its late messages are applied); this is for testing the fault tests only"
            );
        }
        !off
    })
}
