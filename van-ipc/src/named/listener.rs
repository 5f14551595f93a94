//! [`NamedListener`]: the listening side of the named mode, which owns an accept queue and
//! takes the connection segments dialers post in it.

use std::time::{Duration, Instant};

use super::accept_queue::{AcceptQueue, Scan};
use super::connection::{self, NamedConnection};
use super::SegmentName;
use crate::error::IpcError;
use crate::notify::{self, WaitResult};
use crate::ring::MAX_RING_BYTES;

/// Spins before the listener sleeps on its futex (accepting is not latency-critical).
const ACCEPT_SPINS: u32 = 100;
/// Longest single sleep of `accept`, so that stale claims are noticed.
const ACCEPT_SLICE: Duration = Duration::from_secs(1);

/// The listening side of the named mode: owns an accept queue in `/dev/shm` whose name is its
/// address. Dropping it marks the queue closed (dialers waiting on it fail at once) and
/// removes its name.
///
/// Use it from a blocking thread:
///
/// ```no_run
/// # fn main() -> Result<(), van_ipc::IpcError> {
/// use std::time::Duration;
/// use van_ipc::named::NamedListener;
///
/// let mut listener = NamedListener::bind()?;
/// println!("announce {}", listener.address()); // shm:vans-…
/// loop {
///     match listener.accept(Duration::from_secs(1)) {
///         Ok(Some(connection)) => { /* start reader/writer threads on its rings */ }
///         Ok(None) => { /* timed out: check for shutdown */ }
///         Err(e) => eprintln!("refused a dialer: {e}"), // the listener stays usable
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct NamedListener {
    queue: AcceptQueue,
    address: String,
    /// What the scans of the queue's slots remember between calls.
    scan: Scan,
    /// Largest ring capacity accepted from a dialer.
    max_ring_bytes: usize,
}

impl NamedListener {
    /// Creates the accept queue (`/dev/shm/vans-<uid>-<pid>-<ns>-<random>`, mode 0600).
    ///
    /// # Errors
    ///
    /// [`IpcError::ShmTooSmall`] when `/dev/shm` is full; [`IpcError::Os`] otherwise.
    pub fn bind() -> Result<NamedListener, IpcError> {
        let queue = AcceptQueue::create()?;
        let address = queue.name().address();
        Ok(NamedListener {
            queue,
            address,
            scan: Scan::new(),
            max_ring_bytes: MAX_RING_BYTES,
        })
    }

    /// The address dialers pass to [`connect`](super::connect): `shm:<accept queue name>`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The accept queue's segment name.
    pub fn name(&self) -> &SegmentName {
        self.queue.name()
    }

    /// Refuses connection segments whose rings exceed `bytes` of capacity each (default
    /// [`MAX_RING_BYTES`]); bounds how much a dialer can make us map.
    pub fn set_max_ring_bytes(&mut self, bytes: usize) {
        self.max_ring_bytes = bytes.min(MAX_RING_BYTES);
    }

    /// Waits up to `timeout` for a dialer and returns the connection, with the name of its
    /// segment already removed from `/dev/shm`. `Ok(None)` when the timeout passed.
    ///
    /// # Errors
    ///
    /// An error concerns one dialer's post, which has been discarded; the listener stays
    /// usable, so log it and call `accept` again: [`IpcError::Corrupt`] for a slot holding
    /// an unknown state or an over-long name, [`IpcError::BadName`] for a malformed name,
    /// [`IpcError::BadSegment`] for a connection segment that fails validation (it is
    /// removed, and the dialer told), [`IpcError::Os`] when it cannot be opened.
    pub fn accept(&mut self, timeout: Duration) -> Result<Option<NamedConnection>, IpcError> {
        let deadline = Instant::now().checked_add(timeout);
        let expired = || deadline.is_some_and(|d| Instant::now() >= d);
        loop {
            while let Some(name) = self.queue.take_posted(&mut self.scan)? {
                if let Some(connection) = connection::accept(&name, self.max_ring_bytes)? {
                    return Ok(Some(connection));
                }
                // The dialer gave up and removed its segment: look for the next post, unless
                // the time is up (a flood of dead posts must not hold us past the timeout).
                if expired() {
                    return Ok(None);
                }
            }
            let remaining = match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(None);
                    }
                    (deadline - now).min(ACCEPT_SLICE)
                }
                None => ACCEPT_SLICE,
            };
            let queue = &self.queue;
            notify::wait_adaptive(queue.listener_waiting(), ACCEPT_SPINS, remaining, || {
                queue.has_posted().then_some(WaitResult::Ready)
            });
        }
    }
}

impl Drop for NamedListener {
    fn drop(&mut self) {
        // Dialers waiting for us see this within their wait slice and give up cleanly; the
        // queue's name goes with its segment (we created it).
        self.queue.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_accept_queue_opens_and_closes() {
        let listener = NamedListener::bind().unwrap();
        let name = *listener.name();
        assert!(listener.address().starts_with("shm:vans-"));
        let queue = AcceptQueue::open(&name).unwrap();
        assert!(!queue.is_closed());
        drop(listener);
        assert!(queue.is_closed());
        assert!(
            !name.path().exists(),
            "the listener removes its accept queue"
        );
        let err = queue
            .post(&SegmentName::fresh().unwrap(), Instant::now())
            .unwrap_err();
        assert!(matches!(err, IpcError::Rendezvous { .. }), "{err}");
    }
}
