//! Connection segments: both rings of one peer pair and the handshake and heartbeat words,
//! created by the dialer ([`connect`]) and taken by the listener (`NamedListener::accept`).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::accept_queue::AcceptQueue;
use super::layout::connection::{
    ABANDONED, ACCEPTED, CAPACITY_OFFSET, DIALER_BEAT_OFFSET, DIALER_WAITING_OFFSET, HEADER_BYTES,
    LISTENER_BEAT_OFFSET, MAGIC, MAGIC_OFFSET, POSTED, REFUSED, STATE_OFFSET, VERSION,
    VERSION_OFFSET,
};
use super::{is_not_found, NamedSegment, SegmentName};
use crate::error::IpcError;
use crate::notify::{self, WaitResult};
use crate::ring::{layout as ring_layout, Consumer, Producer, MAX_RING_BYTES, MIN_RING_BYTES};
use crate::segment::Segment;

/// How often each side should call [`Liveness::beat`].
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);
/// A peer whose heartbeat has not moved for this long is dead ([`PeerStatus::Silent`]):
/// six missed beats, so a briefly descheduled process is not declared dead.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);
/// A sensible timeout for [`connect`] (the listener's accept loop must come round).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Spins before the dialer sleeps while waiting for the listener.
const HANDSHAKE_SPINS: u32 = 100;
/// Longest single sleep of the dialer, so that a closed accept queue is noticed.
const HANDSHAKE_SLICE: Duration = Duration::from_millis(100);

/// One side of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The side that called [`connect`] (created the segment).
    Dialer,
    /// The side that accepted it.
    Listener,
}

/// An established named-mode connection: the two ring ends and the liveness check. The
/// segment's name is already gone from `/dev/shm`; the memory lives while any part does.
#[derive(Debug)]
pub struct NamedConnection {
    /// Writes frames to the peer.
    pub producer: Producer,
    /// Reads frames from the peer (set its maximum message with
    /// [`Consumer::set_max_message`] to the node's largest frame).
    pub consumer: Consumer,
    /// Heartbeats: beat every [`HEARTBEAT_INTERVAL`], poll [`Liveness::status`].
    pub liveness: Liveness,
}

impl NamedConnection {
    /// Closes both rings (the peer's reader drains what was written, then sees the end).
    pub fn close(&self) {
        self.producer.close();
        self.consumer.close();
    }
}

/// What [`Liveness::status`] knows about the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerStatus {
    /// Its heartbeat moved within the timeout and no ring is closed.
    Alive,
    /// A ring was closed: an orderly end (by either side).
    Closed,
    /// No heartbeat for `since` (at least the timeout): the peer is dead or hung.
    Silent {
        /// How long the heartbeat has not moved.
        since: Duration,
    },
}

/// Liveness of the peer of a named connection, without a socket and without trusting pids
/// (which mean nothing across pid namespaces): each side bumps its own counter in the
/// connection segment, and watches the other's.
///
/// ```no_run
/// # fn watch(mut liveness: van_ipc::named::Liveness) {
/// use van_ipc::named::{PeerStatus, HEARTBEAT_INTERVAL};
/// loop {
///     liveness.beat();
///     match liveness.status() {
///         PeerStatus::Alive => std::thread::sleep(HEARTBEAT_INTERVAL),
///         PeerStatus::Closed => break, // orderly end
///         PeerStatus::Silent { since } => {
///             eprintln!("peer silent for {since:?}: lost");
///             break;
///         }
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct Liveness {
    segment: Arc<NamedSegment>,
    side: Side,
    /// Ring capacity (validated), to find the rings' `closed` words.
    capacity: usize,
    /// The peer's counter when it last changed, and when that was seen.
    last_seen: u64,
    last_change: Instant,
    timeout: Duration,
}

impl Liveness {
    fn new(segment: Arc<NamedSegment>, side: Side, capacity: usize) -> Liveness {
        let mut liveness = Liveness {
            segment,
            side,
            capacity,
            last_seen: 0,
            last_change: Instant::now(),
            timeout: HEARTBEAT_TIMEOUT,
        };
        // The peer gets a full timeout from now for its next beat.
        liveness.last_seen = liveness.peer_beat().load(Ordering::Acquire);
        liveness
    }

    /// Bumps our heartbeat counter: call every [`HEARTBEAT_INTERVAL`] (from any thread; a
    /// relaxed atomic add, no system call).
    pub fn beat(&self) {
        self.own_beat().fetch_add(1, Ordering::Release);
    }

    /// The peer's state: [`PeerStatus::Closed`] when either ring is closed,
    /// [`PeerStatus::Silent`] when its heartbeat has not moved for the timeout, else
    /// [`PeerStatus::Alive`]. Cheap (three atomic loads); poll it every beat.
    pub fn status(&mut self) -> PeerStatus {
        let ring_closed = [self.dialer_ring_offset(), self.listener_ring_offset()]
            .iter()
            .any(|ring| {
                self.u32_at(ring + ring_layout::CLOSED_OFFSET)
                    .load(Ordering::Acquire)
                    != 0
            });
        if ring_closed {
            return PeerStatus::Closed;
        }
        let now = Instant::now();
        let beat = self.peer_beat().load(Ordering::Acquire);
        if beat != self.last_seen {
            self.last_seen = beat;
            self.last_change = now;
        }
        let since = now.duration_since(self.last_change);
        if since >= self.timeout {
            PeerStatus::Silent { since }
        } else {
            PeerStatus::Alive
        }
    }

    /// Whether [`Liveness::status`] is [`PeerStatus::Alive`].
    pub fn peer_alive(&mut self) -> bool {
        self.status() == PeerStatus::Alive
    }

    /// How long the peer's heartbeat may stand still (default [`HEARTBEAT_TIMEOUT`]).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets the heartbeat timeout; keep it several [`HEARTBEAT_INTERVAL`]s long.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Which side of the connection this is.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The connection segment's name (for logs; the file itself is already removed).
    pub fn segment_name(&self) -> SegmentName {
        *self.segment.name()
    }

    fn own_beat(&self) -> &AtomicU64 {
        self.u64_at(match self.side {
            Side::Dialer => DIALER_BEAT_OFFSET,
            Side::Listener => LISTENER_BEAT_OFFSET,
        })
    }

    fn peer_beat(&self) -> &AtomicU64 {
        self.u64_at(match self.side {
            Side::Dialer => LISTENER_BEAT_OFFSET,
            Side::Listener => DIALER_BEAT_OFFSET,
        })
    }

    fn dialer_ring_offset(&self) -> usize {
        HEADER_BYTES
    }

    fn listener_ring_offset(&self) -> usize {
        HEADER_BYTES + ring_layout::HEADER_BYTES + self.capacity
    }

    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: the offsets are the header's constants or a ring header's `closed` word;
        // the segment was validated to be `total_len(capacity)` long, which covers both
        // ring headers, and every offset used is 4-aligned.
        unsafe { self.segment.atomic_u32(offset) }
    }

    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: header constants, 8-aligned, inside the validated header page.
        unsafe { self.segment.atomic_u64(offset) }
    }
}

/// The ring capacity for `ring_bytes`, rounded as [`crate::ring::create_ring`] does.
fn ring_capacity(ring_bytes: usize) -> Result<usize, IpcError> {
    let bytes = ring_bytes.max(MIN_RING_BYTES);
    match bytes.checked_next_power_of_two() {
        Some(capacity) if capacity <= MAX_RING_BYTES => Ok(capacity),
        _ => Err(IpcError::TooLarge {
            len: bytes,
            max: MAX_RING_BYTES,
        }),
    }
}

/// Bytes of a connection segment with rings of `capacity`.
fn total_len(capacity: usize) -> Option<usize> {
    capacity
        .checked_add(ring_layout::HEADER_BYTES)?
        .checked_mul(2)?
        .checked_add(HEADER_BYTES)
}

/// A validated view of a connection segment's header.
struct Header<'a> {
    segment: &'a NamedSegment,
}

impl Header<'_> {
    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: header constants, 4-aligned, below HEADER_BYTES; every `Header` is built
        // on a segment at least HEADER_BYTES long.
        unsafe { self.segment.atomic_u32(offset) }
    }

    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: as in `u32_at`, 8-aligned.
        unsafe { self.segment.atomic_u64(offset) }
    }

    fn state(&self) -> &AtomicU32 {
        self.u32_at(STATE_OFFSET)
    }

    fn dialer_waiting(&self) -> &AtomicU32 {
        self.u32_at(DIALER_WAITING_OFFSET)
    }
}

/// The two ring windows of a connection segment with rings of `capacity`.
fn ring_windows(
    segment: &Arc<NamedSegment>,
    capacity: usize,
) -> Result<(Arc<Segment>, Arc<Segment>), IpcError> {
    let ring_len = ring_layout::HEADER_BYTES + capacity;
    let to_listener = Segment::from_named(Arc::clone(segment), HEADER_BYTES, ring_len)?;
    let to_dialer = Segment::from_named(Arc::clone(segment), HEADER_BYTES + ring_len, ring_len)?;
    Ok((Arc::new(to_listener), Arc::new(to_dialer)))
}

/// Connects to the listener at `address` (`shm:vans-…`): creates a connection segment with
/// two rings of `ring_bytes` each (rounded up to a power of two, as
/// [`crate::ring::create_ring`] does), posts its name in the listener's accept queue, and waits
/// up to `timeout` for the listener to take it. Blocks: call it from a blocking thread.
///
/// ```no_run
/// # fn main() -> Result<(), van_ipc::IpcError> {
/// use van_ipc::named::{connect, DEFAULT_CONNECT_TIMEOUT};
/// let mut connection = connect("shm:vans-1000-42-4026531836-0123456789abcdef", 1 << 20,
///     DEFAULT_CONNECT_TIMEOUT)?;
/// assert!(connection.producer.try_push_parts(&[b"hello"])?);
/// connection.producer.wake_consumer();
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`IpcError::BadName`] for a malformed address; [`IpcError::Os`] (`NotFound`) when no
/// such accept queue exists; [`IpcError::BadSegment`] when it is not a valid accept queue
/// (or belongs to another uid); [`IpcError::ShmTooSmall`] when `/dev/shm` cannot hold the
/// rings; [`IpcError::TooLarge`] for rings over [`MAX_RING_BYTES`]; [`IpcError::Rendezvous`]
/// when the listener closed, refused the segment or did not accept in time. Nothing is left
/// in `/dev/shm` after an error.
pub fn connect(
    address: &str,
    ring_bytes: usize,
    timeout: Duration,
) -> Result<NamedConnection, IpcError> {
    let deadline = Instant::now().checked_add(timeout);
    let queue = AcceptQueue::open(&SegmentName::from_address(address)?)?;
    // A crashed listener's queue outlives it until someone sweeps: say so now instead of
    // waiting out the timeout.
    let gone = || IpcError::Rendezvous {
        address: queue.name().address(),
        reason: "the listener's process is gone (nobody holds its owner lock)".to_owned(),
    };
    if queue.owner_gone() {
        return Err(gone());
    }
    let capacity = ring_capacity(ring_bytes)?;
    let len = total_len(capacity).ok_or(IpcError::TooLarge {
        len: capacity,
        max: MAX_RING_BYTES,
    })?;
    // From here on, dropping `segment` (on any error) removes its name: we created it.
    let segment = Arc::new(NamedSegment::create(len)?);
    let (to_listener, to_dialer) = ring_windows(&segment, capacity)?;
    let producer = Producer::new(to_listener, true)?;
    let consumer = Consumer::new(to_dialer, true)?;
    let header = Header { segment: &segment };
    header
        .u64_at(CAPACITY_OFFSET)
        .store(capacity as u64, Ordering::Relaxed);
    header
        .u32_at(VERSION_OFFSET)
        .store(VERSION, Ordering::Relaxed);
    header.state().store(POSTED, Ordering::Relaxed);
    header
        .u64_at(DIALER_BEAT_OFFSET)
        .store(1, Ordering::Relaxed);
    header.u64_at(MAGIC_OFFSET).store(MAGIC, Ordering::Release);

    let refused = |reason: String| IpcError::Rendezvous {
        address: queue.name().address(),
        reason,
    };
    // With no representable deadline, post without a bound on busy slots too.
    let post_deadline = deadline.unwrap_or_else(|| {
        let now = Instant::now();
        now.checked_add(Duration::from_secs(86_400)).unwrap_or(now)
    });
    queue.post(segment.name(), post_deadline)?;
    loop {
        match header.state().load(Ordering::Acquire) {
            ACCEPTED => break,
            POSTED => {}
            REFUSED => {
                return Err(refused(format!(
                    "the listener refused connection segment {} (its log says why)",
                    segment.name()
                )))
            }
            other => {
                return Err(IpcError::corrupt(format!(
                    "connection segment {} holds unknown handshake state {other}",
                    segment.name()
                )))
            }
        }
        let closed = queue.is_closed();
        let owner_gone = !closed && queue.owner_gone();
        let now = Instant::now();
        let expired = deadline.is_some_and(|d| now >= d);
        if closed || owner_gone || expired {
            // Whoever moves the state first decides: if the listener accepted meanwhile,
            // the connection stands.
            if header
                .state()
                .compare_exchange(POSTED, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                if owner_gone {
                    return Err(gone());
                }
                return Err(refused(if closed {
                    "the listener closed before accepting".to_owned()
                } else {
                    format!(
                        "the listener did not accept within {timeout:?}; it may have exited \
                         (`vans-shm list` shows whether its owner runs)"
                    )
                }));
            }
            continue;
        }
        let slice = deadline.map_or(HANDSHAKE_SLICE, |d| (d - now).min(HANDSHAKE_SLICE));
        notify::wait_adaptive(header.dialer_waiting(), HANDSHAKE_SPINS, slice, || {
            (header.state().load(Ordering::Acquire) != POSTED).then_some(WaitResult::Ready)
        });
    }
    // Both sides have it mapped: the name can go (the listener removed it already, normally;
    // failing to remove it must not undo a connection the listener considers made).
    let _ = segment.unlink();
    let liveness = Liveness::new(Arc::clone(&segment), Side::Dialer, capacity);
    Ok(NamedConnection {
        producer,
        consumer,
        liveness,
    })
}

/// The listener's half: opens the connection segment `name` posted in its accept queue,
/// validates it, attaches the rings, marks it accepted, removes its name and wakes the
/// dialer. `Ok(None)` when the dialer already gave up (the segment is gone or abandoned).
pub(crate) fn accept(
    name: &SegmentName,
    max_ring_bytes: usize,
) -> Result<Option<NamedConnection>, IpcError> {
    let max_capacity = max_ring_bytes.clamp(MIN_RING_BYTES, MAX_RING_BYTES);
    let max_len = total_len(max_capacity).unwrap_or(usize::MAX);
    let segment = match NamedSegment::open(name, max_len) {
        Ok(segment) => Arc::new(segment),
        Err(e) if is_not_found(&e) => return Ok(None),
        // Not removed: it may not be ours (wrong owner, a planted file). A live dialer
        // removes its own segment when its connect times out; a dead one's is stale.
        Err(e) => return Err(e),
    };
    match attach(&segment, max_capacity) {
        Ok(Some(connection)) => Ok(Some(connection)),
        Ok(None) => {
            let _ = segment.unlink();
            Ok(None)
        }
        Err(e) => {
            if segment.len() >= HEADER_BYTES {
                let header = Header { segment: &segment };
                let _ = header.state().compare_exchange(
                    POSTED,
                    REFUSED,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
                notify::wake_if_waiting(header.dialer_waiting());
            }
            let _ = segment.unlink();
            Err(e)
        }
    }
}

/// Validates the header and rings of an opened connection segment and takes it.
fn attach(
    segment: &Arc<NamedSegment>,
    max_capacity: usize,
) -> Result<Option<NamedConnection>, IpcError> {
    let name = *segment.name();
    let len = segment.len();
    if len < HEADER_BYTES {
        return Err(IpcError::bad_segment(format!(
            "connection segment {name} has {len} bytes, less than its {HEADER_BYTES}-byte header"
        )));
    }
    let header = Header { segment };
    let magic = header.u64_at(MAGIC_OFFSET).load(Ordering::Acquire);
    if magic != MAGIC {
        return Err(IpcError::bad_segment(format!(
            "{name} is not a vans connection segment: bad magic {magic:#018x}, expected \
             {MAGIC:#018x}"
        )));
    }
    let version = header.u32_at(VERSION_OFFSET).load(Ordering::Relaxed);
    if version != VERSION {
        return Err(IpcError::bad_segment(format!(
            "connection segment {name} has version {version}; this build speaks version \
             {VERSION}"
        )));
    }
    let declared = header.u64_at(CAPACITY_OFFSET).load(Ordering::Relaxed);
    let capacity = usize::try_from(declared)
        .ok()
        .filter(|c| c.is_power_of_two() && (MIN_RING_BYTES..=max_capacity).contains(c))
        .filter(|c| total_len(*c) == Some(len));
    let Some(capacity) = capacity else {
        return Err(IpcError::bad_segment(format!(
            "connection segment {name} declares rings of {declared} bytes: not a power of two \
             between {MIN_RING_BYTES} and {max_capacity} matching its {len} bytes"
        )));
    };
    let (to_listener, to_dialer) = ring_windows(segment, capacity)?;
    let consumer = Consumer::new(to_listener, false)?;
    let producer = Producer::new(to_dialer, false)?;
    match header
        .state()
        .compare_exchange(POSTED, ACCEPTED, Ordering::AcqRel, Ordering::Acquire)
    {
        Ok(_) => {}
        Err(ABANDONED) => return Ok(None),
        Err(other) => {
            return Err(IpcError::bad_segment(format!(
                "connection segment {name} is in handshake state {other}, not posted"
            )))
        }
    }
    // The dialer removes it too once it sees ACCEPTED: an error here is not fatal.
    let _ = segment.unlink();
    let liveness = Liveness::new(Arc::clone(segment), Side::Listener, capacity);
    liveness.beat();
    notify::wake_if_waiting(header.dialer_waiting());
    Ok(Some(NamedConnection {
        producer,
        consumer,
        liveness,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::named::NamedListener;
    use bytes::BytesMut;

    fn pair(ring_bytes: usize) -> (NamedListener, NamedConnection, NamedConnection) {
        let mut listener = NamedListener::bind().unwrap();
        let address = listener.address().to_owned();
        let dialer =
            std::thread::spawn(move || connect(&address, ring_bytes, Duration::from_secs(20)));
        let accepted = listener
            .accept(Duration::from_secs(20))
            .unwrap()
            .expect("a dialer within the timeout");
        let dialed = dialer.join().unwrap().unwrap();
        (listener, accepted, dialed)
    }

    #[test]
    fn rings_work_both_ways_and_names_are_gone() {
        let (_listener, mut accepted, mut dialed) = pair(5000);
        assert_eq!(dialed.producer.capacity(), 8192);
        assert_eq!(accepted.consumer.capacity(), 8192);
        let name = accepted.liveness.segment_name();
        assert_eq!(name, dialed.liveness.segment_name());
        assert!(
            !name.path().exists(),
            "both sides mapped it: the name is gone"
        );
        assert!(dialed.producer.try_push_parts(&[b"ping"]).unwrap());
        let mut out = BytesMut::new();
        assert!(accepted.consumer.try_pop(&mut out).unwrap().is_some());
        assert_eq!(&out[..], b"ping");
        assert!(accepted.producer.try_push_parts(&[b"pong"]).unwrap());
        out.clear();
        assert!(dialed.consumer.try_pop(&mut out).unwrap().is_some());
        assert_eq!(&out[..], b"pong");
    }

    #[test]
    fn liveness_sees_beats_silence_and_close() {
        let (_listener, mut accepted, mut dialed) = pair(4096);
        accepted.liveness.set_timeout(Duration::from_millis(200));
        dialed.liveness.set_timeout(Duration::from_millis(200));
        assert_eq!(accepted.liveness.side(), Side::Listener);
        assert_eq!(dialed.liveness.side(), Side::Dialer);
        for _ in 0..5 {
            accepted.liveness.beat();
            dialed.liveness.beat();
            assert!(accepted.liveness.peer_alive());
            assert!(dialed.liveness.peer_alive());
            std::thread::sleep(Duration::from_millis(50));
        }
        // The dialer stops beating: the listener sees silence, the dialer still sees life.
        let start = Instant::now();
        loop {
            accepted.liveness.beat();
            match accepted.liveness.status() {
                PeerStatus::Alive => {}
                PeerStatus::Silent { since } => {
                    assert!(since >= Duration::from_millis(200));
                    break;
                }
                PeerStatus::Closed => panic!("nothing was closed"),
            }
            assert!(start.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(dialed.liveness.peer_alive());
        dialed.close();
        assert_eq!(accepted.liveness.status(), PeerStatus::Closed);
    }

    #[test]
    fn connect_times_out_and_cleans_up_without_an_accept() {
        let listener = NamedListener::bind().unwrap();
        let start = Instant::now();
        let err = connect(listener.address(), 4096, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, IpcError::Rendezvous { .. }), "{err}");
        assert!(err.to_string().contains("did not accept"), "{err}");
        assert!(start.elapsed() >= Duration::from_millis(200));
    }

    #[test]
    fn geometry() {
        assert_eq!(ring_capacity(0).unwrap(), MIN_RING_BYTES);
        assert_eq!(ring_capacity(5000).unwrap(), 8192);
        assert!(ring_capacity(MAX_RING_BYTES + 1).is_err());
        assert_eq!(
            total_len(4096),
            Some(HEADER_BYTES + 2 * (ring_layout::HEADER_BYTES + 4096))
        );
        assert_eq!(total_len(usize::MAX), None);
    }
}
