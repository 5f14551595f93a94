//! What a work request's id says: the kind of request in its top two bits, and the receive
//! slot, send slot or large-frame id in the rest. [`Setup`](crate::connection::Setup) posts
//! the first receives with these ids and the [engine](crate::engine) posts every later
//! request with them, then reads its completions back by them.

/// The bits that hold the kind of request.
pub(crate) const TAG_MASK: u64 = 3 << 62;
/// A posted receive; the rest is its slot in the receive ring.
pub(crate) const RECV: u64 = 0;
/// A SEND from a send slot; the rest is the slot.
pub(crate) const SEND: u64 = 1 << 62;
/// The last piece of a large frame, written with the immediate; the rest is the frame's id.
pub(crate) const WRITE: u64 = 2 << 62;
/// A piece of a large frame written before its last piece (which carries the immediate).
pub(crate) const WRITE_PART: u64 = 3 << 62;
