//! The listener's mailbox: where dialers post the names of the connection segments they
//! created, and the [`NamedListener`] that takes them.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::connection::{self, NamedConnection};
use super::layout::mailbox::{
    BYTES, CLAIMED, CLOSED_OFFSET, EMPTY, LISTENER_WAITING_OFFSET, MAGIC, MAGIC_OFFSET, POSTED,
    SLOTS_OFFSET, SLOT_BYTES, SLOT_BYTES_OFFSET, SLOT_COUNT, SLOT_COUNT_OFFSET, SLOT_NAME_BYTES,
    SLOT_NAME_LEN_OFFSET, SLOT_NAME_OFFSET, SLOT_STATE_OFFSET, STATE_MASK, VERSION, VERSION_OFFSET,
};
use super::{NamedSegment, SegmentName};
use crate::error::IpcError;
use crate::notify::{self, WaitResult};
use crate::ring::MAX_RING_BYTES;

/// A slot claimed but not posted for this long belongs to a dialer that died mid-post: the
/// listener frees it.
const CLAIM_TIMEOUT: Duration = Duration::from_secs(5);
/// Spins before the listener sleeps on its futex (accepting is not latency-critical).
const ACCEPT_SPINS: u32 = 100;
/// Longest single sleep of `accept`, so that stale claims are noticed.
const ACCEPT_SLICE: Duration = Duration::from_secs(1);
/// Pause between scans when a dialer finds every slot busy.
const BUSY_SLOTS_PAUSE: Duration = Duration::from_millis(1);
/// Words of a slot's name area.
const NAME_WORDS: usize = SLOT_NAME_BYTES / 8;

/// A validated view of a mailbox segment.
#[derive(Debug)]
pub(crate) struct Mailbox {
    /// At least [`BYTES`] long.
    segment: NamedSegment,
}

/// A slot's state word: state in the low bits, generation above.
fn state_of(word: u32) -> u32 {
    word & STATE_MASK
}

/// The state word for `state` with the generation of `word`.
fn with_state(word: u32, state: u32) -> u32 {
    (word & !STATE_MASK) | state
}

/// The state word of a new claim: the next generation.
fn next_claim(word: u32) -> u32 {
    (word & !STATE_MASK).wrapping_add(STATE_MASK + 1) | CLAIMED
}

impl Mailbox {
    /// Creates an empty mailbox (a fresh named segment).
    fn create() -> Result<Mailbox, IpcError> {
        let mailbox = Mailbox {
            segment: NamedSegment::create(BYTES)?,
        };
        // The file starts zeroed: every slot is EMPTY, `closed` is 0.
        mailbox
            .u32_at(VERSION_OFFSET)
            .store(VERSION, Ordering::Relaxed);
        mailbox
            .u32_at(SLOT_COUNT_OFFSET)
            .store(SLOT_COUNT as u32, Ordering::Relaxed);
        mailbox
            .u32_at(SLOT_BYTES_OFFSET)
            .store(SLOT_BYTES as u32, Ordering::Relaxed);
        mailbox.u64_at(MAGIC_OFFSET).store(MAGIC, Ordering::Release);
        Ok(mailbox)
    }

    /// Opens the mailbox `name` and validates its header.
    pub(crate) fn open(name: &SegmentName) -> Result<Mailbox, IpcError> {
        let segment = NamedSegment::open(name, BYTES)?;
        if segment.len() != BYTES {
            return Err(IpcError::bad_segment(format!(
                "mailbox {name} has {} bytes, expected {BYTES}",
                segment.len()
            )));
        }
        let mailbox = Mailbox { segment };
        let magic = mailbox.u64_at(MAGIC_OFFSET).load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(IpcError::bad_segment(format!(
                "{name} is not a vans mailbox: bad magic {magic:#018x}, expected {MAGIC:#018x}"
            )));
        }
        let version = mailbox.u32_at(VERSION_OFFSET).load(Ordering::Relaxed);
        if version != VERSION {
            return Err(IpcError::bad_segment(format!(
                "mailbox {name} has version {version}; this build speaks version {VERSION}"
            )));
        }
        let slots = mailbox.u32_at(SLOT_COUNT_OFFSET).load(Ordering::Relaxed);
        let slot_bytes = mailbox.u32_at(SLOT_BYTES_OFFSET).load(Ordering::Relaxed);
        if slots as usize != SLOT_COUNT || slot_bytes as usize != SLOT_BYTES {
            return Err(IpcError::bad_segment(format!(
                "mailbox {name} has {slots} slots of {slot_bytes} bytes; expected {SLOT_COUNT} \
                 of {SLOT_BYTES}"
            )));
        }
        Ok(mailbox)
    }

    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset + 4 <= BYTES);
        // SAFETY: every caller passes a 4-aligned offset inside the layout, and `create` and
        // `open` made sure the segment is `BYTES` long.
        unsafe { self.segment.atomic_u32(offset) }
    }

    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset + 8 <= BYTES);
        // SAFETY: as in `u32_at`, 8-aligned.
        unsafe { self.segment.atomic_u64(offset) }
    }

    /// Offset of slot `index` (taken modulo the slot count, so always in bounds).
    fn slot(index: usize) -> usize {
        SLOTS_OFFSET + (index % SLOT_COUNT) * SLOT_BYTES
    }

    fn slot_state(&self, index: usize) -> &AtomicU32 {
        self.u32_at(Mailbox::slot(index) + SLOT_STATE_OFFSET)
    }

    fn slot_name_len(&self, index: usize) -> &AtomicU32 {
        self.u32_at(Mailbox::slot(index) + SLOT_NAME_LEN_OFFSET)
    }

    fn slot_name_word(&self, index: usize, word: usize) -> &AtomicU64 {
        self.u64_at(Mailbox::slot(index) + SLOT_NAME_OFFSET + (word % NAME_WORDS) * 8)
    }

    fn listener_waiting(&self) -> &AtomicU32 {
        self.u32_at(LISTENER_WAITING_OFFSET)
    }

    /// Whether the listener has closed (or a peer scribbled on the word: either way, do
    /// not post).
    pub(crate) fn is_closed(&self) -> bool {
        self.u32_at(CLOSED_OFFSET).load(Ordering::Acquire) != 0
    }

    /// The mailbox's name.
    pub(crate) fn name(&self) -> &SegmentName {
        self.segment.name()
    }

    /// Posts `name` in a free slot and wakes the listener; while every slot is busy, retries
    /// until `deadline`.
    pub(crate) fn post(&self, name: &SegmentName, deadline: Instant) -> Result<(), IpcError> {
        let text = name.to_string();
        let bytes = text.as_bytes();
        if bytes.len() > SLOT_NAME_BYTES {
            // Cannot happen for a valid name (at most MAX_NAME_BYTES); refuse rather than cut.
            return Err(IpcError::BadName {
                name: text.clone(),
                reason: format!("longer than the {SLOT_NAME_BYTES} bytes of a mailbox slot"),
            });
        }
        let mut words = [0u64; NAME_WORDS];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut le = [0u8; 8];
            le[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_le_bytes(le);
        }
        loop {
            if self.is_closed() {
                return Err(self.refused("the listener has closed"));
            }
            for index in 0..SLOT_COUNT {
                let state = self.slot_state(index);
                let word = state.load(Ordering::Relaxed);
                if state_of(word) != EMPTY {
                    continue;
                }
                let claimed = next_claim(word);
                if state
                    .compare_exchange(word, claimed, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
                {
                    continue;
                }
                for (i, word) in words.iter().enumerate() {
                    self.slot_name_word(index, i)
                        .store(*word, Ordering::Relaxed);
                }
                self.slot_name_len(index)
                    .store(bytes.len() as u32, Ordering::Relaxed);
                // Fails only if the listener freed our claim as stale (we stalled for
                // seconds): then claim another slot.
                if state
                    .compare_exchange(
                        claimed,
                        with_state(claimed, POSTED),
                        Ordering::Release,
                        Ordering::Relaxed,
                    )
                    .is_ok()
                {
                    notify::wake_if_waiting(self.listener_waiting());
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(self.refused(&format!(
                    "all {SLOT_COUNT} mailbox slots stayed busy until the timeout; the \
                     listener is not accepting"
                )));
            }
            std::thread::sleep(BUSY_SLOTS_PAUSE);
        }
    }

    fn refused(&self, reason: &str) -> IpcError {
        IpcError::Rendezvous {
            address: self.name().address(),
            reason: reason.to_owned(),
        }
    }
}

/// The listening side of the named mode: owns a mailbox in `/dev/shm` whose name is its
/// address. Dropping it marks the mailbox closed (dialers waiting on it fail at once) and
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
    mailbox: Mailbox,
    address: String,
    /// Per slot: the claimed state word last seen and since when (to free stale claims).
    claims: Vec<Option<(u32, Instant)>>,
    /// Where the next scan starts, so that no slot is starved.
    next_slot: usize,
    /// Largest ring capacity accepted from a dialer.
    max_ring_bytes: usize,
}

impl NamedListener {
    /// Creates the mailbox (`/dev/shm/vans-<uid>-<pid>-<ns>-<random>`, mode 0600).
    ///
    /// # Errors
    ///
    /// [`IpcError::ShmTooSmall`] when `/dev/shm` is full; [`IpcError::Os`] otherwise.
    pub fn bind() -> Result<NamedListener, IpcError> {
        let mailbox = Mailbox::create()?;
        let address = mailbox.name().address();
        Ok(NamedListener {
            mailbox,
            address,
            claims: vec![None; SLOT_COUNT],
            next_slot: 0,
            max_ring_bytes: MAX_RING_BYTES,
        })
    }

    /// The address dialers pass to [`super::connect`]: `shm:<mailbox name>`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The mailbox's segment name.
    pub fn name(&self) -> &SegmentName {
        self.mailbox.name()
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
            while let Some(name) = self.take_posted()? {
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
            let mailbox = &self.mailbox;
            notify::wait_adaptive(mailbox.listener_waiting(), ACCEPT_SPINS, remaining, || {
                (0..SLOT_COUNT)
                    .any(|i| {
                        let state = state_of(mailbox.slot_state(i).load(Ordering::Acquire));
                        state != EMPTY && state != CLAIMED
                    })
                    .then_some(WaitResult::Ready)
            });
        }
    }

    /// Scans the slots once: frees stale claims and returns the first posted name, the slot
    /// freed. A slot holding garbage is freed and reported.
    fn take_posted(&mut self) -> Result<Option<SegmentName>, IpcError> {
        let now = Instant::now();
        for step in 0..SLOT_COUNT {
            let index = (self.next_slot + step) % SLOT_COUNT;
            let state = self.mailbox.slot_state(index);
            let word = state.load(Ordering::Acquire);
            match state_of(word) {
                EMPTY => self.claims[index] = None,
                CLAIMED => match self.claims[index] {
                    Some((seen, since)) if seen == word => {
                        if now.duration_since(since) > CLAIM_TIMEOUT {
                            // A dialer died between claiming and posting.
                            let _ = state.compare_exchange(
                                word,
                                with_state(word, EMPTY),
                                Ordering::Relaxed,
                                Ordering::Relaxed,
                            );
                            self.claims[index] = None;
                        }
                    }
                    _ => self.claims[index] = Some((word, now)),
                },
                POSTED => {
                    self.claims[index] = None;
                    self.next_slot = index + 1;
                    let len = self.mailbox.slot_name_len(index).load(Ordering::Relaxed);
                    let mut bytes = [0u8; SLOT_NAME_BYTES];
                    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
                        let word = self
                            .mailbox
                            .slot_name_word(index, i)
                            .load(Ordering::Relaxed);
                        chunk.copy_from_slice(&word.to_le_bytes());
                    }
                    // Copied: free the slot before judging what it held.
                    if state
                        .compare_exchange(
                            word,
                            with_state(word, EMPTY),
                            Ordering::AcqRel,
                            Ordering::Relaxed,
                        )
                        .is_err()
                    {
                        // Rewritten under us (only a misbehaving process does that): skip.
                        continue;
                    }
                    let Some(name) = bytes.get(..len as usize) else {
                        return Err(IpcError::corrupt(format!(
                            "mailbox slot {index} claims a name of {len} bytes; a slot holds \
                             at most {SLOT_NAME_BYTES}"
                        )));
                    };
                    let name = std::str::from_utf8(name).map_err(|e| IpcError::BadName {
                        name: String::from_utf8_lossy(name).into_owned(),
                        reason: format!("mailbox slot {index} holds a name that is not UTF-8: {e}"),
                    })?;
                    return SegmentName::parse(name).map(Some);
                }
                unknown => {
                    self.claims[index] = None;
                    let _ = state.compare_exchange(
                        word,
                        with_state(word, EMPTY),
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    return Err(IpcError::corrupt(format!(
                        "mailbox slot {index} holds unknown state {unknown:#x} (word \
                         {word:#010x}); the slot was cleared"
                    )));
                }
            }
        }
        Ok(None)
    }
}

impl Drop for NamedListener {
    fn drop(&mut self) {
        // Dialers waiting for us see this within their wait slice and give up cleanly; the
        // mailbox's name goes with its segment (we created it).
        self.mailbox
            .u32_at(CLOSED_OFFSET)
            .store(1, Ordering::Release);
        notify::wake_always(self.mailbox.listener_waiting());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_words_keep_generations() {
        let first = next_claim(0);
        assert_eq!(state_of(first), CLAIMED);
        let posted = with_state(first, POSTED);
        assert_eq!(state_of(posted), POSTED);
        let freed = with_state(posted, EMPTY);
        assert_eq!(state_of(freed), EMPTY);
        let second = next_claim(freed);
        assert_ne!(second, first, "a new claim has a new generation");
        assert_eq!(state_of(second), CLAIMED);
        assert_eq!(state_of(next_claim(!STATE_MASK)), CLAIMED);
    }

    #[test]
    fn a_mailbox_opens_and_closes() {
        let listener = NamedListener::bind().unwrap();
        let name = *listener.name();
        assert!(listener.address().starts_with("shm:vans-"));
        let mailbox = Mailbox::open(&name).unwrap();
        assert!(!mailbox.is_closed());
        drop(listener);
        assert!(mailbox.is_closed());
        assert!(!name.path().exists(), "the listener removes its mailbox");
        let err = mailbox
            .post(&SegmentName::fresh().unwrap(), Instant::now())
            .unwrap_err();
        assert!(matches!(err, IpcError::Rendezvous { .. }), "{err}");
    }
}
