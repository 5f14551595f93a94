//! A single-producer single-consumer ring of records inside a [`Segment`].
//!
//! One ring carries frames in one direction between two processes; a peer pair uses two.
//! The creator calls [`create_ring`], passes the segment's descriptor to the peer, and each
//! side attaches its end: [`Producer::new`] or [`Consumer::new`] with `init = false`.
//!
//! # Layout
//!
//! The segment starts with a one-page header, then `capacity` data bytes (a power of two).
//! Offsets are in [`layout`]; every integer is in the host's byte order (both ends run on the
//! same host).
//!
//! | offset | size | field | written by |
//! | --- | --- | --- | --- |
//! | 0 | 8 | magic `b"VANSRING"` | creator, last, with `Release` |
//! | 8 | 4 | version ([`layout::VERSION`]) | creator |
//! | 16 | 8 | capacity in data bytes | creator |
//! | 64 | 8 | `head`: bytes ever written | producer (`Release`) |
//! | 128 | 8 | `tail`: bytes ever consumed | consumer (`Release`) |
//! | 192 | 4 | `consumer_waiting` futex word | consumer sets, producer clears |
//! | 256 | 4 | `producer_waiting` futex word | producer sets, consumer clears |
//! | 320 | 4 | `closed` (0 or 1) | either side |
//! | 4096 | capacity | records | producer |
//!
//! Each cursor and futex word sits on its own 64-byte cache line, so the two sides do not
//! false-share. A record is an 8-byte word `payload_len | flags << 32`, then the payload,
//! padded to a multiple of 8. A record never wraps: when it does not fit before the end of
//! the data area, the producer fills the rest with a [`WRAP`] record and continues at 0.
//! A message longer than [`Producer::max_record`] travels as several records: [`FIRST`] on
//! the first, [`LAST`] on the last, neither in between, both on a single-record message.
//!
//! # Memory ordering
//!
//! The producer copies the record, then stores `head` with `Release`; the consumer loads
//! `head` with `Acquire`, copies the record out, then stores `tail` with `Release`; the
//! producer loads `tail` with `Acquire` before reusing space. Sleeping and waking follow
//! the protocol in the `notify` module.
//!
//! # Soundness with a process on the other side
//!
//! The data area is only ever touched through raw-pointer copies (`copy_nonoverlapping`)
//! and the header only through atomics; no `&[u8]` or `&mut [u8]` ever covers shared bytes,
//! because the other process writes them without regard to Rust's aliasing rules. What
//! keeps the two sides apart is the SPSC range discipline: the producer writes only
//! `[head, tail + capacity)` and the consumer reads only `[tail, head)`, disjoint ranges, and
//! each range changes hands only through the release/acquire pair on the cursor. A peer that
//! breaks the discipline can at worst make us read garbage bytes, which is why every value
//! the peer controls (cursors, record words, header fields) is read once into a local,
//! validated, and clamped so that no access can leave the mapping: a bad value is an
//! [`IpcError::Corrupt`] (or [`IpcError::BadSegment`] at attach time), never a panic.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;

use crate::error::IpcError;
use crate::notify::{self, Doorbell, WaitResult};
use crate::segment::Segment;

/// Record flag: the first record of a message.
pub const FIRST: u32 = 1;
/// Record flag: the last record of a message.
pub const LAST: u32 = 2;
/// Record flag: padding up to the end of the data area; the next record starts at offset 0.
pub const WRAP: u32 = 4;

/// Default data capacity of a ring (8 MiB): room for several 1 MiB frames in flight.
pub const DEFAULT_RING_BYTES: usize = 8 << 20;
/// Smallest data capacity of a ring.
pub const MIN_RING_BYTES: usize = 4096;
/// Largest data capacity of a ring (4 GiB on 64-bit hosts, so a record stays below 4 GiB).
pub const MAX_RING_BYTES: usize = 1 << (if usize::BITS >= 64 { 32 } else { 30 });
/// Largest message a [`Consumer`] reassembles unless told otherwise (the wire format's
/// default largest frame).
pub const DEFAULT_MAX_MESSAGE: usize = van_core::wire::DEFAULT_MAX_FRAME as usize;

/// Byte offsets of the ring header; see the table in the module docs.
pub mod layout {
    /// Bytes before the data area (one page).
    pub const HEADER_BYTES: usize = 4096;
    /// `b"VANSRING"` read as a little-endian u64.
    pub const MAGIC: u64 = u64::from_le_bytes(*b"VANSRING");
    /// The ring format this build speaks.
    pub const VERSION: u32 = 1;
    /// Offset of the magic (u64).
    pub const MAGIC_OFFSET: usize = 0;
    /// Offset of the version (u32).
    pub const VERSION_OFFSET: usize = 8;
    /// Offset of the data capacity (u64).
    pub const CAPACITY_OFFSET: usize = 16;
    /// Offset of `head` (u64), bytes ever written.
    pub const HEAD_OFFSET: usize = 64;
    /// Offset of `tail` (u64), bytes ever consumed.
    pub const TAIL_OFFSET: usize = 128;
    /// Offset of the consumer's futex word (u32).
    pub const CONSUMER_WAITING_OFFSET: usize = 192;
    /// Offset of the producer's futex word (u32).
    pub const PRODUCER_WAITING_OFFSET: usize = 256;
    /// Offset of the `closed` word (u32).
    pub const CLOSED_OFFSET: usize = 320;
    /// Offset of the data area.
    pub const DATA_OFFSET: usize = HEADER_BYTES;
    /// Bytes of the word in front of every record.
    pub const RECORD_HEADER_BYTES: usize = 8;
}

use layout::{DATA_OFFSET, HEADER_BYTES, RECORD_HEADER_BYTES};

/// Creates a segment holding an initialised, empty ring of `capacity` data bytes (rounded up
/// to a power of two, at least [`MIN_RING_BYTES`]). Attach the ends with
/// [`Producer::new`]`(segment, false)` and [`Consumer::new`]`(segment, false)`, here or in
/// the peer after passing [`Segment::fd`].
///
/// ```no_run
/// # fn main() -> Result<(), van_ipc::IpcError> {
/// use std::sync::Arc;
/// use van_ipc::ring::{create_ring, Consumer, Producer, DEFAULT_RING_BYTES};
///
/// let segment = create_ring("worker9-to-server8", DEFAULT_RING_BYTES)?;
/// let mut producer = Producer::new(Arc::clone(&segment), false)?;
/// let mut consumer = Consumer::new(segment, false)?;
/// assert!(producer.try_push_parts(&[b"hello ", b"world"])?);
/// producer.wake_consumer();
/// let mut out = bytes::BytesMut::new();
/// assert!(consumer.try_pop(&mut out)?.is_some());
/// assert_eq!(&out[..], b"hello world");
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`IpcError::TooLarge`] when `capacity` exceeds [`MAX_RING_BYTES`]; [`IpcError::Os`] when
/// the segment cannot be created.
pub fn create_ring(name: &str, capacity: usize) -> Result<Arc<Segment>, IpcError> {
    let capacity = capacity.max(MIN_RING_BYTES);
    let capacity = match capacity.checked_next_power_of_two() {
        Some(c) if c <= MAX_RING_BYTES => c,
        _ => {
            return Err(IpcError::TooLarge {
                len: capacity,
                max: MAX_RING_BYTES,
            })
        }
    };
    let segment = Arc::new(Segment::create(name, HEADER_BYTES + capacity)?);
    Shared::attach(Arc::clone(&segment), true)?;
    Ok(segment)
}

/// Bytes a record with `len` payload bytes occupies.
fn record_size(len: usize) -> usize {
    RECORD_HEADER_BYTES + len.next_multiple_of(8)
}

/// The record word: payload length in the low half, flags in the high half.
fn record_word(len: u32, flags: u32) -> u64 {
    u64::from(len) | (u64::from(flags) << 32)
}

/// One end's view of a validated ring header.
#[derive(Debug)]
struct Shared {
    /// The mapping; at least `HEADER_BYTES + capacity` long.
    segment: Arc<Segment>,
    /// Data capacity: a power of two in `MIN_RING_BYTES..=MAX_RING_BYTES`.
    capacity: usize,
}

impl Shared {
    /// Validates (or with `init`, writes) the header of the ring in `segment`.
    fn attach(segment: Arc<Segment>, init: bool) -> Result<Shared, IpcError> {
        let len = segment.len();
        if len < HEADER_BYTES + MIN_RING_BYTES {
            return Err(IpcError::bad_segment(format!(
                "{len} bytes is too small for a ring (at least {} needed)",
                HEADER_BYTES + MIN_RING_BYTES
            )));
        }
        if init {
            let capacity = prev_power_of_two((len - HEADER_BYTES).min(MAX_RING_BYTES));
            let shared = Shared { segment, capacity };
            shared
                .header_u64(layout::HEAD_OFFSET)
                .store(0, Ordering::Relaxed);
            shared
                .header_u64(layout::TAIL_OFFSET)
                .store(0, Ordering::Relaxed);
            shared.consumer_waiting().store(0, Ordering::Relaxed);
            shared.producer_waiting().store(0, Ordering::Relaxed);
            shared.closed().store(0, Ordering::Relaxed);
            shared
                .header_u32(layout::VERSION_OFFSET)
                .store(layout::VERSION, Ordering::Relaxed);
            shared
                .header_u64(layout::CAPACITY_OFFSET)
                .store(capacity as u64, Ordering::Relaxed);
            shared
                .header_u64(layout::MAGIC_OFFSET)
                .store(layout::MAGIC, Ordering::Release);
            return Ok(shared);
        }
        // Check the header through a provisional view whose capacity is only used for the
        // header accessors (which need nothing but `len >= HEADER_BYTES`).
        let probe = Shared {
            segment,
            capacity: MIN_RING_BYTES,
        };
        let magic = probe
            .header_u64(layout::MAGIC_OFFSET)
            .load(Ordering::Acquire);
        if magic != layout::MAGIC {
            return Err(IpcError::bad_segment(format!(
                "bad ring magic {magic:#018x}, expected {:#018x}",
                layout::MAGIC
            )));
        }
        let version = probe
            .header_u32(layout::VERSION_OFFSET)
            .load(Ordering::Relaxed);
        if version != layout::VERSION {
            return Err(IpcError::bad_segment(format!(
                "unsupported ring version {version}; this build speaks version {}",
                layout::VERSION
            )));
        }
        let capacity = probe
            .header_u64(layout::CAPACITY_OFFSET)
            .load(Ordering::Relaxed);
        let fits = usize::try_from(capacity)
            .ok()
            .filter(|c| c.is_power_of_two() && (MIN_RING_BYTES..=MAX_RING_BYTES).contains(c))
            .filter(|c| HEADER_BYTES + c <= len);
        let Some(capacity) = fits else {
            return Err(IpcError::bad_segment(format!(
                "ring capacity {capacity} is not a power of two between {MIN_RING_BYTES} and \
                 {MAX_RING_BYTES} that fits the {len}-byte segment"
            )));
        };
        Ok(Shared {
            segment: probe.segment,
            capacity,
        })
    }

    /// The u64 header field at `offset`.
    fn header_u64(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset % 8 == 0 && offset + 8 <= HEADER_BYTES);
        // SAFETY: `attach` checked `segment.len() >= HEADER_BYTES`, every caller passes a
        // constant 8-aligned offset with `offset + 8 <= HEADER_BYTES`, and the mapping is
        // page-aligned, so the address is in bounds and aligned for `AtomicU64` (same layout
        // as `u64`). Shared bytes may be changed by the peer at any time, which atomics
        // permit; the reference cannot outlive `self`, which keeps the mapping alive.
        unsafe { &*self.segment.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// The u32 header field at `offset`.
    fn header_u32(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset % 4 == 0 && offset + 4 <= HEADER_BYTES);
        // SAFETY: as in `header_u64`, with 4-byte alignment and size.
        unsafe { &*self.segment.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    fn head(&self) -> &AtomicU64 {
        self.header_u64(layout::HEAD_OFFSET)
    }

    fn tail(&self) -> &AtomicU64 {
        self.header_u64(layout::TAIL_OFFSET)
    }

    fn consumer_waiting(&self) -> &AtomicU32 {
        self.header_u32(layout::CONSUMER_WAITING_OFFSET)
    }

    fn producer_waiting(&self) -> &AtomicU32 {
        self.header_u32(layout::PRODUCER_WAITING_OFFSET)
    }

    fn closed(&self) -> &AtomicU32 {
        self.header_u32(layout::CLOSED_OFFSET)
    }

    /// The data-area offset of a cursor: masked to the ring and to 8 bytes, so it is in
    /// bounds and aligned whatever the cursor holds.
    fn offset_of(&self, cursor: u64) -> usize {
        (cursor as usize) & (self.capacity - 1) & !7
    }

    /// The record word at data offset `offset` (as returned by `offset_of`).
    fn record_word_at(&self, offset: usize) -> &AtomicU64 {
        let offset = offset & (self.capacity - 1) & !7;
        // SAFETY: `offset` is 8-aligned and below `capacity`, and `attach` checked
        // `HEADER_BYTES + capacity <= segment.len()`, so the 8 bytes at
        // `DATA_OFFSET + offset` are inside the page-aligned mapping and aligned for
        // `AtomicU64`; atomics tolerate the peer writing them; the reference lives no longer
        // than `self`, which keeps the mapping alive.
        unsafe {
            &*self
                .segment
                .as_ptr()
                .add(DATA_OFFSET + offset)
                .cast::<AtomicU64>()
        }
    }

    /// Pointer to data offset `offset`; the caller keeps its access within the data area.
    fn data_at(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.capacity);
        // `wrapping_add` keeps this safe to compute; the callers' bounds make it in range.
        self.segment
            .as_ptr()
            .wrapping_add(DATA_OFFSET + offset.min(self.capacity))
    }

    fn max_record(&self) -> usize {
        self.capacity / 4
    }

    fn is_closed(&self) -> bool {
        self.closed().load(Ordering::Acquire) != 0
    }

    fn close(&self) {
        self.closed().store(1, Ordering::Release);
        notify::wake_always(self.consumer_waiting());
        notify::wake_always(self.producer_waiting());
    }

    /// Reads the peer-written cursors at attach time and checks they are consistent.
    fn initial_cursors(&self) -> Result<(u64, u64), IpcError> {
        let head = self.head().load(Ordering::Acquire);
        let tail = self.tail().load(Ordering::Acquire);
        if head % 8 != 0 || tail % 8 != 0 || head.wrapping_sub(tail) > self.capacity as u64 {
            return Err(IpcError::bad_segment(format!(
                "inconsistent ring cursors: head {head}, tail {tail}, capacity {}",
                self.capacity
            )));
        }
        Ok((head, tail))
    }
}

/// The largest power of two `<= n` (`n >= 1`).
fn prev_power_of_two(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// Copies `len` bytes of the concatenation of `parts`, starting `skip` bytes in, to `dst`.
///
/// # Safety
///
/// `dst` must be valid for writes of `len` bytes that nobody else reads or writes for the
/// duration, and must not overlap any part; the parts must hold `skip + len` bytes in total.
unsafe fn gather(mut dst: *mut u8, parts: &[&[u8]], mut skip: usize, mut len: usize) {
    for part in parts {
        if len == 0 {
            break;
        }
        let Some(rest) = part.get(skip..) else {
            skip -= part.len();
            continue;
        };
        skip = 0;
        let n = rest.len().min(len);
        // SAFETY: `rest` holds at least `n` bytes; the caller guarantees `dst` has room for
        // the `len >= n` bytes still to copy, exclusively, without overlapping the parts.
        unsafe {
            std::ptr::copy_nonoverlapping(rest.as_ptr(), dst, n);
            dst = dst.add(n);
        }
        len -= n;
    }
}

/// The writing end of a ring. One per ring; movable between threads.
#[derive(Debug)]
pub struct Producer {
    shared: Shared,
    /// The consumer's doorbell, when it waits on an async runtime (see [`Doorbell`]).
    consumer_bell: Option<Doorbell>,
    /// Bytes ever written; only this end writes `head`, so it is never re-read.
    head: u64,
    /// The last `tail` read from the ring (validated).
    cached_tail: u64,
}

impl Producer {
    /// Attaches the writing end of the ring in `segment`. `init = true` first writes a fresh
    /// header (capacity: the largest power of two that fits) — only for a segment nobody
    /// uses yet; `init = false` validates the header a creator wrote.
    ///
    /// # Errors
    ///
    /// [`IpcError::BadSegment`] when the segment is too small or its header is invalid.
    pub fn new(segment: Arc<Segment>, init: bool) -> Result<Producer, IpcError> {
        let shared = Shared::attach(segment, init)?;
        let (head, tail) = shared.initial_cursors()?;
        Ok(Producer {
            shared,
            consumer_bell: None,
            head,
            cached_tail: tail,
        })
    }

    /// Data capacity of the ring in bytes.
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// The largest payload of one record (a quarter of the capacity); larger messages are
    /// fragmented, see [`Producer::try_push_message`].
    pub fn max_record(&self) -> usize {
        self.shared.max_record()
    }

    /// Copies `chunk` as one record with `flags` ([`FIRST`] and/or [`LAST`]; other bits are
    /// ignored). Returns `Ok(false)`, having written nothing, when the ring has no room now.
    /// The consumer is not woken: call [`Producer::wake_consumer`] after a batch.
    ///
    /// # Errors
    ///
    /// [`IpcError::TooLarge`] when `chunk` is longer than [`Producer::max_record`];
    /// [`IpcError::Corrupt`] when the consumer's cursor is out of bounds.
    pub fn try_push(&mut self, chunk: &[u8], flags: u32) -> Result<bool, IpcError> {
        self.push_record(&[chunk], 0, chunk.len(), flags & (FIRST | LAST))
    }

    /// Copies a message given as parts (e.g. the encoded frame's `Bytes`) as one
    /// [`FIRST`]` | `[`LAST`] record, straight from the parts (no intermediate buffer).
    /// `Ok(false)` when there is no room now (nothing written).
    ///
    /// # Errors
    ///
    /// As [`Producer::try_push`], with the parts' total length.
    pub fn try_push_parts(&mut self, parts: &[&[u8]]) -> Result<bool, IpcError> {
        let len = total_len(parts, self.max_record())?;
        self.push_record(parts, 0, len, FIRST | LAST)
    }

    /// Pushes the next record of a message of any length given as parts: the bytes from
    /// `offset` of the parts' concatenation, up to [`Producer::max_record`] of them, flagged
    /// [`FIRST`] when `offset == 0` and [`LAST`] when they reach the end. Returns the offset
    /// to continue from (the message is complete when it equals the total length; an empty
    /// message is one empty record and returns `Some(0)`), or `None` when there is no room.
    ///
    /// ```no_run
    /// # fn send(p: &mut van_ipc::ring::Producer, parts: &[&[u8]]) -> Result<(), van_ipc::IpcError> {
    /// use std::time::Duration;
    /// let total: usize = parts.iter().map(|p| p.len()).sum();
    /// let mut offset = 0;
    /// loop {
    ///     match p.try_push_message(parts, offset)? {
    ///         Some(next) => {
    ///             offset = next;
    ///             if offset == total {
    ///                 break;
    ///             }
    ///         }
    ///         None => {
    ///             p.wake_consumer();
    ///             let want = (total - offset).min(p.max_record());
    ///             p.wait_for_space(want, 1000, Duration::from_secs(1));
    ///         }
    ///     }
    /// }
    /// p.wake_consumer();
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`IpcError::Corrupt`] when the consumer's cursor is out of bounds;
    /// [`IpcError::TooLarge`] only if the parts' lengths overflow `usize`.
    pub fn try_push_message(
        &mut self,
        parts: &[&[u8]],
        offset: usize,
    ) -> Result<Option<usize>, IpcError> {
        let total = total_len(parts, usize::MAX)?;
        if total == 0 {
            return Ok(self.push_record(parts, 0, 0, FIRST | LAST)?.then_some(0));
        }
        if offset >= total {
            return Ok(Some(total));
        }
        let len = (total - offset).min(self.max_record());
        let mut flags = 0;
        if offset == 0 {
            flags |= FIRST;
        }
        if offset + len == total {
            flags |= LAST;
        }
        Ok(self
            .push_record(parts, offset, len, flags)?
            .then_some(offset + len))
    }

    /// Bytes of the data area not holding unconsumed records (0 if the consumer's cursor is
    /// out of bounds). A record of `n` payload bytes needs `8 + n` rounded up to 8, plus the
    /// rest of the ring when it must wrap; [`Producer::wait_for_space`] accounts for that.
    pub fn free_bytes(&self) -> usize {
        let used = self
            .head
            .wrapping_sub(self.shared.tail().load(Ordering::Acquire));
        (self.shared.capacity as u64).saturating_sub(used) as usize
    }

    /// Wakes the consumer if it sleeps; a fence and a load when it does not.
    pub fn wake_consumer(&self) {
        notify::wake_or_ring(self.shared.consumer_waiting(), self.consumer_bell.as_ref());
    }

    /// Wakes the consumer through `bell` when it sleeps on it ([`Consumer::sleep_on_doorbell`])
    /// rather than on the futex: the doorbell its side passed at the handshake.
    pub fn set_consumer_doorbell(&mut self, bell: Doorbell) {
        self.consumer_bell = Some(bell);
    }

    /// Waits until a record of `bytes` payload bytes (at most [`Producer::max_record`]) would
    /// fit, spinning `spins` times, then sleeping on the futex until the consumer frees
    /// space, the ring is closed, or `timeout` passes. `Ready` is also returned when the
    /// consumer's cursor is corrupt, so that the next push reports it.
    pub fn wait_for_space(&self, bytes: usize, spins: u32, timeout: Duration) -> WaitResult {
        let need = self.space_needed(bytes.min(self.max_record()));
        let capacity = self.shared.capacity as u64;
        notify::wait_adaptive(self.shared.producer_waiting(), spins, timeout, || {
            if self.shared.is_closed() {
                return Some(WaitResult::Closed);
            }
            let used = self
                .head
                .wrapping_sub(self.shared.tail().load(Ordering::Acquire));
            (used > capacity || capacity - used >= need).then_some(WaitResult::Ready)
        })
    }

    /// Whether either side closed the ring.
    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }

    /// Marks the ring closed and wakes both sides. Records already pushed stay readable.
    pub fn close(&self) {
        self.shared.close();
        notify::always_wake_or_ring(self.shared.consumer_waiting(), self.consumer_bell.as_ref());
    }

    /// Ring bytes a record of `len` payload bytes needs at the current head, counting the
    /// wrap padding when it does not fit before the end.
    fn space_needed(&self, len: usize) -> u64 {
        let size = record_size(len) as u64;
        let to_end = (self.shared.capacity - self.shared.offset_of(self.head)) as u64;
        if size <= to_end {
            size
        } else {
            to_end + size
        }
    }

    /// Whether `need` bytes are free, re-reading (and validating) `tail` only if the cached
    /// value says no.
    fn has_room(&mut self, need: u64) -> Result<bool, IpcError> {
        let capacity = self.shared.capacity as u64;
        if capacity.saturating_sub(self.head.wrapping_sub(self.cached_tail)) >= need {
            return Ok(true);
        }
        let tail = self.shared.tail().load(Ordering::Acquire);
        let used = self.head.wrapping_sub(tail);
        if used > capacity {
            return Err(IpcError::corrupt(format!(
                "consumer cursor {tail} is not within {capacity} bytes behind head {}",
                self.head
            )));
        }
        self.cached_tail = tail;
        Ok(capacity - used >= need)
    }

    /// Writes one record of `len` bytes taken from `parts` at `skip`, with `flags`.
    fn push_record(
        &mut self,
        parts: &[&[u8]],
        skip: usize,
        len: usize,
        flags: u32,
    ) -> Result<bool, IpcError> {
        let max = self.max_record();
        if len > max {
            return Err(IpcError::TooLarge { len, max });
        }
        let size = record_size(len);
        let need = self.space_needed(len);
        if !self.has_room(need)? {
            return Ok(false);
        }
        let mut head = self.head;
        let mut offset = self.shared.offset_of(head);
        let to_end = self.shared.capacity - offset;
        if size > to_end {
            // `to_end >= 8` (offsets are 8-aligned) and `< capacity <= u32::MAX`.
            let pad = (to_end - RECORD_HEADER_BYTES) as u32;
            self.shared
                .record_word_at(offset)
                .store(record_word(pad, WRAP), Ordering::Relaxed);
            head += to_end as u64;
            offset = 0;
        }
        // `len <= max_record < u32::MAX`.
        self.shared
            .record_word_at(offset)
            .store(record_word(len as u32, flags), Ordering::Relaxed);
        let payload = self.shared.data_at(offset + RECORD_HEADER_BYTES);
        // SAFETY: `offset + size <= capacity` (it fits before the end, or wrapped to 0 and
        // `size <= capacity / 4 + 8`), so the `len` payload bytes lie in the data area.
        // `has_room` established that these bytes are behind the consumer's tail plus
        // capacity and at or after our unpublished head, so the consumer neither reads nor
        // writes them until we publish `head` below. The parts are caller memory outside
        // the ring, holding `skip + len` bytes (checked by the callers).
        unsafe { gather(payload, parts, skip, len) };
        head += size as u64;
        self.head = head;
        self.shared.head().store(head, Ordering::Release);
        Ok(true)
    }
}

/// Total length of `parts`; `TooLarge` beyond `max` or on overflow.
fn total_len(parts: &[&[u8]], max: usize) -> Result<usize, IpcError> {
    let mut total = 0usize;
    for part in parts {
        total = total.checked_add(part.len()).ok_or(IpcError::TooLarge {
            len: usize::MAX,
            max,
        })?;
    }
    if total > max {
        return Err(IpcError::TooLarge { len: total, max });
    }
    Ok(total)
}

/// The reading end of a ring. One per ring; movable between threads.
#[derive(Debug)]
pub struct Consumer {
    shared: Shared,
    /// Bytes ever consumed; only this end writes `tail`, so it is never re-read.
    tail: u64,
    /// The last validated `head`.
    cached_head: u64,
    /// Inside a fragmented message (a [`FIRST`] without its [`LAST`] seen).
    in_message: bool,
    /// Payload bytes of the current message so far.
    message_len: usize,
    /// Largest message reassembled before the ring is declared corrupt.
    max_message: usize,
}

impl Consumer {
    /// Attaches the reading end of the ring in `segment`; `init` as in [`Producer::new`].
    ///
    /// # Errors
    ///
    /// [`IpcError::BadSegment`] when the segment is too small or its header is invalid.
    pub fn new(segment: Arc<Segment>, init: bool) -> Result<Consumer, IpcError> {
        let shared = Shared::attach(segment, init)?;
        let (_, tail) = shared.initial_cursors()?;
        Ok(Consumer {
            shared,
            tail,
            cached_head: tail,
            in_message: false,
            message_len: 0,
            max_message: DEFAULT_MAX_MESSAGE,
        })
    }

    /// Data capacity of the ring in bytes.
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// Sets the largest message (sum of its records' payloads) accepted before
    /// [`Consumer::try_pop`] reports the ring corrupt; default [`DEFAULT_MAX_MESSAGE`]. Set it
    /// to the node's largest frame so a peer cannot grow a message without bound.
    pub fn set_max_message(&mut self, max: usize) {
        self.max_message = max;
    }

    /// Appends the next record's payload to `out` and returns its flags ([`FIRST`]/[`LAST`]);
    /// `Ok(None)` when the ring is empty. The space is released right after the copy and a
    /// sleeping producer is woken. A message is complete when a record with [`LAST`]
    /// arrives: with `out` empty at its [`FIRST`], `out` then holds exactly the message.
    ///
    /// # Errors
    ///
    /// [`IpcError::Corrupt`] when the producer's cursor or a record word is invalid, the
    /// fragments are out of order, or a message exceeds the maximum; drop the connection.
    pub fn try_pop(&mut self, out: &mut BytesMut) -> Result<Option<u32>, IpcError> {
        let capacity = self.shared.capacity as u64;
        let mut tail = self.tail;
        let mut available = self.cached_head.wrapping_sub(tail);
        if available == 0 {
            let head = self.shared.head().load(Ordering::Acquire);
            available = head.wrapping_sub(tail);
            if available == 0 {
                return Ok(None);
            }
            if available > capacity || available % 8 != 0 {
                return Err(IpcError::corrupt(format!(
                    "producer cursor {head} is not a multiple of 8 within {capacity} bytes \
                     ahead of tail {tail}"
                )));
            }
            self.cached_head = head;
        }
        let mut offset = self.shared.offset_of(tail);
        let (mut len, mut flags) = self.read_record_word(offset);
        if flags == WRAP {
            let to_end = self.shared.capacity - offset;
            if len as usize != to_end - RECORD_HEADER_BYTES || to_end as u64 > available {
                return Err(IpcError::corrupt(format!(
                    "wrap record at {offset} of length {len} does not end the ring of \
                     {capacity} bytes within the {available} bytes published"
                )));
            }
            tail += to_end as u64;
            available -= to_end as u64;
            if available == 0 {
                self.release(tail);
                return Ok(None);
            }
            offset = 0;
            (len, flags) = self.read_record_word(offset);
        }
        if flags & !(FIRST | LAST) != 0 {
            return Err(IpcError::corrupt(format!(
                "record at {offset} has unknown flags {flags:#x}"
            )));
        }
        let len = len as usize;
        let size = record_size(len);
        if len > self.shared.max_record()
            || size > self.shared.capacity - offset
            || size as u64 > available
        {
            return Err(IpcError::corrupt(format!(
                "record at {offset} of {len} bytes exceeds the ring (max record {}, {} bytes \
                 to the end, {available} published)",
                self.shared.max_record(),
                self.shared.capacity - offset
            )));
        }
        let first = flags & FIRST != 0;
        if first == self.in_message {
            return Err(IpcError::corrupt(if first {
                "a message began before the previous one ended"
            } else {
                "a continuation record arrived outside a message"
            }));
        }
        let message_len = if first {
            len
        } else {
            self.message_len.saturating_add(len)
        };
        if message_len > self.max_message {
            return Err(IpcError::corrupt(format!(
                "message of at least {message_len} bytes exceeds the limit of {} bytes \
                 (VANS_MAX_FRAME_BYTES)",
                self.max_message
            )));
        }
        out.reserve(len);
        let source = self.shared.data_at(offset + RECORD_HEADER_BYTES);
        // SAFETY: `offset + size <= capacity` was checked, so the `len` source bytes are in
        // the data area; they are behind the published head (`size <= available`), so the
        // producer does not write them until we release them below. `out` has at least
        // `len` bytes of spare capacity after `reserve`, private to us, not overlapping the
        // mapping; `set_len` then covers exactly the bytes just initialised.
        unsafe {
            std::ptr::copy_nonoverlapping(
                source,
                out.spare_capacity_mut().as_mut_ptr().cast::<u8>(),
                len,
            );
            out.set_len(out.len() + len);
        }
        let last = flags & LAST != 0;
        self.in_message = !last;
        self.message_len = if last { 0 } else { message_len };
        self.release(tail + size as u64);
        Ok(Some(flags))
    }

    /// Waits until a record is available, spinning `spins` times, then sleeping on the
    /// futex until the producer publishes, the ring is closed (and drained), or `timeout`
    /// passes.
    pub fn wait_for_data(&self, spins: u32, timeout: Duration) -> WaitResult {
        notify::wait_adaptive(self.shared.consumer_waiting(), spins, timeout, || {
            self.poll_data()
        })
    }

    /// Whether either side closed the ring (records may still be waiting to be read).
    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }

    /// What [`Consumer::wait_for_data`] would return now without waiting: `Some(Ready)`
    /// when a record is available, `Some(Closed)` when the ring is closed and drained,
    /// `None` when there is nothing yet.
    pub fn poll_data(&self) -> Option<WaitResult> {
        if self.cached_head != self.tail || self.shared.head().load(Ordering::Acquire) != self.tail
        {
            Some(WaitResult::Ready)
        } else if self.shared.is_closed() {
            Some(WaitResult::Closed)
        } else {
            None
        }
    }

    /// Announces that this consumer is about to sleep on its doorbell (the one its producer
    /// got with [`Producer::set_consumer_doorbell`]) and checks once more: `None` means
    /// sleep (the producer will ring it after its next publication), `Some` that there is no
    /// need. Await the doorbell, [`clear`](Doorbell::clear) it, then pop again.
    pub fn sleep_on_doorbell(&self) -> Option<WaitResult> {
        let word = self.shared.consumer_waiting();
        word.store(notify::DOORBELL, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
        let ready = self.poll_data();
        if ready.is_some() {
            word.store(0, Ordering::Relaxed);
        }
        ready
    }

    /// Marks the ring closed and wakes both sides.
    pub fn close(&self) {
        self.shared.close();
    }

    /// Reads the record word at `offset` once: (payload length, flags).
    fn read_record_word(&self, offset: usize) -> (u32, u32) {
        let word = self.shared.record_word_at(offset).load(Ordering::Relaxed);
        (word as u32, (word >> 32) as u32)
    }

    /// Publishes `tail` and wakes a producer waiting for space.
    fn release(&mut self, tail: u64) {
        self.tail = tail;
        self.shared.tail().store(tail, Ordering::Release);
        notify::wake_if_waiting(self.shared.producer_waiting());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(capacity: usize) -> (Arc<Segment>, Producer, Consumer) {
        let segment = create_ring("unit", capacity).unwrap();
        let producer = Producer::new(Arc::clone(&segment), false).unwrap();
        let consumer = Consumer::new(Arc::clone(&segment), false).unwrap();
        (segment, producer, consumer)
    }

    #[test]
    fn capacity_is_rounded_up_to_a_power_of_two() {
        let (segment, producer, consumer) = pair(5000);
        assert_eq!(producer.capacity(), 8192);
        assert_eq!(consumer.capacity(), 8192);
        assert_eq!(segment.len(), HEADER_BYTES + 8192);
        assert_eq!(producer.max_record(), 2048);
        let (_, small, _) = pair(1);
        assert_eq!(small.capacity(), MIN_RING_BYTES);
        assert!(matches!(
            create_ring("huge", MAX_RING_BYTES + 1),
            Err(IpcError::TooLarge { .. })
        ));
    }

    #[test]
    fn init_on_a_plain_segment_uses_the_largest_power_of_two() {
        let segment = Arc::new(Segment::create("plain", HEADER_BYTES + 12000).unwrap());
        let producer = Producer::new(Arc::clone(&segment), true).unwrap();
        assert_eq!(producer.capacity(), 8192);
        assert_eq!(Consumer::new(segment, false).unwrap().capacity(), 8192);
        let tiny = Arc::new(Segment::create("tiny", HEADER_BYTES + 100).unwrap());
        assert!(matches!(
            Producer::new(tiny, true),
            Err(IpcError::BadSegment { .. })
        ));
    }

    #[test]
    fn an_uninitialised_segment_is_rejected() {
        let segment = Arc::new(Segment::create("blank", HEADER_BYTES + 8192).unwrap());
        let err = Consumer::new(segment, false).unwrap_err();
        assert!(err.to_string().contains("magic"), "{err}");
    }

    #[test]
    fn records_round_trip_with_wrap() {
        let (_segment, mut producer, mut consumer) = pair(MIN_RING_BYTES);
        let mut out = BytesMut::new();
        for round in 0..100u32 {
            let message = vec![round as u8; 700 + round as usize];
            assert!(producer.try_push(&message, FIRST | LAST).unwrap());
            assert_eq!(consumer.try_pop(&mut out).unwrap(), Some(FIRST | LAST));
            assert_eq!(&out[..], &message[..]);
            out.clear();
        }
        assert_eq!(consumer.try_pop(&mut out).unwrap(), None);
    }

    #[test]
    fn ends_move_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Producer>();
        assert_send_sync::<Consumer>();
        assert_send_sync::<Segment>();
    }

    #[test]
    fn record_geometry() {
        assert_eq!(record_size(0), 8);
        assert_eq!(record_size(1), 16);
        assert_eq!(record_size(8), 16);
        assert_eq!(record_size(9), 24);
        assert_eq!(prev_power_of_two(12000), 8192);
        assert_eq!(prev_power_of_two(8192), 8192);
    }

    #[test]
    fn gather_copies_across_parts() {
        let parts: [&[u8]; 3] = [b"abc", b"", b"defgh"];
        let mut out = [0u8; 4];
        // SAFETY: `out` has room for 4 bytes; the parts hold 2 + 4 bytes.
        unsafe { gather(out.as_mut_ptr(), &parts, 2, 4) };
        assert_eq!(&out, b"cdef");
    }
}
