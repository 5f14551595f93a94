//! Decodes arbitrary bytes as a rendezvous message from a peer (`rendezvous::wire`): the
//! first bytes choose the command, the request flag and the number of data segments, the rest
//! is the body. Decoding must never panic; a message that decodes re-encodes to one that
//! decodes to the same message.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use rendezvous::wire::{Address, RendezvousMessage};
use van_core::{Message, Meta};

const ADDRESS: Address = Address {
    app_id: 1,
    customer_id: 0,
    sender: 9,
    recipient: 8,
};

fuzz_target!(|input: &[u8]| {
    let Some((&control, body)) = input.split_first() else {
        return;
    };
    let head = i32::from(control % 5);
    let request = control & 0x08 != 0;
    let segments = usize::from((control >> 4) % 3);
    let msg = Message {
        meta: Meta {
            head,
            request,
            request_id: i32::from(control),
            sender: Some(9),
            body: Bytes::copy_from_slice(body),
            ..Meta::default()
        },
        data: (0..segments)
            .map(|i| Bytes::from(vec![i as u8; i * 3]))
            .collect(),
    };
    let Ok(decoded) = RendezvousMessage::decode(msg) else {
        return;
    };
    let again = match RendezvousMessage::decode(decoded.clone().encode(ADDRESS)) {
        Ok(m) => m,
        Err(e) => panic!("{decoded:?} re-encodes to a message that does not decode: {e}"),
    };
    assert_eq!(again, decoded, "decode(encode(m)) != m");
});
