//! Turning the byte stream of one connection into messages, copying as little as possible.
//!
//! Three ways bytes arrive, and what each costs:
//!
//! - **A large chunk while nothing is pending** (a provided buffer the kernel filled with at
//!   least [`ADOPT_MIN`] bytes, starting at a frame boundary): the buffer itself becomes the
//!   `Bytes` storage and complete frames are sliced off it — no copy after the kernel's.
//! - **A small chunk, or one that continues a partial frame**: copied into the connection's
//!   pending buffer (small frames; the copy is cheaper than replacing a provided buffer),
//!   and complete frames are sliced off that buffer.
//! - **A frame larger than [`LARGE_FRAME`]**: once its header is seen, the rest is received
//!   straight into a buffer of its own ([`Reassembly::large_target`]), so its payload is
//!   copied once, by the kernel. The buffer comes from the van's [`FramePool`] (memory
//!   already mapped by an earlier frame) and goes back once the application drops the frame;
//!   it grows with what arrives (never more than [`LARGE_FRAME_WINDOW`] ahead), so a peer
//!   declaring a huge frame cannot make us allocate it up front.
//!
//! Frames are multiples of 8 bytes and every buffer starts 8-aligned, so every frame, and
//! every segment in it, is 8-aligned in memory.

use bytes::{Bytes, BytesMut};
use van_core::wire::{self, FrameHeader, Limits, HEADER_LEN};
use van_core::{FramePool, Message, WireError};

/// Chunks at least this large are kept as they are instead of copied.
pub(crate) const ADOPT_MIN: usize = 32 << 10;
/// Frames larger than this are received into a buffer of their own.
pub(crate) const LARGE_FRAME: usize = 32 << 10;
/// How far a large frame's buffer may run ahead of the bytes that have arrived.
pub(crate) const LARGE_FRAME_WINDOW: usize = 4 << 20;

/// The reassembly state of one connection.
pub(crate) struct Reassembly {
    limits: Limits,
    /// Bytes not yet formed into frames (the start of at most one frame, below
    /// [`LARGE_FRAME`]).
    pending: BytesMut,
    /// The large frame being received, if any.
    large: Option<LargeFrame>,
    /// Where large frames' buffers come from and go back to.
    pool: FramePool,
    /// Bytes of large frames copied out of provided buffers (not received in place).
    copied_large: u64,
}

struct LargeFrame {
    data: Vec<u8>,
    len: usize,
}

impl Reassembly {
    pub(crate) fn new(limits: Limits, pool: FramePool) -> Reassembly {
        Reassembly {
            limits,
            pending: BytesMut::new(),
            large: None,
            pool,
            copied_large: 0,
        }
    }

    /// Whether a chunk of `len` bytes should be handed over instead of copied.
    pub(crate) fn adopts(&self, len: usize) -> bool {
        len >= ADOPT_MIN && self.pending.is_empty() && self.large.is_none()
    }

    /// Takes the count of large-frame bytes copied out of provided buffers since last asked.
    pub(crate) fn take_copied_large(&mut self) -> u64 {
        std::mem::take(&mut self.copied_large)
    }

    /// Bytes of the large frame being received that have not arrived yet (0 when none is).
    pub(crate) fn large_remaining(&self) -> usize {
        self.large
            .as_ref()
            .map_or(0, |large| large.len - large.data.len())
    }

    /// Whether a large frame is being received (into its own buffer).
    pub(crate) fn in_large_frame(&self) -> bool {
        self.large.is_some()
    }

    /// Whether bytes of an unfinished frame are held.
    #[cfg(test)]
    pub(crate) fn mid_frame(&self) -> bool {
        !self.pending.is_empty() || self.large.is_some()
    }

    /// The error for the stream ending now: `None` between frames, else truncation.
    pub(crate) fn truncated(&self) -> Option<WireError> {
        if let Some(large) = &self.large {
            return Some(WireError::Truncated {
                needed: large.len as u64,
                available: large.data.len() as u64,
            });
        }
        if self.pending.is_empty() {
            return None;
        }
        let needed = self
            .pending
            .get(8..16)
            .and_then(|b| b.try_into().ok())
            .map_or(HEADER_LEN as u64, u64::from_le_bytes);
        Some(WireError::Truncated {
            needed,
            available: self.pending.len() as u64,
        })
    }

    /// Takes a chunk without copying it (see [`adopts`](Self::adopts)); messages go to `out`.
    pub(crate) fn push_owned(
        &mut self,
        mut chunk: Bytes,
        out: &mut impl FnMut(Message),
    ) -> Result<(), WireError> {
        debug_assert!(self.pending.is_empty() && self.large.is_none());
        while chunk.len() >= HEADER_LEN {
            let len = self.frame_len(&chunk[..HEADER_LEN])?;
            if chunk.len() < len {
                break;
            }
            out(wire::decode(chunk.split_to(len), &self.limits)?);
        }
        if chunk.is_empty() {
            return Ok(());
        }
        self.push_slice(&chunk, out)
    }

    /// Takes bytes by copying them; messages go to `out`.
    pub(crate) fn push_slice(
        &mut self,
        mut data: &[u8],
        out: &mut impl FnMut(Message),
    ) -> Result<(), WireError> {
        while !data.is_empty() {
            if let Some(large) = &mut self.large {
                let take = (large.len - large.data.len()).min(data.len());
                large.data.extend_from_slice(&data[..take]);
                self.copied_large += take as u64;
                data = &data[take..];
                if large.data.len() == large.len {
                    self.finish_large(out)?;
                }
                continue;
            }
            // A large frame's start, if `split_pending` finds one, is the end of `data`.
            self.pending.extend_from_slice(data);
            data = &[];
            self.split_pending(out)?;
        }
        Ok(())
    }

    /// Splits every complete frame off `pending`; a large frame's start moves to its own
    /// buffer.
    fn split_pending(&mut self, out: &mut impl FnMut(Message)) -> Result<(), WireError> {
        while self.pending.len() >= HEADER_LEN {
            let len = self.frame_len(&self.pending[..HEADER_LEN])?;
            if self.pending.len() >= len {
                let frame = self.pending.split_to(len).freeze();
                out(wire::decode(frame, &self.limits)?);
                continue;
            }
            if len > LARGE_FRAME {
                let mut data = self
                    .pool
                    .take(len.min(self.pending.len() + LARGE_FRAME_WINDOW));
                data.extend_from_slice(&self.pending);
                self.pending = BytesMut::new();
                self.large = Some(LargeFrame { data, len });
            } else {
                self.pending.reserve(len - self.pending.len());
            }
            break;
        }
        // What is left starts the next frame: garbage is refused before a whole header is in.
        wire::check_start(&self.pending)
    }

    /// Where the next direct receive of the large frame writes, and how many bytes it may
    /// write; grows the buffer first when it is full. `None` without a large frame.
    ///
    /// The pointer stays valid until [`large_filled`](Self::large_filled) or until this
    /// reassembly is dropped; the caller keeps the reassembly alive while the kernel may
    /// write there.
    pub(crate) fn large_target(&mut self) -> Option<(*mut u8, u32)> {
        let large = self.large.as_mut()?;
        if large.data.len() == large.data.capacity() {
            let have = large.data.len();
            let target = large.len.min(have + have.max(LARGE_FRAME_WINDOW));
            large.data.reserve_exact(target - have);
        }
        let room = large.data.capacity().min(large.len) - large.data.len();
        let ptr = large.data.spare_capacity_mut().as_mut_ptr().cast::<u8>();
        Some((ptr, u32::try_from(room).unwrap_or(u32::MAX)))
    }

    /// The kernel wrote `n` bytes at the last [`large_target`](Self::large_target).
    pub(crate) fn large_filled(
        &mut self,
        n: usize,
        out: &mut impl FnMut(Message),
    ) -> Result<(), WireError> {
        let Some(large) = self.large.as_mut() else {
            return Ok(());
        };
        let room = large.data.capacity().min(large.len) - large.data.len();
        let n = n.min(room);
        // SAFETY: the kernel initialized `n` bytes (at most the room it was given) right
        // after the current length, and the buffer was not touched since `large_target`.
        unsafe { large.data.set_len(large.data.len() + n) };
        if large.data.len() == large.len {
            self.finish_large(out)?;
        }
        Ok(())
    }

    fn finish_large(&mut self, out: &mut impl FnMut(Message)) -> Result<(), WireError> {
        if let Some(large) = self.large.take() {
            out(wire::decode(self.pool.freeze(large.data), &self.limits)?);
        }
        Ok(())
    }

    fn frame_len(&self, header: &[u8]) -> Result<usize, WireError> {
        let header = FrameHeader::parse(header, &self.limits)?;
        // `parse` checked frame_len ≤ max_frame, which fits in memory by construction.
        Ok(usize::try_from(header.frame_len).unwrap_or(usize::MAX))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use van_core::testkit::{check_numbered, numbered};

    fn frames(sizes: &[usize]) -> (Vec<u8>, usize) {
        let mut all = Vec::new();
        for (seq, len) in sizes.iter().enumerate() {
            all.extend(
                wire::encode_to_vec(&numbered(9, 8, seq as u32, *len), &Limits::default()).unwrap(),
            );
        }
        (all, sizes.len())
    }

    /// Feeds `stream` cut at every `cut` bytes through every path and checks the messages.
    fn feed(stream: &[u8], count: usize, cut: usize) {
        let mut r = Reassembly::new(Limits::default(), FramePool::default());
        let mut got = Vec::new();
        let mut out = |m: Message| got.push(m);
        let mut rest = stream;
        while !rest.is_empty() {
            if let Some((ptr, room)) = r.large_target() {
                let n = (room as usize).min(cut).min(rest.len());
                // SAFETY: `ptr` has `room` ≥ n writable bytes (from `large_target`), `rest` has
                // n readable bytes, and the two do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(rest.as_ptr(), ptr, n) };
                r.large_filled(n, &mut out).unwrap();
                rest = &rest[n..];
                continue;
            }
            let n = cut.min(rest.len());
            if r.adopts(n) {
                r.push_owned(Bytes::copy_from_slice(&rest[..n]), &mut out)
                    .unwrap();
            } else {
                r.push_slice(&rest[..n], &mut out).unwrap();
            }
            rest = &rest[n..];
        }
        assert!(!r.mid_frame());
        assert_eq!(got.len(), count);
        for (seq, msg) in got.iter().enumerate() {
            check_numbered(msg, 9, seq as u32);
            for segment in &msg.data {
                assert_eq!(segment.as_ptr() as usize % 8, 0, "segment not 8-aligned");
            }
        }
    }

    #[test]
    fn every_cut_of_mixed_frames_reassembles_in_order() {
        let (stream, count) = frames(&[0, 1, 7, 8, 100, 4095, 40_000, 70_000, 3, 1 << 20, 9]);
        for cut in [1, 7, 8, 13, 4096, 32 << 10, 64 << 10, 1 << 20, usize::MAX] {
            feed(&stream, count, cut);
        }
    }

    #[test]
    fn garbage_and_truncation_are_typed_errors() {
        let mut r = Reassembly::new(Limits::default(), FramePool::default());
        let err = r.push_slice(&[0xAB; 64], &mut |_| {}).unwrap_err();
        assert!(err.to_string().contains("bad magic"), "{err}");
        let (stream, _) = frames(&[1 << 20]);
        let mut r = Reassembly::new(Limits::default(), FramePool::default());
        r.push_slice(&stream[..1000], &mut |_| {}).unwrap();
        assert!(r.in_large_frame());
        let err = r.truncated().unwrap();
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}
