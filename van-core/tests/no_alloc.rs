//! The small-message path allocates nothing per message: a key-value message (keys, values,
//! lengths and their data types) is built, encoded and decoded with no heap allocation once
//! the encoder's per-thread header arena is warm.
//!
//! A counting global allocator counts this thread's allocations around each step (other test
//! threads do not disturb the count).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::{Bytes, BytesMut};
use van_core::smallvec::smallvec;
use van_core::wire::{decode, encode};
use van_core::{DataType, Limits, Message, Meta};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made on this thread while `f` runs.
fn allocations<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATIONS.with(Cell::get);
    let out = f();
    (out, ALLOCATIONS.with(Cell::get) - before)
}

/// A request as a worker sends it: one key, two f32 values, one length.
fn request(keys: &Bytes, vals: &Bytes, lens: &Bytes) -> Message {
    Message {
        meta: Meta {
            request: true,
            push: true,
            pull: true,
            sender: Some(9),
            recipient: Some(8),
            request_id: 7,
            data_types: smallvec![DataType::U64, DataType::F32, DataType::I32],
            ..Meta::default()
        },
        data: smallvec![keys.clone(), vals.clone(), lens.clone()],
    }
}

#[test]
fn a_small_message_is_built_encoded_and_decoded_without_allocating() {
    let keys = Bytes::from_static(&[1, 0, 0, 0, 0, 0, 0, 0]);
    let vals = Bytes::from_static(&[0, 0, 128, 63, 0, 0, 0, 64]);
    let lens = Bytes::from_static(&[2, 0, 0, 0]);
    let limits = Limits::default();
    // Warm the per-thread header arena (one chunk serves many frames).
    let _ = encode(&request(&keys, &vals, &lens), &limits).unwrap();

    let (msg, built) = allocations(|| request(&keys, &vals, &lens));
    assert_eq!(built, 0, "building the message allocated");
    let (frame, encoded) = allocations(|| encode(&msg, &limits).unwrap());
    assert_eq!(encoded, 0, "encoding allocated");

    // A reader holds the frame in one buffer, shared by every message it splits off.
    let mut buf = BytesMut::with_capacity(4096);
    for part in &frame {
        buf.extend_from_slice(part);
    }
    let mut buf = buf.split().freeze();
    let _warm = buf.clone();
    let (decoded, decoding) = allocations(|| decode(std::mem::take(&mut buf), &limits).unwrap());
    assert_eq!(decoding, 0, "decoding allocated");
    assert_eq!(decoded, msg);
}
