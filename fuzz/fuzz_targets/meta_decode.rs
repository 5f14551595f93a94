//! Decodes arbitrary bytes as a meta; whatever decodes must re-encode to the same meta.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use van_core::wire::{decode_meta, encode_meta};

fuzz_target!(|data: &[u8]| {
    let Ok(meta) = decode_meta(Bytes::copy_from_slice(data)) else {
        return;
    };
    let mut again = BytesMut::new();
    if let Err(e) = encode_meta(&meta, &mut again) {
        panic!("a decoded meta does not re-encode: {e}");
    }
    // Every field of a meta has one encoding, so a meta that decodes re-encodes byte for byte.
    assert_eq!(&again[..], data, "meta re-encodes to different bytes");
    match decode_meta(again.freeze()) {
        Ok(round) => assert_eq!(round, meta, "re-encoded meta decodes differently"),
        Err(e) => panic!("re-encoded meta does not decode: {e}"),
    }
});
