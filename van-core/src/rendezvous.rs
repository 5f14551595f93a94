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
    /// Control-flow frame id.
    pub frame_id: u64,
    /// Iteration within the frame.
    pub iter_id: u64,
    full_key: String,
}

/// Why a rendezvous key could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not five `;`-separated parts.
    #[error("rendezvous key `{key}` has {parts} `;`-separated parts, expected 5 (src_device;src_incarnation;dst_device;name;frame:iter)")]
    WrongPartCount {
        /// The key.
        key: String,
        /// Parts found.
        parts: usize,
    },
    /// A device or name part is empty.
    #[error("rendezvous key `{key}` has an empty {part}")]
    EmptyPart {
        /// The key.
        key: String,
        /// Which part.
        part: &'static str,
    },
    /// The incarnation is not a hexadecimal u64.
    #[error("rendezvous key `{key}`: incarnation `{found}` is not a hexadecimal 64-bit number")]
    BadIncarnation {
        /// The key.
        key: String,
        /// The part found.
        found: String,
    },
    /// The last part is not `frame:iter` with decimal numbers.
    #[error("rendezvous key `{key}`: `{found}` is not `frame_id:iter_id`")]
    BadFrameIter {
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

/// Parses a key built by [`create_key`] (or by TensorFlow).
pub fn parse_key(key: &str) -> Result<ParsedKey, KeyError> {
    let parts: Vec<&str> = key.split(';').collect();
    let [src, incarnation, dst, name, frame_iter] = parts[..] else {
        return Err(KeyError::WrongPartCount {
            key: key.to_owned(),
            parts: parts.len(),
        });
    };
    for (value, part) in [(src, "src_device"), (dst, "dst_device"), (name, "name")] {
        if value.is_empty() {
            return Err(KeyError::EmptyPart {
                key: key.to_owned(),
                part,
            });
        }
    }
    let src_incarnation = (!incarnation.is_empty() && incarnation.len() <= 16)
        .then(|| u64::from_str_radix(incarnation, 16).ok())
        .flatten()
        .ok_or_else(|| KeyError::BadIncarnation {
            key: key.to_owned(),
            found: incarnation.to_owned(),
        })?;
    let bad_frame = || KeyError::BadFrameIter {
        key: key.to_owned(),
        found: frame_iter.to_owned(),
    };
    let (frame, iter) = frame_iter.split_once(':').ok_or_else(bad_frame)?;
    let decimal = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    let (Some(frame_id), Some(iter_id)) = (decimal(frame), decimal(iter)) else {
        return Err(bad_frame());
    };
    Ok(ParsedKey {
        src_device: src.to_owned(),
        src_incarnation,
        dst_device: dst.to_owned(),
        edge_name: name.to_owned(),
        frame_id,
        iter_id,
        full_key: key.to_owned(),
    })
}

impl ParsedKey {
    /// The key string this was parsed from.
    pub fn full_key(&self) -> &str {
        &self.full_key
    }
}

impl std::fmt::Display for ParsedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.full_key)
    }
}

/// A received tensor: its bytes and TensorFlow's dead-tensor flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The tensor's bytes.
    pub value: Bytes,
    /// Whether the tensor is dead (produced by an untaken branch).
    pub is_dead: bool,
}

/// Why a rendezvous operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
        assert_eq!((parsed.frame_id, parsed.iter_id), (2, 7));
        assert_eq!(parsed.full_key(), key);
    }

    #[test]
    fn rejects_malformed_keys() {
        assert!(matches!(
            parse_key("a;1;b;c"),
            Err(KeyError::WrongPartCount { parts: 4, .. })
        ));
        assert!(matches!(
            parse_key(";1;b;c;0:0"),
            Err(KeyError::EmptyPart {
                part: "src_device",
                ..
            })
        ));
        assert!(matches!(
            parse_key("a;xyz;b;c;0:0"),
            Err(KeyError::BadIncarnation { .. })
        ));
        assert!(matches!(
            parse_key("a;11112222333344445;b;c;0:0"),
            Err(KeyError::BadIncarnation { .. })
        ));
        assert!(matches!(
            parse_key("a;1;b;c;0"),
            Err(KeyError::BadFrameIter { .. })
        ));
        assert!(matches!(
            parse_key("a;1;b;c;0:+1"),
            Err(KeyError::BadFrameIter { .. })
        ));
    }

    proptest! {
        #[test]
        fn create_then_parse_round_trips(
            src in "[^;]{1,20}", dst in "[^;]{1,20}", name in "[^;]{1,20}",
            incarnation: u64, frame: u64, iter: u64,
        ) {
            let key = create_key(&src, incarnation, &dst, &name, (frame, iter));
            let parsed = parse_key(&key).unwrap();
            prop_assert_eq!(&parsed.src_device, &src);
            prop_assert_eq!(parsed.src_incarnation, incarnation);
            prop_assert_eq!(&parsed.dst_device, &dst);
            prop_assert_eq!(&parsed.edge_name, &name);
            prop_assert_eq!((parsed.frame_id, parsed.iter_id), (frame, iter));
            prop_assert_eq!(parsed.full_key(), key.as_str());
        }

        #[test]
        fn parse_never_panics(key in ".{0,80}") {
            let _ = parse_key(&key);
        }
    }
}
