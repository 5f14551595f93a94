//! The listener's accept queue: a file in `/dev/shm`, named by the listener's address, with
//! slots where dialers post the names of the connection segments they created, a futex word
//! that wakes the listener, and a `closed` word. Its byte layout is
//! [`layout::accept_queue`](super::layout::accept_queue); the
//! [`NamedListener`](super::NamedListener) owns one and takes the posts.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::layout::accept_queue::{
    BYTES, CLAIMED, CLOSED_OFFSET, EMPTY, LISTENER_WAITING_OFFSET, MAGIC, MAGIC_OFFSET, POSTED,
    SLOTS_OFFSET, SLOT_BYTES, SLOT_BYTES_OFFSET, SLOT_COUNT, SLOT_COUNT_OFFSET, SLOT_NAME_BYTES,
    SLOT_NAME_LEN_OFFSET, SLOT_NAME_OFFSET, SLOT_STATE_OFFSET, STATE_MASK, VERSION, VERSION_OFFSET,
};
use super::{NamedSegment, SegmentName};
use crate::error::IpcError;
use crate::notify;

/// A slot claimed but not posted for this long belongs to a dialer that died mid-post: the
/// listener frees it.
const CLAIM_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between scans when a dialer finds every slot busy.
const BUSY_SLOTS_PAUSE: Duration = Duration::from_millis(1);
/// Words of a slot's name area.
const NAME_WORDS: usize = SLOT_NAME_BYTES / 8;

/// A validated view of an accept-queue segment.
#[derive(Debug)]
pub(super) struct AcceptQueue {
    /// At least [`BYTES`] long.
    segment: NamedSegment,
}

/// What the listener remembers of the slots between scans: per slot, the claimed state word
/// last seen and since when (to free claims a dead dialer left), and where the next scan
/// starts (so that no slot is starved).
#[derive(Debug)]
pub(super) struct Scan {
    claims: Vec<Option<(u32, Instant)>>,
    next_slot: usize,
}

impl Scan {
    /// Nothing seen yet.
    pub(super) fn new() -> Scan {
        Scan {
            claims: vec![None; SLOT_COUNT],
            next_slot: 0,
        }
    }
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

impl AcceptQueue {
    /// Creates an empty accept queue (a fresh named segment).
    pub(super) fn create() -> Result<AcceptQueue, IpcError> {
        let queue = AcceptQueue {
            segment: NamedSegment::create(BYTES)?,
        };
        // The file starts zeroed: every slot is EMPTY, `closed` is 0.
        queue
            .u32_at(VERSION_OFFSET)
            .store(VERSION, Ordering::Relaxed);
        queue
            .u32_at(SLOT_COUNT_OFFSET)
            .store(SLOT_COUNT as u32, Ordering::Relaxed);
        queue
            .u32_at(SLOT_BYTES_OFFSET)
            .store(SLOT_BYTES as u32, Ordering::Relaxed);
        queue.u64_at(MAGIC_OFFSET).store(MAGIC, Ordering::Release);
        Ok(queue)
    }

    /// Opens the accept queue `name` and validates its header.
    pub(super) fn open(name: &SegmentName) -> Result<AcceptQueue, IpcError> {
        let segment = NamedSegment::open(name, BYTES)?;
        if segment.len() != BYTES {
            return Err(IpcError::bad_segment(format!(
                "accept queue {name} has {} bytes, expected {BYTES}",
                segment.len()
            )));
        }
        let queue = AcceptQueue { segment };
        let magic = queue.u64_at(MAGIC_OFFSET).load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(IpcError::bad_segment(format!(
                "{name} is not a vans accept queue: bad magic {magic:#018x}, expected \
                 {MAGIC:#018x}"
            )));
        }
        let version = queue.u32_at(VERSION_OFFSET).load(Ordering::Relaxed);
        if version != VERSION {
            return Err(IpcError::bad_segment(format!(
                "accept queue {name} has version {version}; this build speaks version {VERSION}"
            )));
        }
        let slots = queue.u32_at(SLOT_COUNT_OFFSET).load(Ordering::Relaxed);
        let slot_bytes = queue.u32_at(SLOT_BYTES_OFFSET).load(Ordering::Relaxed);
        if slots as usize != SLOT_COUNT || slot_bytes as usize != SLOT_BYTES {
            return Err(IpcError::bad_segment(format!(
                "accept queue {name} has {slots} slots of {slot_bytes} bytes; expected \
                 {SLOT_COUNT} of {SLOT_BYTES}"
            )));
        }
        Ok(queue)
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
        self.u32_at(AcceptQueue::slot(index) + SLOT_STATE_OFFSET)
    }

    fn slot_name_len(&self, index: usize) -> &AtomicU32 {
        self.u32_at(AcceptQueue::slot(index) + SLOT_NAME_LEN_OFFSET)
    }

    fn slot_name_word(&self, index: usize, word: usize) -> &AtomicU64 {
        self.u64_at(AcceptQueue::slot(index) + SLOT_NAME_OFFSET + (word % NAME_WORDS) * 8)
    }

    /// The futex word the listener sleeps on and dialers wake.
    pub(super) fn listener_waiting(&self) -> &AtomicU32 {
        self.u32_at(LISTENER_WAITING_OFFSET)
    }

    /// Whether the listener has closed (or a peer scribbled on the word: either way, do
    /// not post).
    pub(super) fn is_closed(&self) -> bool {
        self.u32_at(CLOSED_OFFSET).load(Ordering::Acquire) != 0
    }

    /// Whether the listener's process is gone. Its creator holds the owner lock (an
    /// exclusive `flock`) for as long as it lives, taken before it wrote the magic that
    /// [`open`](Self::open) checked; the kernel drops it with the process, even on kill -9.
    /// Tried without blocking through this process's own descriptor, and released at once.
    /// A cleaner probing the lock at the same moment makes the listener look alive, never
    /// dead.
    pub(super) fn owner_gone(&self) -> bool {
        let fd = self.segment.fd();
        match rustix::fs::flock(fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {
                let _ = rustix::fs::flock(fd, rustix::fs::FlockOperation::Unlock);
                true
            }
            Err(_) => false,
        }
    }

    /// The accept queue's name.
    pub(super) fn name(&self) -> &SegmentName {
        self.segment.name()
    }

    /// Posts `name` in a free slot and wakes the listener; while every slot is busy, retries
    /// until `deadline`.
    pub(super) fn post(&self, name: &SegmentName, deadline: Instant) -> Result<(), IpcError> {
        let text = name.to_string();
        let bytes = text.as_bytes();
        if bytes.len() > SLOT_NAME_BYTES {
            // Cannot happen for a valid name (at most MAX_NAME_BYTES); refuse rather than cut.
            return Err(IpcError::BadName {
                name: text.clone(),
                reason: format!("longer than the {SLOT_NAME_BYTES} bytes of an accept-queue slot"),
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
                    "all {SLOT_COUNT} accept-queue slots stayed busy until the timeout; the \
                     listener is not accepting"
                )));
            }
            std::thread::sleep(BUSY_SLOTS_PAUSE);
        }
    }

    /// Whether a slot holds something for the listener: a posted name, or garbage that
    /// [`take_posted`](Self::take_posted) frees and reports.
    pub(super) fn has_posted(&self) -> bool {
        (0..SLOT_COUNT).any(|i| {
            let state = state_of(self.slot_state(i).load(Ordering::Acquire));
            state != EMPTY && state != CLAIMED
        })
    }

    /// The listener's scan: frees stale claims and returns the first posted name, the slot
    /// freed. A slot holding garbage is freed and reported.
    pub(super) fn take_posted(&self, scan: &mut Scan) -> Result<Option<SegmentName>, IpcError> {
        let now = Instant::now();
        for step in 0..SLOT_COUNT {
            let index = (scan.next_slot + step) % SLOT_COUNT;
            let state = self.slot_state(index);
            let word = state.load(Ordering::Acquire);
            match state_of(word) {
                EMPTY => scan.claims[index] = None,
                CLAIMED => match scan.claims[index] {
                    Some((seen, since)) if seen == word => {
                        if now.duration_since(since) > CLAIM_TIMEOUT {
                            // A dialer died between claiming and posting.
                            let _ = state.compare_exchange(
                                word,
                                with_state(word, EMPTY),
                                Ordering::Relaxed,
                                Ordering::Relaxed,
                            );
                            scan.claims[index] = None;
                        }
                    }
                    _ => scan.claims[index] = Some((word, now)),
                },
                POSTED => {
                    scan.claims[index] = None;
                    scan.next_slot = index + 1;
                    let len = self.slot_name_len(index).load(Ordering::Relaxed);
                    let mut bytes = [0u8; SLOT_NAME_BYTES];
                    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
                        let word = self.slot_name_word(index, i).load(Ordering::Relaxed);
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
                            "accept-queue slot {index} claims a name of {len} bytes; a slot holds \
                             at most {SLOT_NAME_BYTES}"
                        )));
                    };
                    let name = std::str::from_utf8(name).map_err(|e| IpcError::BadName {
                        name: String::from_utf8_lossy(name).into_owned(),
                        reason: format!(
                            "accept-queue slot {index} holds a name that is not UTF-8: {e}"
                        ),
                    })?;
                    return SegmentName::parse(name).map(Some);
                }
                unknown => {
                    scan.claims[index] = None;
                    let _ = state.compare_exchange(
                        word,
                        with_state(word, EMPTY),
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    return Err(IpcError::corrupt(format!(
                        "accept-queue slot {index} holds unknown state {unknown:#x} (word \
                         {word:#010x}); the slot was cleared"
                    )));
                }
            }
        }
        Ok(None)
    }

    /// Marks the queue closed and wakes the listener's futex: dialers waiting on it see this
    /// within their wait slice and give up cleanly.
    pub(super) fn close(&self) {
        self.u32_at(CLOSED_OFFSET).store(1, Ordering::Release);
        notify::wake_always(self.listener_waiting());
    }

    fn refused(&self, reason: &str) -> IpcError {
        IpcError::Rendezvous {
            address: self.name().address(),
            reason: reason.to_owned(),
        }
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
}
