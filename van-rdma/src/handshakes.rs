//! The bound on accepted RDMA handshakes: how many may hold a queue pair and registered rings
//! at once (`VANS_RDMA_MAX_HANDSHAKES`), and how many more may wait for a turn.
//!
//! Every handshake creates a completion queue, a queue pair and two rings of
//! `VANS_RDMA_RX_DEPTH` buffers, pinned until the handshake fails or the connection ends.
//! Without a bound, a burst of connections to the side channel (a flood when no cluster
//! secret is set; a large cluster starting at once when one is) pins memory per connection
//! until the memlock limit is exhausted, and then every registration fails, established
//! connections' included. So an accepted side channel, once authenticated:
//!
//! 1. reads the dialer's queue-pair attributes (a dialer writes them first), within the
//!    connect timeout ([`RdmaError::HandshakeNotStarted`] otherwise): an idle or garbage
//!    connection costs a descriptor and a task for that long, never registered memory;
//! 2. takes a [`Place`] among those waiting for a turn (at most [`WAITING_PER_TURN`] per
//!    turn; beyond that it is closed at once, [`RdmaError::TooManyHandshakes`]);
//! 3. waits for a [`Turn`] (first come, first served) within what is left of the connect
//!    timeout, and is dropped if its dialer gave up meanwhile;
//! 4. only then creates its queue pair and rings, and finishes the handshake holding the turn.
//!
//! Without a cluster secret, idle connections are bounded only by that timeout and the
//! descriptor limit, as on every listener without one; with a secret, the
//! [gate](van_core::auth::Gate) bounds them per address before they get here.
//!
//! Dialed handshakes take no turn: a van dials each peer once, so they are bounded by the
//! cluster's size, and sharing the turns with accepted ones could deadlock two vans that dial
//! each other while each waits for a turn the other's dial holds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::RdmaError;

/// Accepted connections that may wait for a turn, per turn: with the default 16 turns, 1024
/// connections of a cluster starting at once wait instead of being refused.
pub(crate) const WAITING_PER_TURN: usize = 64;

/// The turns and waiting places of one van, and the count of handshakes in progress.
pub(crate) struct Handshakes {
    turns: Arc<Semaphore>,
    places: Arc<Semaphore>,
    max: usize,
    max_waiting: usize,
    in_progress: Arc<AtomicUsize>,
}

/// An accepted connection's place among those waiting for a turn.
pub(crate) struct Place {
    _permit: OwnedSemaphorePermit,
}

/// An accepted connection's turn: while it lives, its queue pair and rings may exist.
pub(crate) struct Turn {
    _permit: OwnedSemaphorePermit,
}

/// A handshake whose queue pair and rings exist (dialed or accepted), counted while it lives.
pub(crate) struct InProgress(Arc<AtomicUsize>);

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Handshakes {
    /// `max` turns (at least 1) and [`WAITING_PER_TURN`] waiting places per turn.
    pub(crate) fn new(max: usize) -> Handshakes {
        let max = max.clamp(1, Semaphore::MAX_PERMITS / WAITING_PER_TURN);
        let max_waiting = max * WAITING_PER_TURN;
        Handshakes {
            turns: Arc::new(Semaphore::new(max)),
            places: Arc::new(Semaphore::new(max_waiting)),
            max,
            max_waiting,
            in_progress: Arc::default(),
        }
    }

    /// Handshakes allowed to hold resources at once.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// A place for a connection accepted from `peer`, or the error it is closed with when
    /// every place is taken.
    pub(crate) fn place(&self, peer: &str) -> Result<Place, RdmaError> {
        Arc::clone(&self.places)
            .try_acquire_owned()
            .map(|_permit| Place { _permit })
            .map_err(|_| RdmaError::TooManyHandshakes {
                peer: peer.to_owned(),
                max: self.max,
                waiting: self.max_waiting,
            })
    }

    /// Waits for a turn (in arrival order); the place is given up once it comes. `None` only
    /// if the turns were closed, which they never are.
    pub(crate) async fn turn(&self, place: Place) -> Option<Turn> {
        let turn = Arc::clone(&self.turns)
            .acquire_owned()
            .await
            .ok()
            .map(|_permit| Turn { _permit });
        drop(place);
        turn
    }

    /// Counts a handshake whose resources are about to be created, until the guard drops.
    pub(crate) fn start(&self) -> InProgress {
        self.in_progress.fetch_add(1, Ordering::Relaxed);
        InProgress(Arc::clone(&self.in_progress))
    }

    /// Handshakes whose queue pair and rings exist now.
    pub(crate) fn in_progress(&self) -> usize {
        self.in_progress.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn turns_are_bounded_and_waiting_places_too() {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(async {
                let handshakes = Arc::new(Handshakes::new(2));
                assert_eq!(handshakes.max(), 2);
                let mut places: Vec<Place> = (0..2 * WAITING_PER_TURN)
                    .map(|_| handshakes.place("10.0.0.1:1").unwrap())
                    .collect();
                let full = handshakes.place("10.0.0.2:2").err().unwrap();
                assert!(
                    matches!(
                        full,
                        RdmaError::TooManyHandshakes {
                            max: 2,
                            waiting: 128,
                            ..
                        }
                    ),
                    "{full:?}"
                );
                assert!(full.to_string().contains("VANS_RDMA_MAX_HANDSHAKES"));

                let first = handshakes.turn(places.pop().unwrap()).await.unwrap();
                let _second = handshakes.turn(places.pop().unwrap()).await.unwrap();
                // A place came back with each turn.
                let _again = handshakes.place("10.0.0.2:2").unwrap();
                // The third waits until a turn ends.
                let third = handshakes.turn(places.pop().unwrap());
                tokio::pin!(third);
                assert!(
                    tokio::time::timeout(Duration::from_millis(20), &mut third)
                        .await
                        .is_err(),
                    "a third turn while two are held"
                );
                drop(first);
                assert!(tokio::time::timeout(Duration::from_secs(1), third)
                    .await
                    .unwrap()
                    .is_some());

                let busy = [handshakes.start(), handshakes.start()];
                assert_eq!(handshakes.in_progress(), 2);
                drop(busy);
                assert_eq!(handshakes.in_progress(), 0);
            });
    }

    #[test]
    fn at_least_one_turn() {
        assert_eq!(Handshakes::new(0).max(), 1);
    }
}
