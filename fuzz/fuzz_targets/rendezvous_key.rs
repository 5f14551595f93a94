//! Parses arbitrary UTF-8 as a rendezvous key; a key that parses keeps its text, and one whose
//! fifth part is `frame:iter` must rebuild, through `create_key`, into a key that parses to
//! the same parts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use van_core::rendezvous::{create_key, parse_key};

fuzz_target!(|key: &str| {
    let Ok(parsed) = parse_key(key) else {
        return;
    };
    assert_eq!(parsed.full_key(), key);
    let Some((frame, iter)) = parsed.frame_and_iter() else {
        return;
    };
    let Ok(iter) = u64::try_from(iter) else {
        return;
    };
    let rebuilt = create_key(
        &parsed.src_device,
        parsed.src_incarnation,
        &parsed.dst_device,
        &parsed.edge_name,
        (frame, iter),
    );
    let reparsed = match parse_key(&rebuilt) {
        Ok(p) => p,
        Err(e) => panic!("create_key output `{rebuilt}` does not parse: {e}"),
    };
    assert_eq!(
        (
            &reparsed.src_device,
            reparsed.src_incarnation,
            &reparsed.dst_device,
            &reparsed.edge_name,
            reparsed.frame_and_iter(),
        ),
        (
            &parsed.src_device,
            parsed.src_incarnation,
            &parsed.dst_device,
            &parsed.edge_name,
            parsed.frame_and_iter(),
        ),
        "create_key(parse_key(key)) parses to different parts"
    );
});
