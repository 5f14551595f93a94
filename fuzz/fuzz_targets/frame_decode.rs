//! Decodes arbitrary bytes as one frame, under the default limits and under tiny ones.
//!
//! Decoding must never panic. Whatever decodes must re-encode (under the same limits) to a
//! frame that decodes to the same message: the decoder accepts nothing the encoder cannot say.
//!
//! Random bytes almost never carry the magic, the version and a `frame_len` equal to their own
//! length, so each input is also decoded a second time with those header fields repaired
//! (and the declared meta length and segment count folded into what the input can hold).
//! That second pass is what reaches the meta decoder and the segment table.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use van_core::wire::{decode, encode_to_vec, HEADER_LEN, MAGIC, VERSION};
use van_core::Limits;

/// Small enough that fuzzed headers reach every limit check.
const TINY: Limits = Limits {
    max_frame: 256,
    max_segments: 2,
    max_meta: 64,
};

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// `data` with a header that passes the magic, version, reserved and length checks, keeping
/// the fuzzed meta length and segment count (reduced to fit) and the fuzzed body.
fn with_plausible_header(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() < HEADER_LEN {
        return None;
    }
    let mut frame = data.to_vec();
    frame.resize(frame.len().next_multiple_of(8), 0);
    let room = (frame.len() - HEADER_LEN) as u32;
    let meta_len = le_u32(&frame, 16) % (room + 1);
    let table_room = (room - meta_len.next_multiple_of(8).min(room)) / 8;
    let count = le_u32(&frame, 20) % (table_room + 1);
    frame[0..4].copy_from_slice(&MAGIC);
    frame[4..6].copy_from_slice(&VERSION.to_le_bytes());
    frame[6..8].fill(0);
    let frame_len = frame.len() as u64;
    frame[8..16].copy_from_slice(&frame_len.to_le_bytes());
    frame[16..20].copy_from_slice(&meta_len.to_le_bytes());
    frame[20..24].copy_from_slice(&count.to_le_bytes());
    frame[24..32].fill(0);
    Some(frame)
}

fn check(frame: Bytes, limits: &Limits) {
    let Ok(msg) = decode(frame, limits) else {
        return;
    };
    let again = match encode_to_vec(&msg, limits) {
        Ok(frame) => frame,
        Err(e) => panic!("decoded message does not re-encode under the same limits: {e}"),
    };
    assert_eq!(
        again.len() % 8,
        0,
        "re-encoded frame length is not a multiple of 8"
    );
    match decode(Bytes::from(again), limits) {
        Ok(round) => assert_eq!(round, msg, "re-encoded frame decodes differently"),
        Err(e) => panic!("re-encoded frame does not decode: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let repaired = with_plausible_header(data).map(Bytes::from);
    for limits in [Limits::default(), TINY] {
        check(Bytes::copy_from_slice(data), &limits);
        if let Some(frame) = &repaired {
            check(frame.clone(), &limits);
        }
    }
});
