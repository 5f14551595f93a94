//! A generation's shared segment as this rank maps it: the header's words, the slots, and
//! the identity rank 0 writes and the others check.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use van_ipc::Segment;

use std::time::Duration;

use super::signal::{Signals, Stopped, WORDS_PER_LINE};
use crate::error::CollectiveError;
use crate::spin::Spin;

const MAGIC: u64 = u64::from_le_bytes(*b"vanscoll");
/// Header words: magic, token, ranks and slot bytes at 0, 8, 16, 24; abort, sleepers and
/// the futex word each on its own cache line; then one line per rank: its progress counter
/// (word 0) and, per slot parity, the signature of the collective whose chunk it wrote there
/// (words 1, 2), where an all-reduce's chunk lies (words 3, 4; see
/// [`Rounds::publish_from`]) and the call in plain words, for a mismatch's message (words 5,
/// 6; [`call_word`]).
const ABORT: usize = 64;
const SLEEPERS: usize = 128;
const EPOCH: usize = 192;
const STEPS: usize = 256;
pub(super) const LINE: usize = 64;
// The signals read a rank's line as `u64` words.
const _: () = assert!(LINE == WORDS_PER_LINE * 8);
const PAGE: usize = 4096;

/// A generation's shared segment, mapped by this rank.
pub(crate) struct Group {
    pub(super) segment: Segment,
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) slot_bytes: usize,
    pub(super) header_bytes: usize,
    /// The ranks' process ids (same pid namespace), to notice a rank that died.
    pub(super) pids: Vec<i32>,
    /// What a wait does before it sleeps.
    pub(super) spin: Spin,
    /// Phases this rank finished; every rank goes through the same sequence.
    pub(super) step: AtomicU64,
    /// Chunks this rank put through, for the slot parity.
    pub(super) chunks: AtomicU64,
    /// The ranks' shared arenas, where buffers from `Postoffice::alloc` lie.
    pub(super) arenas: Arenas,
}

/// The ranks' shared arenas (the IPC van's memory, which `Postoffice::alloc` hands out): a
/// rank whose all-reduce chunk lies in its arena publishes where, instead of copying it into
/// its slot, and the others read it there ([`super::reduce`]).
#[derive(Default)]
pub(crate) struct Arenas {
    /// This rank's arena, as it maps it.
    pub(super) mine: Option<van_core::buf::SharedRegion>,
    /// Every other rank's arena, as this rank maps it (`None` for this rank, or a rank
    /// without one).
    pub(super) theirs: Vec<Option<Segment>>,
}

impl Arenas {
    /// Where `part` lies in this rank's arena, when it does.
    pub(super) fn offset_of<T>(&self, part: &[T]) -> Option<u64> {
        let bytes = std::mem::size_of_val(part);
        let offset = self.mine?.offset_of(part.as_ptr().cast(), bytes)?;
        Some(offset as u64)
    }
}

/// The origin word of a chunk copied into its rank's slot.
pub(super) const IN_SLOT: u64 = u64::MAX;

impl Group {
    fn word<T>(&self, offset: usize) -> &T {
        // SAFETY: every offset used is below `header_bytes` (within the mapping, which lives
        // as long as `self`) and aligned for `T` (the mapping is page-aligned and the offsets
        // are multiples of 8); atomics may be shared with other processes.
        unsafe { &*(self.segment.as_ptr().add(offset) as *const T) }
    }

    pub(super) fn signals(&self) -> Signals<'_> {
        // SAFETY: the ranks' lines lie within the header (`layout` sized it), start at a
        // multiple of 8 and hold `u64` words only; atomics may be shared with other processes.
        let lines = unsafe {
            std::slice::from_raw_parts(
                self.segment.as_ptr().add(STEPS) as *const AtomicU64,
                self.size * WORDS_PER_LINE,
            )
        };
        Signals {
            lines,
            abort: self.word::<AtomicU32>(ABORT),
            sleepers: self.word::<AtomicU32>(SLEEPERS),
            epoch: self.word::<AtomicU32>(EPOCH),
        }
    }

    /// Slot `parity` of rank `q`.
    pub(super) fn slot(&self, q: usize, parity: usize) -> *mut u8 {
        let offset = self.header_bytes + (2 * q + parity) * self.slot_bytes;
        // `wrapping_add` keeps this safe; `layout` sized the mapping to hold every slot.
        self.segment.as_ptr().wrapping_add(offset)
    }

    /// The signature rank `q` wrote for its chunk in slots of `parity`.
    fn signature(&self, q: usize, parity: usize) -> &AtomicU64 {
        self.word::<AtomicU64>(STEPS + q * LINE + 8 + 8 * parity)
    }

    /// What rank `q` published of the call whose chunk it wrote in slots of `parity`
    /// ([`call_word`]), beside its signature.
    fn call(&self, q: usize, parity: usize) -> &AtomicU64 {
        self.word::<AtomicU64>(STEPS + q * LINE + 40 + 8 * parity)
    }

    /// Where rank `q`'s all-reduce chunk of `parity` lies: [`IN_SLOT`], or its offset in
    /// `q`'s arena.
    fn origin(&self, q: usize, parity: usize) -> &AtomicU64 {
        self.word::<AtomicU64>(STEPS + q * LINE + 24 + 8 * parity)
    }

    /// Where rank `q`'s all-reduce chunk of `parity`, `len` elements, lies, as published
    /// (after the chunk's first wait): its slot, or a place in its arena, which must lie
    /// wholly in the arena as this rank maps it. `own` is where this rank's own chunk lies
    /// when it published an offset.
    ///
    /// # Errors
    ///
    /// [`Stopped::Corrupt`] for an offset that is not in `q`'s arena.
    pub(super) fn source<T>(
        &self,
        q: usize,
        parity: usize,
        len: usize,
        own: *mut T,
    ) -> Result<*const T, Stopped> {
        let origin = self.origin(q, parity).load(Ordering::Relaxed);
        if origin == IN_SLOT {
            return Ok(self.slot(q, parity) as *const T);
        }
        if q == self.rank {
            return Ok(own.cast_const());
        }
        let arena = self.arenas.theirs.get(q).and_then(Option::as_ref);
        let bytes = len.saturating_mul(std::mem::size_of::<T>());
        match (arena, usize::try_from(origin)) {
            (Some(arena), Ok(at))
                if at.checked_add(bytes).is_some_and(|end| end <= arena.len())
                    && at % std::mem::align_of::<T>() == 0 =>
            {
                // `wrapping_add` keeps this safe; the bounds were checked above.
                Ok(arena.as_ptr().wrapping_add(at) as *const T)
            }
            _ => Err(Stopped::Corrupt(q)),
        }
    }

    /// Stops every rank's waits in this group (the generation ended for this one), naming
    /// the generation rank that `failed` when known.
    pub(crate) fn abort(&self, failed: Option<usize>) {
        self.signals().abort(failed);
    }
}

/// Header and total bytes of a segment for `size` ranks with slots of `slot_bytes`.
pub(super) fn layout(size: usize, slot_bytes: usize) -> Option<(usize, usize)> {
    let header = (STEPS + size.checked_mul(LINE)?).div_ceil(PAGE) * PAGE;
    let total = header.checked_add(size.checked_mul(2)?.checked_mul(slot_bytes)?)?;
    Some((header, total))
}

impl Group {
    /// Rank `rank` of `size` on `segment`, with slots of `slot_bytes` (whole cache lines).
    pub(super) fn new(
        segment: Segment,
        rank: usize,
        size: usize,
        slot_bytes: usize,
        pids: Vec<i32>,
        spin: Spin,
    ) -> std::result::Result<Group, String> {
        let (header_bytes, total) =
            layout(size, slot_bytes).ok_or("the segment would be too large")?;
        // A slot holds a piece of every rank's block in a reduce-scatter: at least a line each.
        if segment.len() != total
            || slot_bytes % LINE != 0
            || slot_bytes < size.saturating_mul(LINE)
            || rank >= size
        {
            return Err(format!(
                "a segment of {} bytes is not one of {total} for {size} ranks",
                segment.len()
            ));
        }
        Ok(Group {
            segment,
            rank,
            size,
            slot_bytes,
            header_bytes,
            pids,
            spin,
            step: AtomicU64::new(0),
            chunks: AtomicU64::new(0),
            arenas: Arenas::default(),
        })
    }

    fn identity(&self) -> [&AtomicU64; 4] {
        [0, 1, 2, 3].map(|i| self.word::<AtomicU64>(8 * i))
    }

    fn expected(&self, token: u64) -> [u64; 4] {
        [MAGIC, token, self.size as u64, self.slot_bytes as u64]
    }

    /// Rank 0 writes the header's identity, before anyone can open the segment.
    pub(super) fn write_header(&self, token: u64) {
        for (word, value) in self.identity().into_iter().zip(self.expected(token)) {
            word.store(value, Ordering::Release);
        }
    }

    /// The other ranks check the identity is what the exchange said.
    pub(super) fn check_header(&self, token: u64) -> std::result::Result<(), String> {
        let seen = self.identity().map(|word| word.load(Ordering::Acquire));
        if seen != self.expected(token) {
            return Err("the segment opened through /proc is not rank 0's (token differs)".into());
        }
        Ok(())
    }
}

/// One collective's walk through a group: chunk by chunk, each written to the slots of one
/// parity, published, and awaited, with this rank's progress counter carried along. The
/// first publication of each chunk carries the collective's *signature* (its number, kind,
/// element type and length), which the first wait compares with every rank's: ranks that
/// call different collectives, or one with other lengths, fail with
/// [`CollectiveError::Mismatch`] rather than mix their buffers.
pub(super) struct Rounds<'g> {
    pub(super) g: &'g Group,
    signals: Signals<'g>,
    signature: u64,
    /// This rank's call, published with the signature for a rank that finds a mismatch to
    /// name what it runs ([`call_word`]; 0: not said).
    call: u64,
    step: u64,
    /// How long each wait may take (`VANS_COLLECTIVE_TIMEOUT`).
    timeout: Duration,
    alive: &'g dyn Fn() -> Result<(), CollectiveError>,
}

impl<'g> Rounds<'g> {
    pub(super) fn new(
        g: &'g Group,
        signature: u64,
        timeout: Duration,
        alive: &'g dyn Fn() -> Result<(), CollectiveError>,
    ) -> Rounds<'g> {
        Rounds {
            g,
            signals: g.signals(),
            signature,
            call: 0,
            step: g.step.load(Ordering::Relaxed),
            timeout,
            alive,
        }
    }

    /// These rounds, publishing `call` ([`call_word`]) beside their signature.
    pub(super) fn saying(self, call: u64) -> Rounds<'g> {
        Rounds { call, ..self }
    }

    /// The parity of the next chunk's slots.
    pub(super) fn next_chunk(&self) -> usize {
        (self.g.chunks.fetch_add(1, Ordering::Relaxed) % 2) as usize
    }

    /// Publishes this rank's next step; with `parity`, the first of a chunk, with the
    /// signature.
    pub(super) fn publish(&mut self, parity: Option<usize>) {
        if let Some(p) = parity {
            self.g
                .call(self.g.rank, p)
                .store(self.call, Ordering::Relaxed);
            self.g
                .signature(self.g.rank, p)
                .store(self.signature, Ordering::Relaxed);
        }
        self.step += 1;
        self.signals.publish(self.g.rank, self.step);
        self.g.step.store(self.step, Ordering::Relaxed);
    }

    /// Publishes the first step of an all-reduce chunk of `parity`, which lies in this
    /// rank's slot (`origin` `None`) or at offset `origin` of its arena.
    pub(super) fn publish_from(&mut self, parity: usize, origin: Option<u64>) {
        self.g
            .origin(self.g.rank, parity)
            .store(origin.unwrap_or(IN_SLOT), Ordering::Relaxed);
        self.publish(Some(parity));
    }

    /// Fails when a rank aborted: after reads of another rank's buffer (in its arena), so
    /// that a rank that gave up, and aborted before its caller got the buffer back, never
    /// has its caller's new bytes taken for its chunk (the fence orders the reads before
    /// the look, as the aborting rank's orders its abort before its return).
    pub(super) fn check_abort(&self) -> Result<(), Stopped> {
        std::sync::atomic::fence(Ordering::SeqCst);
        match self.signals.aborted() {
            Some(failed) => Err(Stopped::Aborted(failed)),
            None => Ok(()),
        }
    }

    /// Waits until every rank published this step; with `parity`, checks their signatures.
    pub(super) fn wait_all(&self, parity: Option<usize>) -> Result<(), Stopped> {
        let (g, s) = (self.g, &self.signals);
        s.wait_all(g.rank, self.step, g.spin, self.timeout, self.alive)?;
        match parity {
            Some(p) => self.check(0..g.size, p),
            None => Ok(()),
        }
    }

    /// Waits until rank `q` published this step (checking its signature in `parity`).
    pub(super) fn wait_for(&self, q: usize, parity: usize) -> Result<(), Stopped> {
        let g = self.g;
        let ranks = std::iter::once(q).filter(|&q| q != g.rank);
        for q in ranks.clone() {
            self.signals
                .wait_one(q, self.step, g.spin, self.timeout, self.alive)?;
        }
        self.check(ranks, parity)
    }

    fn check(&self, ranks: impl Iterator<Item = usize>, parity: usize) -> Result<(), Stopped> {
        for q in ranks {
            // Published (Release) before the counter this rank waited for (Acquire).
            if self.g.signature(q, parity).load(Ordering::Relaxed) != self.signature {
                let theirs = self.g.call(q, parity).load(Ordering::Relaxed);
                return Err(Stopped::Mismatch(q, theirs));
            }
        }
        Ok(())
    }
}

/// A call as a rank publishes it beside its signature, for another rank to name what it runs
/// on a mismatch: the collective's number (low 16 bits), kind (its [`OpKind`] number) and
/// element tag (8 bits each) and length (low 32 bits). Never 0 (the kind byte is offset).
///
/// [`OpKind`]: crate::comm::OpKind
pub(super) fn call_word(number: u64, kind: u8, tag: u64, total: u64) -> u64 {
    (number & 0xffff) << 48
        | u64::from(kind.wrapping_add(1)) << 40
        | (tag & 0xff) << 32
        | (total & 0xffff_ffff)
}

/// What [`call_word`] packed: number (low 16 bits), kind number, tag and length (low 32
/// bits); `None` for 0 (nothing published).
pub(super) fn read_call_word(word: u64) -> Option<(u64, u8, u64, u64)> {
    let kind = ((word >> 40) & 0xff) as u8;
    (word != 0 && kind != 0).then(|| {
        (
            word >> 48,
            kind - 1,
            (word >> 32) & 0xff,
            word & 0xffff_ffff,
        )
    })
}

/// A collective's signature: number, kind, element type and length, mixed into one word.
pub(super) fn signature(number: u64, kind: u64, tag: u64, total: u64) -> u64 {
    // SplitMix64's finaliser over each part in turn: any difference changes the word.
    [number, kind, tag, total]
        .into_iter()
        .fold(0x9e37_79b9_7f4a_7c15, |h, part| {
            let mut z = (h ^ part).wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        })
}
