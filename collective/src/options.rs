//! [`CommOptions`]: a communicator's settings. `Communicator::new` takes them from its
//! node's configuration (`VANS_COLLECTIVE_*`, read and checked by van-core with every other
//! variable), so the collectives read no environment of their own.

use std::time::Duration;

use van_core::config::{CollectiveAlgorithms, CollectiveSettings};
use van_core::Config;

/// Settings of a communicator (see [`CommOptions::from_config`]).
#[derive(Clone, Debug)]
pub struct CommOptions {
    /// The customer id of the communicator's messages (two communicators on one node need
    /// different ids).
    pub customer_id: i32,
    /// Largest message a collective sends: buffers travel in slices of this size, so a
    /// rank forwards the first slice while the next is still on its way.
    pub slice_bytes: usize,
    /// All-reduces of buffers up to this many bytes send every buffer to every rank (one
    /// step) instead of around the ring (`2 (n - 1)` steps): faster for small buffers.
    pub direct_bytes: usize,
    /// How long the coordinator waits for every live worker to join before it forms the
    /// next generation with those that did.
    pub settle_window: Duration,
    /// Longest wait for one message of a collective before it fails.
    pub timeout: Duration,
    /// The algorithm each collective is told to take; `Auto` where the selection table
    /// decides ([`crate::select`]).
    pub algorithm: CollectiveAlgorithms,
    /// How long a rank waiting on shared memory spins before it sleeps (never when the
    /// host's ranks outnumber this process's cores).
    pub spin: Duration,
    /// Whether a generation not all on one host connects its ranks directly over TCP for
    /// collectives (`VANS_COLLECTIVE_MESH`; see the crate docs).
    pub mesh: bool,
}

impl Default for CommOptions {
    /// Customer id 0 and the defaults of [`CollectiveSettings`]: 256 KiB slices, direct
    /// all-reduces up to 64 KiB, a settle window of 5 s, a timeout of 300 s and 1 ms of
    /// spinning.
    fn default() -> CommOptions {
        CommOptions::with_settings(&CollectiveSettings::default())
    }
}

impl CommOptions {
    /// Customer id 0 and the settings of `config`: `VANS_COLLECTIVE_SLICE_BYTES`,
    /// `VANS_COLLECTIVE_DIRECT_BYTES`, `VANS_COLLECTIVE_SETTLE_WINDOW` (seconds),
    /// `VANS_COLLECTIVE_TIMEOUT` (seconds), `VANS_COLLECTIVE_ALGO`,
    /// `VANS_COLLECTIVE_SPIN_US` and `VANS_COLLECTIVE_MESH`, checked when the configuration
    /// was read.
    pub fn from_config(config: &Config) -> CommOptions {
        CommOptions::with_settings(&config.collective)
    }

    fn with_settings(settings: &CollectiveSettings) -> CommOptions {
        CommOptions {
            customer_id: 0,
            slice_bytes: settings.slice_bytes,
            direct_bytes: settings.direct_bytes,
            settle_window: settings.settle_window,
            timeout: settings.timeout,
            algorithm: settings.algorithm,
            spin: settings.spin,
            mesh: settings.mesh,
        }
    }
}
