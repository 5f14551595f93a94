//! The rendezvous messages between tasks, carried as ordinary postoffice [`Message`]s of the
//! manager's application (its app and customer ids), so they travel over whichever van the
//! router picked for the peer (TCP, shared memory, …).
//!
//! | command (`meta.head`) | `meta.request` | `meta.request_id` | body text | data segments |
//! | --- | --- | --- | --- | --- |
//! | 1 RecvTensor request | true | the requester's id | key | none |
//! | 1 RecvTensor response | false | echoed | empty, or the error | the value, or none on error |
//! | 2 PushTensor | true | 0 | key | the value |
//! | 3 CancelRecv | true | the request to cancel | empty | none |
//! | 4 Goodbye | true | 0 | why (the header's step id is 0) | none |
//!
//! The body starts with a 12-byte little-endian header, then the text (UTF-8):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 1 | format version, [`VERSION`] |
//! | 1 | 1 | flags: bit 0 = the tensor is dead; bit 1 = the value has a header |
//! | 2 | 1 | status of a response: 0 ok, 1 aborted, 2 invalid argument, 3 failed |
//! | 3 | 1 | reserved, 0 |
//! | 4 | 8 | step id (`i64`) |
//! | 12 | … | key (requests, pushes) or error text (failed responses) |
//!
//! The tensor's bytes are the message's last data segment, as given to `send`: no copy on the
//! way out beyond what the van does, and the receiver gets a slice of the received frame. A
//! value with a header ([`Received::header`]) carries it as the segment before.
//! Decoding checks every length first and never panics; a bad message is a
//! [`MessageError`].

use bytes::{BufMut, Bytes, BytesMut};
use van_core::rendezvous::parse_key;
use van_core::rendezvous::Received;
use van_core::smallvec::smallvec;
use van_core::{DataType, DataTypes, Message, Meta, NodeId, ParsedKey, Parts, RendezvousError};

use crate::error::MessageError;

/// The body format this build speaks.
pub const VERSION: u8 = 1;
/// Bytes of the fixed body header.
pub const HEADER_LEN: usize = 12;

/// `meta.head` of a RecvTensor request or response.
pub const RECV_TENSOR: i32 = 1;
/// `meta.head` of a pushed tensor.
pub const PUSH_TENSOR: i32 = 2;
/// `meta.head` of the cancellation of a RecvTensor request.
pub const CANCEL_RECV: i32 = 3;
/// `meta.head` of a manager's goodbye: it was dropped, so nothing more comes from it.
pub const GOODBYE: i32 = 4;

const FLAG_DEAD: u8 = 1;
const FLAG_HEADER: u8 = 2;

/// The status of a failed RecvTensor response, as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusCode {
    /// The owner's step was aborted (or cleaned up).
    Aborted,
    /// The request did not fit the owner (the key's source device is not there).
    InvalidArgument,
    /// Anything else.
    Failed,
}

impl StatusCode {
    fn to_wire(self) -> u8 {
        match self {
            StatusCode::Aborted => 1,
            StatusCode::InvalidArgument => 2,
            StatusCode::Failed => 3,
        }
    }

    fn from_wire(code: u8) -> Result<Option<StatusCode>, MessageError> {
        Ok(Some(match code {
            0 => return Ok(None),
            1 => StatusCode::Aborted,
            2 => StatusCode::InvalidArgument,
            3 => StatusCode::Failed,
            other => return Err(MessageError::UnknownStatus(other)),
        }))
    }
}

/// A failure reported by the task that owns a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteStatus {
    /// What kind of failure.
    pub code: StatusCode,
    /// The owner's error text.
    pub message: String,
}

impl RemoteStatus {
    /// The status that reports `error` to a requester.
    pub fn from_error(error: &RendezvousError) -> RemoteStatus {
        let (code, message) = match error {
            RendezvousError::Aborted(text) => (StatusCode::Aborted, text.clone()),
            RendezvousError::InvalidArgument(text) => (StatusCode::InvalidArgument, text.clone()),
            RendezvousError::Key(e) => (StatusCode::InvalidArgument, e.to_string()),
            other => (StatusCode::Failed, other.to_string()),
        };
        RemoteStatus { code, message }
    }
}

/// One rendezvous message, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RendezvousMessage {
    /// A consumer asks the owner of `key` for its value in `step_id` (pull).
    RecvRequest {
        /// Echoed by the response.
        request_id: i32,
        /// The step.
        step_id: i64,
        /// The key.
        key: ParsedKey,
    },
    /// The owner's answer to a [`RendezvousMessage::RecvRequest`].
    RecvResponse {
        /// The request answered.
        request_id: i32,
        /// The step.
        step_id: i64,
        /// The value, or why there is none.
        result: Result<Received, RemoteStatus>,
    },
    /// A producer delivers the value of `key` to the consumer's task (push).
    Push {
        /// The step.
        step_id: i64,
        /// The key.
        key: ParsedKey,
        /// The value.
        value: Received,
    },
    /// A consumer withdraws request `request_id` (its step was aborted, or it timed out).
    Cancel {
        /// The request withdrawn.
        request_id: i32,
        /// The step.
        step_id: i64,
    },
    /// The sender's manager was dropped: the calls waiting on it (pulls it was asked, values
    /// it would have pushed) fail at once, and later calls towards it fail without waiting.
    Goodbye {
        /// Why, for the errors of those calls.
        reason: String,
    },
}

/// Where a message goes: the app and customer ids of the manager, sender and recipient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Address {
    /// Application id of the rendezvous managers.
    pub app_id: i32,
    /// Customer id of the rendezvous managers.
    pub customer_id: i32,
    /// This node.
    pub sender: NodeId,
    /// The peer.
    pub recipient: NodeId,
}

fn body(step_id: i64, flags: u8, status: u8, text: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_LEN + text.len());
    out.put_u8(VERSION);
    out.put_u8(flags);
    out.put_u8(status);
    out.put_u8(0);
    out.put_i64_le(step_id);
    out.put_slice(text.as_bytes());
    out.freeze()
}

/// The flags of `value`, and its segments: the header (when it has one), then the bytes.
fn value_parts(value: Received) -> (u8, Parts) {
    let mut flags = if value.is_dead { FLAG_DEAD } else { 0 };
    let data = if value.header.is_empty() {
        smallvec![value.value]
    } else {
        flags |= FLAG_HEADER;
        smallvec![value.header, value.value]
    };
    (flags, data)
}

fn message(
    head: i32,
    request: bool,
    request_id: i32,
    body: Bytes,
    data: Parts,
    address: Address,
) -> Message {
    let data_types: DataTypes = data.iter().map(|_| DataType::U8).collect();
    Message {
        meta: Meta {
            head,
            app_id: address.app_id,
            customer_id: address.customer_id,
            request_id,
            sender: Some(address.sender),
            recipient: Some(address.recipient),
            request,
            body,
            data_types,
            ..Meta::default()
        },
        data,
    }
}

/// A RecvTensor request for `key` of `step_id`.
pub(crate) fn recv_request(request_id: i32, step_id: i64, key: &str, address: Address) -> Message {
    let body = body(step_id, 0, 0, key);
    message(RECV_TENSOR, true, request_id, body, Parts::new(), address)
}

/// The answer to RecvTensor request `request_id`.
pub(crate) fn recv_response(
    request_id: i32,
    step_id: i64,
    result: Result<Received, RemoteStatus>,
    address: Address,
) -> Message {
    match result {
        Ok(value) => {
            let (flags, data) = value_parts(value);
            let body = body(step_id, flags, 0, "");
            message(RECV_TENSOR, false, request_id, body, data, address)
        }
        Err(status) => {
            let body = body(step_id, 0, status.code.to_wire(), &status.message);
            message(RECV_TENSOR, false, request_id, body, Parts::new(), address)
        }
    }
}

/// The value of `key` of `step_id`, pushed to its consumer.
pub(crate) fn push(step_id: i64, key: &str, value: Received, address: Address) -> Message {
    let (flags, data) = value_parts(value);
    let body = body(step_id, flags, 0, key);
    message(PUSH_TENSOR, true, 0, body, data, address)
}

/// The withdrawal of RecvTensor request `request_id`.
pub(crate) fn cancel(request_id: i32, step_id: i64, address: Address) -> Message {
    let body = body(step_id, 0, 0, "");
    message(CANCEL_RECV, true, request_id, body, Parts::new(), address)
}

/// The goodbye of a manager that was dropped, saying why.
pub(crate) fn goodbye(reason: &str, address: Address) -> Message {
    let body = body(0, 0, 0, reason);
    message(GOODBYE, true, 0, body, Parts::new(), address)
}

/// The step id and text of a peer's body whose header can be read (long enough, of this
/// version), however bad the rest is (the text lossily decoded): to fail the step a message
/// that does not decode was meant for.
pub(crate) fn peek_header(body: &[u8]) -> Option<(i64, std::borrow::Cow<'_, str>)> {
    if body.first() != Some(&VERSION) {
        return None;
    }
    let mut step = [0u8; 8];
    step.copy_from_slice(body.get(4..HEADER_LEN)?);
    let text = String::from_utf8_lossy(body.get(HEADER_LEN..)?);
    Some((i64::from_le_bytes(step), text))
}

/// The step id and text of an encoded body, if it has a header (for error reports about
/// messages this node sent).
pub(crate) fn peek(body: &[u8]) -> Option<(i64, &str)> {
    let header = body.get(..HEADER_LEN)?;
    let mut step = [0u8; 8];
    step.copy_from_slice(header.get(4..HEADER_LEN)?);
    let text = std::str::from_utf8(body.get(HEADER_LEN..)?).ok()?;
    Some((i64::from_le_bytes(step), text))
}

impl RendezvousMessage {
    /// The message's command (`meta.head`).
    pub fn command(&self) -> i32 {
        match self {
            RendezvousMessage::RecvRequest { .. } | RendezvousMessage::RecvResponse { .. } => {
                RECV_TENSOR
            }
            RendezvousMessage::Push { .. } => PUSH_TENSOR,
            RendezvousMessage::Cancel { .. } => CANCEL_RECV,
            RendezvousMessage::Goodbye { .. } => GOODBYE,
        }
    }

    /// The step the message belongs to (0 for a goodbye, which concerns every step).
    pub fn step_id(&self) -> i64 {
        match self {
            RendezvousMessage::RecvRequest { step_id, .. }
            | RendezvousMessage::RecvResponse { step_id, .. }
            | RendezvousMessage::Push { step_id, .. }
            | RendezvousMessage::Cancel { step_id, .. } => *step_id,
            RendezvousMessage::Goodbye { .. } => 0,
        }
    }

    /// The postoffice message carrying this one to `address.recipient`.
    pub fn encode(self, address: Address) -> Message {
        match self {
            RendezvousMessage::RecvRequest {
                request_id,
                step_id,
                key,
            } => recv_request(request_id, step_id, key.full_key(), address),
            RendezvousMessage::RecvResponse {
                request_id,
                step_id,
                result,
            } => recv_response(request_id, step_id, result, address),
            RendezvousMessage::Push {
                step_id,
                key,
                value,
            } => push(step_id, key.full_key(), value, address),
            RendezvousMessage::Cancel {
                request_id,
                step_id,
            } => cancel(request_id, step_id, address),
            RendezvousMessage::Goodbye { reason } => goodbye(&reason, address),
        }
    }

    /// Decodes a message of the rendezvous application. The value's bytes are the received
    /// segment itself (no copy).
    pub fn decode(msg: Message) -> Result<RendezvousMessage, MessageError> {
        let Message { meta, mut data } = msg;
        let body = &meta.body;
        if body.len() < HEADER_LEN {
            return Err(MessageError::Truncated {
                len: body.len(),
                needed: HEADER_LEN,
            });
        }
        if body[0] != VERSION {
            return Err(MessageError::Version {
                found: body[0],
                supported: VERSION,
            });
        }
        let flags = body[1];
        let status = StatusCode::from_wire(body[2])?;
        let mut step = [0u8; 8];
        step.copy_from_slice(&body[4..HEADER_LEN]);
        let step_id = i64::from_le_bytes(step);
        let text = std::str::from_utf8(&body[HEADER_LEN..]).map_err(|_| MessageError::NotUtf8)?;
        let is_dead = flags & FLAG_DEAD != 0;
        // A value's segments: its header first when the flag says it has one.
        let value_segments = 1 + usize::from(flags & FLAG_HEADER != 0);
        let value = |data: &mut Parts| {
            let value = data.pop().unwrap_or_default();
            let header = data.pop().unwrap_or_default();
            Received {
                value,
                is_dead,
                header,
            }
        };
        let segments = |command: &'static str, expected: usize| {
            if data.len() == expected {
                Ok(())
            } else {
                Err(MessageError::Segments {
                    command,
                    found: data.len(),
                    expected,
                })
            }
        };
        Ok(match (meta.head, meta.request) {
            (RECV_TENSOR, true) => {
                segments("RecvTensor request", 0)?;
                RendezvousMessage::RecvRequest {
                    request_id: meta.request_id,
                    step_id,
                    key: parse_key(text)?,
                }
            }
            (RECV_TENSOR, false) => {
                let result = match status {
                    None => {
                        segments("RecvTensor response", value_segments)?;
                        Ok(value(&mut data))
                    }
                    Some(code) => {
                        segments("failed RecvTensor response", 0)?;
                        Err(RemoteStatus {
                            code,
                            message: text.to_owned(),
                        })
                    }
                };
                RendezvousMessage::RecvResponse {
                    request_id: meta.request_id,
                    step_id,
                    result,
                }
            }
            (PUSH_TENSOR, _) => {
                segments("PushTensor", value_segments)?;
                let key = parse_key(text)?;
                RendezvousMessage::Push {
                    step_id,
                    key,
                    value: value(&mut data),
                }
            }
            (CANCEL_RECV, _) => {
                segments("CancelRecv", 0)?;
                RendezvousMessage::Cancel {
                    request_id: meta.request_id,
                    step_id,
                }
            }
            (GOODBYE, _) => {
                segments("Goodbye", 0)?;
                RendezvousMessage::Goodbye {
                    reason: text.to_owned(),
                }
            }
            (other, _) => return Err(MessageError::UnknownCommand(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use van_core::rendezvous::create_key;

    const ADDRESS: Address = Address {
        app_id: 5,
        customer_id: 1,
        sender: 9,
        recipient: 8,
    };

    fn key(name: &str) -> ParsedKey {
        parse_key(&create_key(
            "/job:worker/replica:0/task:0/device:CPU:0",
            3,
            "/job:ps/replica:0/task:0/device:CPU:0",
            name,
            (0, 1),
        ))
        .unwrap()
    }

    fn message() -> impl Strategy<Value = RendezvousMessage> {
        let value = (
            proptest::collection::vec(any::<u8>(), 0..64),
            any::<bool>(),
            proptest::collection::vec(any::<u8>(), 0..16),
        )
            .prop_map(|(v, is_dead, h)| Received {
                value: Bytes::from(v),
                is_dead,
                header: Bytes::from(h),
            });
        let status = (0..3u8, ".{0,40}").prop_map(|(c, message)| RemoteStatus {
            code: [
                StatusCode::Aborted,
                StatusCode::InvalidArgument,
                StatusCode::Failed,
            ][usize::from(c)],
            message,
        });
        prop_oneof![
            (any::<i32>(), any::<i64>(), "[a-z/]{1,20}").prop_map(|(request_id, step_id, n)| {
                RendezvousMessage::RecvRequest {
                    request_id,
                    step_id,
                    key: key(&n),
                }
            }),
            (any::<i32>(), any::<i64>(), value.clone()).prop_map(|(request_id, step_id, v)| {
                RendezvousMessage::RecvResponse {
                    request_id,
                    step_id,
                    result: Ok(v),
                }
            }),
            (any::<i32>(), any::<i64>(), status).prop_map(|(request_id, step_id, s)| {
                RendezvousMessage::RecvResponse {
                    request_id,
                    step_id,
                    result: Err(s),
                }
            }),
            (any::<i64>(), "[a-z/]{1,20}", value).prop_map(|(step_id, n, value)| {
                RendezvousMessage::Push {
                    step_id,
                    key: key(&n),
                    value,
                }
            }),
            (any::<i32>(), any::<i64>()).prop_map(|(request_id, step_id)| {
                RendezvousMessage::Cancel {
                    request_id,
                    step_id,
                }
            }),
            ".{0,40}".prop_map(|reason| RendezvousMessage::Goodbye { reason }),
        ]
    }

    proptest! {
        #[test]
        fn every_message_round_trips(msg in message()) {
            let encoded = msg.clone().encode(ADDRESS);
            prop_assert_eq!(encoded.meta.head, msg.command());
            prop_assert_eq!(encoded.meta.recipient, Some(8));
            prop_assert_eq!(RendezvousMessage::decode(encoded).unwrap(), msg);
        }

        #[test]
        fn decoding_arbitrary_messages_never_panics(
            head in 0..5i32,
            request: bool,
            body in proptest::collection::vec(any::<u8>(), 0..40),
            segments in 0..3usize,
        ) {
            let mut body = body;
            if body.len() > 2 && head % 2 == 0 {
                body[0] = VERSION; // reach past the version check half the time
            }
            let msg = Message {
                meta: Meta { head, request, body: Bytes::from(body), ..Meta::default() },
                data: van_core::smallvec::smallvec![Bytes::from_static(b"x"); segments],
            };
            let _ = RendezvousMessage::decode(msg);
        }
    }

    #[test]
    fn bad_messages_are_typed_errors() {
        let good = RendezvousMessage::Push {
            step_id: 1,
            key: key("x"),
            value: Received {
                value: Bytes::from_static(b"v"),
                is_dead: false,
                header: Bytes::new(),
            },
        }
        .encode(ADDRESS);
        let with_body = |body: &[u8]| {
            let mut m = good.clone();
            m.meta.body = Bytes::copy_from_slice(body);
            m
        };
        assert_eq!(
            RendezvousMessage::decode(with_body(b"abc")),
            Err(MessageError::Truncated { len: 3, needed: 12 })
        );
        let mut v2 = good.meta.body.to_vec();
        v2[0] = 2;
        assert_eq!(
            RendezvousMessage::decode(with_body(&v2)),
            Err(MessageError::Version {
                found: 2,
                supported: 1
            })
        );
        let mut bad_key = good.meta.body[..HEADER_LEN].to_vec();
        bad_key.extend_from_slice(b"a;b");
        assert!(matches!(
            RendezvousMessage::decode(with_body(&bad_key)),
            Err(MessageError::Key(_))
        ));
        let mut not_utf8 = good.meta.body[..HEADER_LEN].to_vec();
        not_utf8.push(0xff);
        assert_eq!(
            RendezvousMessage::decode(with_body(&not_utf8)),
            Err(MessageError::NotUtf8)
        );
        let mut no_value = good.clone();
        no_value.data.clear();
        assert!(matches!(
            RendezvousMessage::decode(no_value),
            Err(MessageError::Segments {
                found: 0,
                expected: 1,
                ..
            })
        ));
        let mut unknown = good;
        unknown.meta.head = 77;
        assert_eq!(
            RendezvousMessage::decode(unknown),
            Err(MessageError::UnknownCommand(77))
        );
    }

    #[test]
    fn a_readable_header_names_the_step_and_key_of_a_bad_message() {
        let mut body = body(7, 0, 0, "a;b").to_vec();
        assert_eq!(
            peek_header(&body).map(|(s, k)| (s, k.into_owned())),
            Some((7, "a;b".to_owned()))
        );
        body.push(0xff); // not UTF-8: still readable, lossily
        assert_eq!(peek_header(&body).map(|(s, _)| s), Some(7));
        body[0] = VERSION + 1;
        assert_eq!(peek_header(&body), None);
        assert_eq!(peek_header(&[VERSION, 0, 0]), None);
    }

    #[test]
    fn the_value_is_the_segment_itself() {
        let value = Bytes::from(vec![7u8; 4096]);
        let msg = RendezvousMessage::Push {
            step_id: 3,
            key: key("big"),
            value: Received {
                value: value.clone(),
                is_dead: true,
                header: Bytes::new(),
            },
        }
        .encode(ADDRESS);
        assert_eq!(msg.data[0].as_ptr(), value.as_ptr());
        let RendezvousMessage::Push { value: got, .. } = RendezvousMessage::decode(msg).unwrap()
        else {
            panic!("not a push");
        };
        assert_eq!(got.value.as_ptr(), value.as_ptr());
        assert!(got.is_dead);
    }
}
