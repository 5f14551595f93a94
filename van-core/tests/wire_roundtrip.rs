//! Round-trip, limit and negative tests of the wire format (`van_core::wire`).
//!
//! The properties cover every message shape: arbitrary metas with and without a control block,
//! nodes with every role and van kind and non-ASCII strings, and zero or more data segments of
//! any length (zero and odd included). The plain tests pin each limit at its edge and produce
//! every [`WireError`] variant from crafted bytes. A reference frame builder written from the
//! byte table in `wire/mod.rs` checks the encoder's layout independently of the decoder.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;
use van_core::wire::{
    decode, decode_meta, encode, encode_into, encode_meta, encode_to_vec, FrameHeader, ALIGN,
    HEADER_LEN, MAGIC, VERSION,
};
use van_core::{
    Command, Control, DataType, Endpoint, Limits, Message, Meta, Node, NodeId, Role, TfTask,
    VanKind, WireError,
};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Concatenates the parts of an encoded frame into one buffer, as a stream van's reader would.
fn concat(parts: &[Bytes]) -> Bytes {
    let mut out = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
    for part in parts {
        out.extend_from_slice(part);
    }
    out.freeze()
}

/// Encodes `msg` into one contiguous frame.
fn frame_of(msg: &Message, limits: &Limits) -> Bytes {
    Bytes::from(encode_to_vec(msg, limits).unwrap())
}

/// The encoded meta of `meta`, alone.
fn meta_bytes(meta: &Meta) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode_meta(meta, &mut out).unwrap();
    out.to_vec()
}

fn pad8(len: usize) -> usize {
    len.next_multiple_of(ALIGN)
}

/// A fixed frame header with every field given, valid or not.
fn header(version: u16, flags: u16, frame_len: u64, meta_len: u32, count: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&frame_len.to_le_bytes());
    out.extend_from_slice(&meta_len.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out
}

/// A frame built by hand from the byte table in `wire/mod.rs`: header, meta, padding, length
/// table, padded segments. Independent of `encode`, so it can both check the encoder's layout
/// and craft frames the encoder refuses to produce (too many segments, bad metas).
fn reference_frame(meta: &[u8], segments: &[&[u8]]) -> Bytes {
    let frame_len = HEADER_LEN
        + pad8(meta.len())
        + 8 * segments.len()
        + segments.iter().map(|s| pad8(s.len())).sum::<usize>();
    let mut out = header(
        VERSION,
        0,
        frame_len as u64,
        meta.len() as u32,
        segments.len() as u32,
    );
    out.extend_from_slice(meta);
    out.resize(HEADER_LEN + pad8(meta.len()), 0);
    for seg in segments {
        out.extend_from_slice(&(seg.len() as u64).to_le_bytes());
    }
    for seg in segments {
        out.extend_from_slice(seg);
        out.resize(pad8(out.len()), 0);
    }
    assert_eq!(out.len(), frame_len);
    Bytes::from(out)
}

/// Position of `needle` in `hay` (test markers are unique).
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("marker present")
}

/// Asserts that every non-empty decoded segment and the body are slices of `frame` (no copy)
/// and that every segment starts on an 8-byte boundary relative to the frame's start.
///
/// Empty segments carry no bytes, so their pointer means nothing and is not checked.
fn assert_zero_copy(frame: &Bytes, msg: &Message) {
    let base = frame.as_ptr() as usize;
    let end = base + frame.len();
    for (i, seg) in msg.data.iter().enumerate().filter(|(_, s)| !s.is_empty()) {
        let at = seg.as_ptr() as usize;
        assert!(
            at >= base && at + seg.len() <= end,
            "segment {i} is not a slice of the frame (copied)"
        );
        assert_eq!(
            (at - base) % ALIGN,
            0,
            "segment {i} starts at frame offset {}, not 8-aligned",
            at - base
        );
    }
    let body = &msg.meta.body;
    if !body.is_empty() {
        let at = body.as_ptr() as usize;
        assert!(
            at >= base && at + body.len() <= end,
            "body is not a slice of the frame"
        );
    }
}

/// Encodes with [`encode_into`], checks the frame's length rules and that no payload byte was
/// copied, decodes, and checks the message, the alignment and the zero-copy slicing.
fn assert_round_trip(msg: &Message, limits: &Limits) {
    let mut arena = BytesMut::new();
    let mut parts = Vec::new();
    let len = encode_into(msg, limits, &mut arena, &mut parts).unwrap();

    // Encoding copies no payload: every non-empty segment goes out as the very same bytes.
    for (i, seg) in msg.data.iter().enumerate().filter(|(_, s)| !s.is_empty()) {
        assert!(
            parts
                .iter()
                .any(|p| p.as_ptr() == seg.as_ptr() && p.len() == seg.len()),
            "segment {i} was copied by the encoder"
        );
    }

    let frame = concat(&parts);
    assert_eq!(frame.len() as u64, len, "returned length != bytes produced");
    assert_eq!(
        len % ALIGN as u64,
        0,
        "frame length {len} not a multiple of 8"
    );
    let header = FrameHeader::parse(&frame, limits).unwrap();
    assert_eq!(header.frame_len, len);
    assert_eq!(header.segment_count as usize, msg.data.len());

    let decoded = decode(frame.clone(), limits).unwrap();
    assert_eq!(&decoded, msg);
    assert_zero_copy(&frame, &decoded);
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

const ROLES: [Role; 3] = [Role::Scheduler, Role::Server, Role::Worker];
const COMMANDS: [Command; 7] = [
    Command::Empty,
    Command::Terminate,
    Command::AddNode,
    Command::Barrier,
    Command::Ack,
    Command::Heartbeat,
    Command::NodeFailure,
];

/// A node id; `i32::MAX` is the wire's "none", so `Some(i32::MAX)` is not representable.
fn node_id() -> impl Strategy<Value = Option<NodeId>> {
    prop::option::of(i32::MIN..i32::MAX)
}

/// Host names, identities, addresses: ASCII, arbitrary Unicode (every plane, controls and
/// multi-byte characters included) and a fixed non-ASCII sample.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9.:\\[\\]/-]{0,24}",
        vec(any::<char>(), 0..16).prop_map(String::from_iter),
        Just("hôte-主机-🚀.example".to_owned()),
    ]
}

fn bytes_up_to(max: usize) -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

/// A data segment: empty, short (odd lengths likely) or a few KiB.
fn segment() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        1 => Just(Bytes::new()),
        4 => vec(any::<u8>(), 1..40).prop_map(Bytes::from),
        1 => vec(any::<u8>(), 40..3000).prop_map(Bytes::from),
    ]
}

fn endpoint() -> impl Strategy<Value = Endpoint> {
    (select(VanKind::ALL.to_vec()), text()).prop_map(|(kind, address)| Endpoint { kind, address })
}

fn node() -> impl Strategy<Value = Node> {
    (
        select(ROLES.to_vec()),
        node_id(),
        text(),
        any::<u16>(),
        text(),
        vec(endpoint(), 0..6),
        any::<bool>(),
        any::<u64>(),
        option::of(("[a-z]{1,8}", any::<u32>()).prop_map(|(job, index)| TfTask { job, index })),
    )
        .prop_map(
            |(role, id, host, port, host_identity, endpoints, is_recovery, incarnation, task)| {
                Node {
                    role,
                    id,
                    host,
                    port,
                    host_identity,
                    endpoints,
                    is_recovery,
                    incarnation,
                    task,
                }
            },
        )
}

fn control() -> impl Strategy<Value = Control> {
    (
        select(COMMANDS.to_vec()),
        vec(node(), 0..5),
        any::<i32>(),
        any::<u64>(),
    )
        .prop_map(|(cmd, nodes, barrier_group, msg_sig)| Control {
            cmd,
            nodes: nodes.into(),
            barrier_group,
            msg_sig,
        })
}

fn meta() -> impl Strategy<Value = Meta> {
    let ids = (
        any::<i32>(),
        any::<i32>(),
        any::<i32>(),
        any::<i32>(),
        node_id(),
        node_id(),
    );
    let flags = (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(
            (any::<u64>(), any::<u64>()).prop_map(|(number, to)| van_core::Seq { number, to }),
        ),
    );
    let rest = (
        bytes_up_to(100),
        vec(select(DataType::ALL.to_vec()), 0..8),
        prop::option::of(control()),
        any::<i32>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<i32>(),
    );
    (ids, flags, rest).prop_map(
        |(
            (head, app_id, customer_id, request_id, sender, recipient),
            (request, push, pull, simple_app, seq),
            (body, data_types, control, priority, key, addr, val_len, option),
        )| Meta {
            head,
            app_id,
            customer_id,
            request_id,
            sender,
            recipient,
            request,
            push,
            pull,
            simple_app,
            body,
            data_types: data_types.into(),
            control,
            priority,
            key,
            addr,
            val_len,
            option,
            seq,
        },
    )
}

fn message() -> impl Strategy<Value = Message> {
    (meta(), vec(segment(), 0..10)).prop_map(|(meta, data)| Message {
        meta,
        data: data.into(),
    })
}

/// Limits small enough that random frames hit them.
const TINY: Limits = Limits {
    max_frame: 512,
    max_segments: 3,
    max_meta: 96,
};

/// Decodes with the default and the tiny limits; whatever decodes must re-encode to a frame
/// that decodes to the same message.
fn decode_never_panics(frame: &Bytes) {
    for limits in [Limits::default(), TINY] {
        if let Ok(msg) = decode(frame.clone(), &limits) {
            let again = frame_of(&msg, &limits);
            assert_eq!(decode(again, &limits).unwrap(), msg);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #[test]
    fn every_message_shape_round_trips(msg in message()) {
        assert_round_trip(&msg, &Limits::default());
    }

    #[test]
    fn encoder_matches_the_byte_table(msg in message()) {
        let meta = meta_bytes(&msg.meta);
        let segments: Vec<&[u8]> = msg.data.iter().map(|s| &s[..]).collect();
        let expected = reference_frame(&meta, &segments);
        prop_assert_eq!(frame_of(&msg, &Limits::default()), expected);
    }

    #[test]
    fn a_batch_shares_one_arena_and_one_parts_list(msgs in vec(message(), 1..6)) {
        let limits = Limits::default();
        let mut arena = BytesMut::new();
        let mut parts = Vec::new();
        let mut lens = Vec::new();
        for msg in &msgs {
            lens.push(encode_into(msg, &limits, &mut arena, &mut parts).unwrap());
        }
        // Frames back to back, as a stream van writes them; cut by the header's length.
        let stream = concat(&parts);
        let mut at = 0;
        for (msg, len) in msgs.iter().zip(lens) {
            let header = FrameHeader::parse(&stream[at..], &limits).unwrap();
            prop_assert_eq!(header.frame_len, len);
            let frame = stream.slice(at..at + len as usize);
            let decoded = decode(frame, &limits).unwrap();
            prop_assert_eq!(&decoded, msg);
            assert_zero_copy(&stream, &decoded);
            at += len as usize;
        }
        prop_assert_eq!(at, stream.len());
    }

    #[test]
    fn meta_round_trips_alone(meta in meta()) {
        let bytes = Bytes::from(meta_bytes(&meta));
        prop_assert_eq!(decode_meta(bytes).unwrap(), meta);
    }

    #[test]
    fn random_bytes_never_panic(bytes in vec(any::<u8>(), 0..600)) {
        decode_never_panics(&Bytes::from(bytes.clone()));
        let _ = decode_meta(Bytes::from(bytes));
    }

    #[test]
    fn random_bytes_after_a_valid_header_never_panic(
        meta_len in 0u32..200,
        count in 0u32..8,
        extra in 0u64..400,
        body in vec(any::<u8>(), 0..600),
    ) {
        // A header that passes the magic/version/reserved checks with plausible lengths, so
        // the random bytes reach the meta and segment-table decoders.
        let frame_len = (HEADER_LEN as u64 + u64::from(meta_len) + 8 * u64::from(count) + extra)
            .next_multiple_of(8);
        let mut frame = header(VERSION, 0, frame_len, meta_len, count);
        frame.extend_from_slice(&body);
        frame.resize(frame_len as usize, 0);
        decode_never_panics(&Bytes::from(frame));
    }

    #[test]
    fn mutated_frames_never_panic(
        msg in message(),
        flips in vec((any::<prop::sample::Index>(), 0u8..8), 0..6),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let mut frame = encode_to_vec(&msg, &Limits::default()).unwrap();
        for (index, bit) in flips {
            let i = index.index(frame.len());
            frame[i] ^= 1 << bit;
        }
        if let Some(cut) = cut {
            frame.truncate(cut.index(frame.len() + 1));
        }
        decode_never_panics(&Bytes::from(frame));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn every_proper_prefix_is_truncated(msg in message()) {
        let frame = frame_of(&msg, &Limits::default());
        for len in 0..frame.len() {
            let result = decode(frame.slice(..len), &Limits::default());
            prop_assert!(
                matches!(result, Err(WireError::Truncated { .. })),
                "prefix of {} of {} bytes: {:?}", len, frame.len(), result
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shapes and limits at their edges
// ---------------------------------------------------------------------------------------------

#[test]
fn empty_message_round_trips() {
    let msg = Message::default();
    assert_round_trip(&msg, &Limits::default());
    let frame = frame_of(&msg, &Limits::default());
    assert_eq!(frame.len(), HEADER_LEN + pad8(meta_bytes(&msg.meta).len()));
}

#[test]
fn zero_length_and_odd_segments_round_trip() {
    let msg = Message::to(
        9,
        vec![
            Bytes::new(),
            Bytes::from_static(b"a"),
            Bytes::new(),
            Bytes::from_static(b"seven!!"),
            Bytes::from_static(b"eight!!!"),
            Bytes::from_static(b"nine!!!!!"),
            Bytes::new(),
        ],
    );
    assert_round_trip(&msg, &Limits::default());
}

#[test]
fn exactly_max_segments_accepted_one_more_rejected() {
    let limits = Limits {
        max_segments: 4,
        ..Limits::default()
    };
    let segs = |n: usize| -> Vec<Bytes> { (0..n).map(|i| Bytes::from(vec![7u8; i * 3])).collect() };

    assert_round_trip(&Message::to(8, segs(4)), &limits);

    // Encode refuses, and appends nothing.
    let over = Message::to(8, segs(5));
    let mut parts = Vec::new();
    let err = encode_into(&over, &limits, &mut BytesMut::new(), &mut parts).unwrap_err();
    assert_eq!(err, WireError::TooManySegments { count: 5, max: 4 });
    assert!(parts.is_empty());

    // Decode refuses a hand-crafted frame with one segment too many.
    let meta = meta_bytes(&over.meta);
    let seg_refs: Vec<&[u8]> = over.data.iter().map(|s| &s[..]).collect();
    let frame = reference_frame(&meta, &seg_refs);
    assert_eq!(
        decode(frame.clone(), &limits),
        Err(WireError::TooManySegments { count: 5, max: 4 })
    );
    // The same frame is fine under the default limits.
    assert_eq!(decode(frame, &Limits::default()).unwrap(), over);
}

#[test]
fn meta_exactly_at_max_meta_accepted_one_over_rejected() {
    let msg = Message {
        meta: Meta {
            body: Bytes::from_static(b"a body of some length"),
            control: Some(Control {
                cmd: Command::AddNode,
                nodes: vec![Node::new(Role::Worker, "wörker-0", 9000).with_id(9)].into(),
                ..Control::default()
            }),
            ..Meta::default()
        },
        data: van_core::smallvec::smallvec![Bytes::from_static(b"xyz")],
    };
    let meta_len = meta_bytes(&msg.meta).len() as u32;
    let at = Limits {
        max_meta: meta_len,
        ..Limits::default()
    };
    assert_round_trip(&msg, &at);

    let under = Limits {
        max_meta: meta_len - 1,
        ..Limits::default()
    };
    let expected = WireError::MetaTooLarge {
        len: u64::from(meta_len),
        max: meta_len - 1,
    };
    assert_eq!(encode(&msg, &under).unwrap_err(), expected);
    let frame = frame_of(&msg, &at);
    assert_eq!(decode(frame, &under).unwrap_err(), expected);
}

#[test]
fn frame_exactly_at_max_frame_accepted_one_over_rejected() {
    let msg = Message::to(8, vec![Bytes::from(vec![1u8; 1001]), Bytes::new()]);
    let frame = frame_of(&msg, &Limits::default());
    let len = frame.len() as u64;
    let at = Limits {
        max_frame: len,
        ..Limits::default()
    };
    assert_round_trip(&msg, &at);

    let under = Limits {
        max_frame: len - 1,
        ..Limits::default()
    };
    let expected = WireError::FrameTooLarge { len, max: len - 1 };
    assert_eq!(encode(&msg, &under).unwrap_err(), expected);
    assert_eq!(decode(frame, &under).unwrap_err(), expected);
    // The message names the variable that raises the limit.
    assert!(
        expected.to_string().contains("VANS_MAX_FRAME_BYTES"),
        "{expected}"
    );
}

#[test]
fn a_64_mib_segment_round_trips() {
    let mut big = vec![0u8; 64 << 20];
    for (i, chunk) in big.chunks_mut(4096).enumerate() {
        chunk[0] = i as u8;
        chunk[4095] = (i >> 8) as u8;
    }
    let msg = Message::to(
        8,
        vec![
            Bytes::from_static(b"odd"),
            Bytes::from(big),
            Bytes::from_static(b"tail"),
        ],
    );
    assert_round_trip(&msg, &Limits::default());
}

// ---------------------------------------------------------------------------------------------
// One crafted frame per error
// ---------------------------------------------------------------------------------------------

/// A valid frame to corrupt: a control message with one node, a body and two segments.
fn sample_message() -> Message {
    let node = Node {
        role: Role::Server,
        id: Some(8),
        host: "HOST".to_owned(),
        port: 9000,
        host_identity: "IDEN".to_owned(),
        endpoints: vec![Endpoint {
            kind: VanKind::Tcp,
            address: "ADDR".to_owned(),
        }],
        is_recovery: false,
        incarnation: 0x00AB_CDEF,
        task: None,
    };
    Message {
        meta: Meta {
            sender: Some(1),
            recipient: Some(8),
            request: true,
            push: true,
            body: Bytes::new(),
            data_types: van_core::smallvec::smallvec![DataType::U64, DataType::F32],
            control: Some(Control {
                cmd: Command::AddNode,
                nodes: vec![node].into(),
                barrier_group: 7,
                msg_sig: 42,
            }),
            ..Meta::default()
        },
        data: van_core::smallvec::smallvec![
            Bytes::from_static(b"12345678"),
            Bytes::from_static(b"abc")
        ],
    }
}

/// Byte offsets in the sample's encoded meta (see the meta table in `wire/mod.rs`).
const META_FLAGS: usize = 24;
const META_BODY_LEN: usize = 57;
/// With an empty body: the data-type count, then one code per type.
const META_TYPES: usize = 61;

/// The sample's meta, patched by `patch`, in a frame with the sample's segments.
fn frame_with_patched_meta(patch: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    let msg = sample_message();
    let mut meta = meta_bytes(&msg.meta);
    patch(&mut meta);
    let segs: Vec<&[u8]> = msg.data.iter().map(|s| &s[..]).collect();
    reference_frame(&meta, &segs)
}

fn decode_default(frame: Bytes) -> Result<Message, WireError> {
    decode(frame, &Limits::default())
}

#[test]
fn sample_message_and_reference_frame_agree() {
    let msg = sample_message();
    let frame = frame_with_patched_meta(|_| {});
    assert_eq!(frame, frame_of(&msg, &Limits::default()));
    assert_eq!(decode_default(frame).unwrap(), msg);
}

#[test]
fn bad_magic() {
    let mut frame = frame_of(&sample_message(), &Limits::default()).to_vec();
    frame[0..4].copy_from_slice(b"HTTP");
    assert_eq!(
        decode_default(Bytes::from(frame)),
        Err(WireError::BadMagic { found: *b"HTTP" })
    );
}

#[test]
fn unsupported_version_names_both_versions() {
    let mut frame = frame_of(&sample_message(), &Limits::default()).to_vec();
    frame[4..6].copy_from_slice(&7u16.to_le_bytes());
    let err = decode_default(Bytes::from(frame)).unwrap_err();
    assert_eq!(
        err,
        WireError::UnsupportedVersion {
            found: 7,
            supported: VERSION
        }
    );
    let text = err.to_string();
    assert!(text.contains("version 7"), "{text}");
    assert!(text.contains(&format!("version {VERSION}")), "{text}");
}

#[test]
fn reserved_bits_set() {
    let good = frame_of(&sample_message(), &Limits::default());

    let mut flagged = good.to_vec();
    flagged[6] = 0x01;
    assert_eq!(
        decode_default(Bytes::from(flagged)),
        Err(WireError::ReservedBitsSet {
            flags: 1,
            reserved: 0
        })
    );

    let mut reserved = good.to_vec();
    reserved[31] = 0x80;
    assert_eq!(
        decode_default(Bytes::from(reserved)),
        Err(WireError::ReservedBitsSet {
            flags: 0,
            reserved: 0x80 << 56
        })
    );
}

#[test]
fn frame_too_large_is_refused_from_the_header_alone() {
    let frame = header(VERSION, 0, 1 << 60, 0, 0);
    let expected = WireError::FrameTooLarge {
        len: 1 << 60,
        max: Limits::default().max_frame,
    };
    assert_eq!(
        FrameHeader::parse(&frame, &Limits::default()).unwrap_err(),
        expected
    );
    assert_eq!(decode_default(Bytes::from(frame)).unwrap_err(), expected);
}

#[test]
fn length_mismatch() {
    let good = frame_of(&sample_message(), &Limits::default());
    let is_mismatch =
        |r: Result<Message, WireError>| matches!(r, Err(WireError::LengthMismatch { .. }));

    // Bytes beyond the declared frame.
    let mut long = good.to_vec();
    long.extend_from_slice(&[0; 8]);
    assert!(is_mismatch(decode_default(Bytes::from(long))));

    // A declared length that is not a multiple of 8.
    let mut unaligned = good.to_vec();
    let len = unaligned.len() as u64;
    unaligned[8..16].copy_from_slice(&(len - 4).to_le_bytes());
    unaligned.truncate(len as usize - 4);
    assert!(is_mismatch(decode_default(Bytes::from(unaligned))));

    // A declared length shorter than header + meta + table.
    let short = header(VERSION, 0, 32, 8, 0);
    assert!(is_mismatch(decode_default(Bytes::from(short))));

    // A segment table that claims more than the frame holds: last length 3 → 100.
    let mut table = good.to_vec();
    let meta_len = meta_bytes(&sample_message().meta).len();
    let last_len_at = HEADER_LEN + pad8(meta_len) + 8;
    table[last_len_at..last_len_at + 8].copy_from_slice(&100u64.to_le_bytes());
    assert!(is_mismatch(decode_default(Bytes::from(table))));

    // A segment table that claims less: the frame has bytes no segment owns.
    let mut slack = good.to_vec();
    slack[last_len_at..last_len_at + 8].copy_from_slice(&0u64.to_le_bytes());
    assert!(is_mismatch(decode_default(Bytes::from(slack))));
}

#[test]
fn every_proper_prefix_of_the_sample_is_truncated() {
    let frame = frame_of(&sample_message(), &Limits::default());
    for len in 0..frame.len() {
        let err = decode_default(frame.slice(..len)).unwrap_err();
        assert!(
            matches!(err, WireError::Truncated { needed, available }
                if available == len as u64 && needed > available),
            "prefix {len}: {err:?}"
        );
    }
}

#[test]
fn meta_truncated() {
    // A meta of 8 bytes ends inside customer_id.
    let frame = reference_frame(&[0; 8], &[]);
    assert_eq!(
        decode_default(frame),
        Err(WireError::MetaTruncated {
            field: "customer_id"
        })
    );

    // A body length beyond the meta's end.
    let frame = frame_with_patched_meta(|m| {
        m[META_BODY_LEN..META_BODY_LEN + 4].copy_from_slice(&1000u32.to_le_bytes());
    });
    assert_eq!(
        decode_default(frame),
        Err(WireError::MetaTruncated { field: "body" })
    );

    // A node count that the remaining bytes cannot hold.
    let frame = frame_with_patched_meta(|m| {
        let count_at = find(m, b"HOST") - 2 - 4 - 1 - 4;
        m[count_at..count_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    });
    assert_eq!(
        decode_default(frame),
        Err(WireError::MetaTruncated {
            field: "node count"
        })
    );

    // The meta cut inside the last endpoint address.
    let frame = frame_with_patched_meta(|m| {
        m.truncate(m.len() - 1);
    });
    assert_eq!(
        decode_default(frame),
        Err(WireError::MetaTruncated {
            field: "endpoint address"
        })
    );
}

#[test]
fn meta_trailing_bytes() {
    let frame = frame_with_patched_meta(|m| m.extend_from_slice(&[0, 0, 0]));
    assert_eq!(
        decode_default(frame),
        Err(WireError::MetaTrailingBytes { extra: 3 })
    );
}

#[test]
fn unknown_codes() {
    fn code_error(patch: impl FnOnce(&mut Vec<u8>)) -> WireError {
        decode_default(frame_with_patched_meta(patch)).unwrap_err()
    }
    let unknown = |what: &'static str, code: u8| WireError::UnknownCode { what, code };

    assert_eq!(
        code_error(|m| m[META_FLAGS] |= 0x80),
        unknown("meta flags", m_flags_with(0x80))
    );
    assert_eq!(
        code_error(|m| m[META_TYPES + 4] = 12),
        unknown("data type", 12)
    );
    // Two data types, so the command follows at META_TYPES + 4 + 2.
    assert_eq!(code_error(|m| m[META_TYPES + 6] = 7), unknown("command", 7));
    assert_eq!(
        code_error(|m| {
            let role_at = find(m, b"HOST") - 2 - 4 - 1;
            m[role_at] = 3;
        }),
        unknown("role", 3)
    );
    assert_eq!(
        code_error(|m| {
            let recovery_at = find(m, b"IDEN") + 4;
            m[recovery_at] = 2;
        }),
        unknown("is_recovery flag", 2)
    );
    // A task index without a job name (the sample has no task: an empty job, index 0).
    assert_eq!(
        code_error(|m| {
            let index_at = find(m, b"IDEN") + 4 + 1 + 8 + 2;
            m[index_at] = 1;
        }),
        WireError::Invalid {
            field: "node task",
            reason: "a task index without a job name"
        }
    );
    assert_eq!(
        code_error(|m| {
            let kind_at = find(m, b"ADDR") - 2 - 1;
            m[kind_at] = 5;
        }),
        unknown("van kind", 5)
    );
}

/// The sample's meta flags byte (request | push | control) with extra bits set.
fn m_flags_with(extra: u8) -> u8 {
    0b1_0011 | extra
}

#[test]
fn invalid_utf8() {
    for (marker, field) in [
        (&b"HOST"[..], "node host"),
        (&b"IDEN"[..], "node host identity"),
        (&b"ADDR"[..], "endpoint address"),
    ] {
        let frame = frame_with_patched_meta(|m| {
            let at = find(m, marker);
            m[at + 1] = 0xff;
        });
        assert_eq!(
            decode_default(frame),
            Err(WireError::InvalidUtf8 { field }),
            "{field}"
        );
    }
}

#[test]
fn unrepresentable_fields_are_encode_errors_not_silent_changes() {
    // i32::MAX is ps-lite's kEmpty on the wire: `Some(i32::MAX)` would decode as `None`.
    let msg = Message {
        meta: Meta {
            sender: Some(i32::MAX),
            ..Meta::default()
        },
        data: van_core::Parts::new(),
    };
    assert!(matches!(
        encode(&msg, &Limits::default()),
        Err(WireError::Unencodable {
            field: "sender",
            ..
        })
    ));
    // A host name longer than its u16 length prefix would be truncated.
    let mut node = Node::new(Role::Worker, "h".repeat(70_000), 1);
    node.id = Some(9);
    let msg = Message {
        meta: Meta {
            control: Some(Control {
                nodes: vec![node].into(),
                ..Control::default()
            }),
            ..Meta::default()
        },
        data: van_core::Parts::new(),
    };
    let err = encode(&msg, &Limits::default()).unwrap_err();
    assert!(err.to_string().contains("node host"), "{err}");
}
