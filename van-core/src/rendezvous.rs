//! The rendezvous contract: step-scoped exchange of tensors by key, as in TensorFlow's
//! `framework/rendezvous.h`. The `rendezvous` crate implements it locally and over vans.
//!
//! A key names one edge of the graph in one frame iteration:
//! `src_device;hex(src_incarnation);dst_device;name;frame_id:iter_id`, for example
//! `/job:worker/replica:0/task:0/device:CPU:0;00000000000000ff;/job:ps/replica:0/task:0/device:CPU:0;grad;0:0`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::sync::oneshot;

/// A parsed rendezvous key. [`ParsedKey::full_key`] is the canonical string form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ParsedKey {
    /// Device that produces the tensor.
    pub src_device: String,
    /// Incarnation of the source device (changes when its task restarts).
    pub src_incarnation: u64,
    /// Device that consumes the tensor.
    pub dst_device: String,
    /// Name of the edge.
    pub edge_name: String,
    /// The fifth part as written: `frame_id:iter_id` when TensorFlow or [`create_key`] made
    /// it, but any text TensorFlow's `ParseKey` takes (it does not interpret this part); see
    /// [`frame_and_iter`](Self::frame_and_iter).
    pub frame_iter: String,
    full_key: String,
}

/// Why a rendezvous key could not be parsed. The checks, and their order, are TensorFlow's
/// `Rendezvous::ParseKey`: five `;`-separated parts with a non-empty fifth, a source device
/// name, a hexadecimal incarnation, a destination device name, a non-empty edge name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Not five `;`-separated parts (a single `;` after the fifth is allowed, as in TensorFlow).
    #[error("rendezvous key `{key}` has {parts} `;`-separated parts, expected 5 (src_device;src_incarnation;dst_device;name;frame:iter)")]
    WrongPartCount {
        /// The key.
        key: String,
        /// Parts found.
        parts: usize,
    },
    /// The edge name or the frame part is empty.
    #[error("rendezvous key `{key}` has an empty {part}")]
    EmptyPart {
        /// The key.
        key: String,
        /// Which part.
        part: &'static str,
    },
    /// A device part is not a device name as TensorFlow's `DeviceNameUtils::ParseFullName`
    /// takes it (`/job:NAME`, `/replica:N`, `/task:N`, `/device:TYPE:N`, `/cpu:N`, `/gpu:N`,
    /// any of them `*`, in any order; empty and `/` are names too).
    #[error("rendezvous key `{key}`: {part} `{found}` is not a device name (like /job:worker/replica:0/task:0/device:CPU:0)")]
    BadDevice {
        /// The key.
        key: String,
        /// Which part.
        part: &'static str,
        /// The part found.
        found: String,
    },
    /// The incarnation is not a hexadecimal u64.
    #[error("rendezvous key `{key}`: incarnation `{found}` is not a hexadecimal 64-bit number")]
    BadIncarnation {
        /// The key.
        key: String,
        /// The part found.
        found: String,
    },
}

/// Builds the canonical key string, as TensorFlow's `Rendezvous::CreateKey`.
///
/// ```
/// let key = van_core::rendezvous::create_key("/cpu:0", 255, "/gpu:0", "x", (0, 3));
/// assert_eq!(key, "/cpu:0;00000000000000ff;/gpu:0;x;0:3");
/// ```
pub fn create_key(
    src_device: &str,
    src_incarnation: u64,
    dst_device: &str,
    name: &str,
    (frame_id, iter_id): (u64, u64),
) -> String {
    format!("{src_device};{src_incarnation:016x};{dst_device};{name};{frame_id}:{iter_id}")
}

/// Parses a key built by [`create_key`] or by TensorFlow, accepting exactly what
/// TensorFlow's `Rendezvous::ParseKey` accepts (see [`KeyError`] for the rules), except
/// incarnations beyond 64 bits, which recent TensorFlow rejects and older wraps.
pub fn parse_key(key: &str) -> Result<ParsedKey, KeyError> {
    let mut parts = [""; 5];
    let mut rest = key;
    for (i, part) in parts.iter_mut().enumerate() {
        match rest.find(';') {
            Some(at) => {
                *part = &rest[..at];
                rest = &rest[at + 1..];
            }
            None if i == 4 => {
                *part = rest;
                rest = "";
            }
            None => {
                return Err(KeyError::WrongPartCount {
                    key: key.to_owned(),
                    parts: i + 1,
                })
            }
        }
    }
    if !rest.is_empty() {
        return Err(KeyError::WrongPartCount {
            key: key.to_owned(),
            parts: 6 + rest.matches(';').count(),
        });
    }
    let [src, incarnation, dst, name, frame_iter] = parts;
    let empty = |part| KeyError::EmptyPart {
        key: key.to_owned(),
        part,
    };
    if frame_iter.is_empty() {
        return Err(empty("frame:iter part"));
    }
    let device = |value: &str, part| {
        if is_device_name(value) {
            Ok(())
        } else {
            Err(KeyError::BadDevice {
                key: key.to_owned(),
                part,
                found: value.to_owned(),
            })
        }
    };
    device(src, "src_device")?;
    let digits = incarnation.trim_start_matches('0');
    let src_incarnation = (!incarnation.is_empty()
        && incarnation.bytes().all(|b| b.is_ascii_hexdigit())
        && digits.len() <= 16)
        .then(|| u64::from_str_radix(if digits.is_empty() { "0" } else { digits }, 16).ok())
        .flatten()
        .ok_or_else(|| KeyError::BadIncarnation {
            key: key.to_owned(),
            found: incarnation.to_owned(),
        })?;
    device(dst, "dst_device")?;
    if name.is_empty() {
        return Err(empty("name"));
    }
    Ok(ParsedKey {
        src_device: src.to_owned(),
        src_incarnation,
        dst_device: dst.to_owned(),
        edge_name: name.to_owned(),
        frame_iter: frame_iter.to_owned(),
        full_key: key.to_owned(),
    })
}

/// Whether `name` is a device name as TensorFlow's `DeviceNameUtils::ParseFullName` takes
/// it: empty, `/`, or components `/job:NAME`, `/replica:N`, `/task:N`, `/device:TYPE[:N]`,
/// `/cpu:N`, `/CPU:N`, `/gpu:N`, `/GPU:N` in any order, where NAME and TYPE start with an
/// ASCII letter followed by letters, digits or `_`, N is decimal, and any value may be `*`.
pub fn is_device_name(name: &str) -> bool {
    if name.is_empty() || name == "/" {
        return true;
    }
    let mut s = name;
    while !s.is_empty() {
        let next = if let Some(rest) = s.strip_prefix("/job:") {
            star_or(rest, identifier)
        } else if let Some(rest) = s
            .strip_prefix("/replica:")
            .or_else(|| s.strip_prefix("/task:"))
        {
            star_or(rest, number)
        } else if let Some(rest) = s.strip_prefix("/device:") {
            star_or(rest, identifier).and_then(|rest| match rest.strip_prefix(':') {
                Some(id) => star_or(id, number),
                None => Some(rest),
            })
        } else if let Some(rest) = ["/cpu:", "/CPU:", "/gpu:", "/GPU:"]
            .iter()
            .find_map(|p| s.strip_prefix(p))
        {
            star_or(rest, number)
        } else {
            None
        };
        match next {
            Some(rest) => s = rest,
            None => return false,
        }
    }
    true
}

/// `s` after a leading `*`, or after what `value` consumes.
fn star_or(s: &str, value: impl Fn(&str) -> Option<&str>) -> Option<&str> {
    match s.strip_prefix('*') {
        Some(rest) => Some(rest),
        None => value(s),
    }
}

/// `s` after an identifier (an ASCII letter, then letters, digits or `_`).
fn identifier(s: &str) -> Option<&str> {
    if !s.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return None;
    }
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    Some(&s[end..])
}

/// `s` after a decimal number that fits 64 bits.
fn number(s: &str) -> Option<&str> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s[..end].parse::<u64>().ok().map(|_| &s[end..])
}

impl ParsedKey {
    /// The key string this was parsed from.
    pub fn full_key(&self) -> &str {
        &self.full_key
    }

    /// The frame id and iteration when the fifth part is `frame_id:iter_id` in decimal (as
    /// TensorFlow writes it: its iteration may be -1).
    pub fn frame_and_iter(&self) -> Option<(u64, i64)> {
        let (frame, iter) = self.frame_iter.split_once(':')?;
        let decimal = |s: &str| {
            !s.is_empty()
                && s.trim_start_matches('-')
                    .bytes()
                    .all(|b| b.is_ascii_digit())
        };
        if !decimal(frame) || frame.starts_with('-') || !decimal(iter) {
            return None;
        }
        Some((frame.parse().ok()?, iter.parse().ok()?))
    }
}

impl std::fmt::Display for ParsedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.full_key)
    }
}

/// A received tensor: its bytes, TensorFlow's dead-tensor flag, and the header its sender
/// gave it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Received {
    /// The tensor's bytes.
    pub value: Bytes,
    /// Whether the tensor is dead (produced by an untaken branch).
    pub is_dead: bool,
    /// What describes the bytes, sent beside them so that neither is copied into the other
    /// (TensorFlow's data type and shape, from `vans.tensorflow`'s server plugin); empty
    /// unless the sender gave one.
    pub header: Bytes,
}

/// Why a rendezvous operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RendezvousError {
    /// The rendezvous was aborted; every pending and later call gets this.
    #[error("rendezvous aborted: {0}")]
    Aborted(String),
    /// A receive's deadline passed.
    #[error("deadline exceeded waiting for `{key}`")]
    DeadlineExceeded {
        /// The key waited for.
        key: String,
    },
    /// The remote side failed (peer gone, transport error).
    #[error("step {step_id}, key `{key}`, peer {peer}: {reason}")]
    Remote {
        /// The step.
        step_id: i64,
        /// The key.
        key: String,
        /// The peer task.
        peer: String,
        /// What happened.
        reason: String,
    },
    /// The key was malformed.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The call does not fit this rendezvous: a key whose device is not on this task, a
    /// device no task owns, a call on a rendezvous that cannot take it. The text says which.
    #[error("invalid rendezvous call: {0}")]
    InvalidArgument(String),
}

/// Called once with the result of a receive.
pub type DoneCallback = Box<dyn FnOnce(Result<Received, RendezvousError>) + Send + 'static>;

/// TensorFlow's `Rendezvous` contract.
///
/// `send` never blocks; `recv_async` calls `done` exactly once, possibly before it returns
/// (value already there) or later from whatever thread produces the value; `start_abort`
/// fails every pending and future call with the given error.
pub trait Rendezvous: Send + Sync {
    /// Makes `value` available under `key`.
    fn send(&self, key: &ParsedKey, value: Bytes, is_dead: bool) -> Result<(), RendezvousError>;

    /// Asks for the value under `key`; `done` receives it.
    fn recv_async(&self, key: &ParsedKey, done: DoneCallback);

    /// Aborts: pending and future calls fail with `error`.
    fn start_abort(&self, error: RendezvousError);

    /// The value under `key`, as a future.
    fn recv(&self, key: &ParsedKey) -> RecvFuture {
        let (tx, rx) = oneshot::channel();
        self.recv_async(
            key,
            Box::new(move |result| {
                // The receiver may have given up (dropped the future); nothing to do then.
                let _ = tx.send(result);
            }),
        );
        RecvFuture {
            rx,
            key: key.full_key().to_owned(),
        }
    }
}

/// The future of [`Rendezvous::recv`].
#[derive(Debug)]
pub struct RecvFuture {
    rx: oneshot::Receiver<Result<Received, RendezvousError>>,
    key: String,
}

impl RecvFuture {
    /// A receive of `key` answered through `rx`, for implementations that complete receives
    /// through a channel rather than a callback (so that a dropped future is visible to the
    /// rendezvous as a closed channel). The channel closing without an answer is reported
    /// as [`RendezvousError::Aborted`].
    pub fn new(
        key: impl Into<String>,
        rx: oneshot::Receiver<Result<Received, RendezvousError>>,
    ) -> RecvFuture {
        RecvFuture {
            rx,
            key: key.into(),
        }
    }
}

impl Future for RecvFuture {
    type Output = Result<Received, RendezvousError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx).poll(cx).map(|result| {
            result.unwrap_or_else(|_| {
                Err(RendezvousError::Aborted(format!(
                    "the rendezvous dropped the receive of `{}` without answering",
                    self.key
                )))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_tensorflow_keys() {
        let key = "/job:worker/replica:0/task:0/device:CPU:0;00000000000000ff;/job:ps/replica:0/task:0/device:CPU:0;grad/w;2:7";
        let parsed = parse_key(key).unwrap();
        assert_eq!(parsed.src_incarnation, 255);
        assert_eq!(parsed.edge_name, "grad/w");
        assert_eq!(parsed.frame_and_iter(), Some((2, 7)));
        assert_eq!(parsed.full_key(), key);
        // TensorFlow's own test key.
        let key = "/job:mnist/replica:1/task:2/CPU:0;0000000000001ed2;/job:mnist/replica:1/task:2/device:GPU:0;var0;0:0";
        let parsed = parse_key(key).unwrap();
        assert_eq!(parsed.src_incarnation, 7890);
        assert_eq!(parsed.src_device, "/job:mnist/replica:1/task:2/CPU:0");
        assert_eq!(
            parsed.dst_device,
            "/job:mnist/replica:1/task:2/device:GPU:0"
        );
        assert_eq!(
            key,
            create_key(&parsed.src_device, 7890, &parsed.dst_device, "var0", (0, 0))
        );
    }

    /// What TensorFlow's ParseKey accepts and rejects (its tests, and its code's rules).
    #[test]
    fn accepts_exactly_what_tensorflow_accepts() {
        let accept = [
            "/cpu:0;FF;/gpu:0;x;0:3",
            "/cpu:0;1;/cpu:0;a:b/c;foo",
            "/cpu:0;1;/cpu:0;x;0",
            "/cpu:0;1;/cpu:0;x;0:-1",
            "/cpu:0;1;/cpu:0;x;0:0;",
            "/cpu:0;00000000000000001;/cpu:0;x;0:0",
            ";1;;x;0:0",
            "/;1;/;x;0:0",
        ];
        for key in accept {
            assert!(parse_key(key).is_ok(), "{key}: {:?}", parse_key(key));
        }
        assert_eq!(
            parse_key("/cpu:0;FF;/gpu:0;x;0:3").map(|k| k.src_incarnation),
            Ok(255)
        );
        assert_eq!(
            parse_key("/cpu:0;1;/cpu:0;x;0:-1")
                .ok()
                .and_then(|k| k.frame_and_iter()),
            Some((0, -1))
        );
        assert_eq!(
            parse_key("/cpu:0;1;/cpu:0;x;foo")
                .ok()
                .and_then(|k| k.frame_and_iter()),
            None
        );
        let reject = [
            "foo;bar;baz",
            "a;1;b;c",
            "/cpu:0;1;/cpu:0;x;0:0;;",
            "/cpu:0;1;/cpu:0;x;0:0;more",
            "a;1;b;c;0:0",
            "/job:foo-bar/task:0/cpu:0;1;/cpu:0;x;0:0",
            "/cpu:0;1;/device:gpu:;x;0:0",
            "/cpu:0;+1;/cpu:0;x;0:0",
            "/cpu:0;0x1;/cpu:0;x;0:0",
            "/cpu:0;;/cpu:0;x;0:0",
            "/cpu:0;11112222333344445;/cpu:0;x;0:0",
            "/cpu:0;1;/cpu:0;;0:0",
            "/cpu:0;1;/cpu:0;x;",
        ];
        for key in reject {
            assert!(parse_key(key).is_err(), "{key} parsed");
        }
        assert!(matches!(
            parse_key("a;1;b;c"),
            Err(KeyError::WrongPartCount { parts: 4, .. })
        ));
        // The device is checked before the incarnation, as in TensorFlow.
        assert!(matches!(
            parse_key("a;xyz;b;c;0:0"),
            Err(KeyError::BadDevice {
                part: "src_device",
                ..
            })
        ));
    }

    #[test]
    fn device_names_as_tensorflow_parses_them() {
        for name in [
            "/job:foo/replica:1/task:2/gpu:3",
            "/job:foo_bar/replica:1/task:2/device:GPU:3",
            "/job:*/replica:4/gpu:*",
            "/job:*/replica:4/device:GPU:*",
            "/job:*/device:GPU/replica:4",
            "/job:*/replica:4/device:myspecialdevice:13",
            "/",
            "/gpu:*/job:*/replica:4",
            "",
        ] {
            assert!(is_device_name(name), "{name}");
        }
        for name in [
            "foobar",
            "/job:123/replica:1/task:2/gpu:3",
            "/job:123/replica:1/task:2/gpu:",
            "/job:123/replica:1/task:2/device:gpu:",
            "/job:foo/replica:-1/task:2/gpu:3",
            "/job:foo/replica:1/task:-2/gpu:3",
            "/job:foo/replica:1/task:2/bar:3",
            "/job:foo/replica:1/task:2/gpu:3/extra",
            "/Cpu:0",
            "/job:foo/",
        ] {
            assert!(!is_device_name(name), "{name}");
        }
    }

    proptest! {
        #[test]
        fn create_then_parse_round_trips(
            src in "(/job:[a-z][a-z0-9_]{0,8})?(/replica:[0-9]{1,3})?(/task:[0-9]{1,3})?(/device:[A-Z]{3}:[0-9])?",
            dst in "(/job:[a-z][a-z0-9_]{0,8})?(/task:[0-9]{1,3})?(/cpu:[0-9])?",
            name in "[^;]{1,20}",
            incarnation: u64, frame: u64, iter in 0..i64::MAX,
        ) {
            let key = create_key(&src, incarnation, &dst, &name, (frame, iter as u64));
            let parsed = parse_key(&key).unwrap();
            prop_assert_eq!(&parsed.src_device, &src);
            prop_assert_eq!(parsed.src_incarnation, incarnation);
            prop_assert_eq!(&parsed.dst_device, &dst);
            prop_assert_eq!(&parsed.edge_name, &name);
            prop_assert_eq!(parsed.frame_and_iter(), Some((frame, iter)));
            prop_assert_eq!(parsed.full_key(), key.as_str());
        }

        #[test]
        fn parse_never_panics(key in ".{0,80}") {
            let _ = parse_key(&key);
        }
    }
}
