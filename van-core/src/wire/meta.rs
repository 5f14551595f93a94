//! Encoding and decoding of [`Meta`]; the byte layout is documented in the parent module.

use bytes::{BufMut, Bytes, BytesMut};

use super::WireError;
use crate::message::{
    Command, Control, DataType, Endpoint, Meta, Node, NodeId, Role, Seq, TfTask, VanKind,
};

/// ps-lite's `Meta::kEmpty`: the wire value of an absent node id.
const NO_NODE: i32 = i32::MAX;

const FLAG_REQUEST: u8 = 1;
const FLAG_PUSH: u8 = 1 << 1;
const FLAG_PULL: u8 = 1 << 2;
const FLAG_SIMPLE_APP: u8 = 1 << 3;
const FLAG_CONTROL: u8 = 1 << 4;
const FLAG_SEQ: u8 = 1 << 5;
const KNOWN_FLAGS: u8 =
    FLAG_REQUEST | FLAG_PUSH | FLAG_PULL | FLAG_SIMPLE_APP | FLAG_CONTROL | FLAG_SEQ;

/// Smallest encoded node (role, id, two empty strings, port, recovery, incarnation, no task,
/// no endpoints), used to bound a node count by the bytes present before allocating.
const MIN_NODE_LEN: usize = 1 + 4 + 2 + 2 + 2 + 1 + 8 + 2 + 4 + 2;

fn node_id_to_wire(id: Option<NodeId>, field: &'static str) -> Result<i32, WireError> {
    match id {
        Some(NO_NODE) => Err(WireError::Unencodable {
            field,
            reason: "node id i32::MAX is reserved on the wire for \"no node\"",
        }),
        Some(id) => Ok(id),
        None => Ok(NO_NODE),
    }
}

fn node_id_from_wire(raw: i32) -> Option<NodeId> {
    (raw != NO_NODE).then_some(raw)
}

/// Appends the encoding of `meta` to `out`.
///
/// Fails, rather than change the message, when a field cannot be represented: a node id of
/// `i32::MAX` (the wire's "no node"), a string over 65,535 bytes, more than 65,535 endpoints,
/// or a body or list over `u32::MAX`. On error `out` may hold a partial encoding.
pub fn encode_meta(meta: &Meta, out: &mut BytesMut) -> Result<(), WireError> {
    out.put_i32_le(meta.head);
    out.put_i32_le(meta.app_id);
    out.put_i32_le(meta.customer_id);
    out.put_i32_le(meta.request_id);
    out.put_i32_le(node_id_to_wire(meta.sender, "sender")?);
    out.put_i32_le(node_id_to_wire(meta.recipient, "recipient")?);
    let mut flags = 0;
    for (set, bit) in [
        (meta.request, FLAG_REQUEST),
        (meta.push, FLAG_PUSH),
        (meta.pull, FLAG_PULL),
        (meta.simple_app, FLAG_SIMPLE_APP),
        (meta.control.is_some(), FLAG_CONTROL),
        (meta.seq.is_some(), FLAG_SEQ),
    ] {
        if set {
            flags |= bit;
        }
    }
    out.put_u8(flags);
    out.put_i32_le(meta.priority);
    out.put_u64_le(meta.key);
    out.put_u64_le(meta.addr);
    out.put_u64_le(meta.val_len);
    out.put_i32_le(meta.option);
    if let Some(seq) = meta.seq {
        out.put_u64_le(seq.number);
        out.put_u64_le(seq.to);
    }
    out.put_u32_le(len_u32(meta.body.len(), "body")?);
    out.put_slice(&meta.body);
    out.put_u32_le(len_u32(meta.data_types.len(), "data types")?);
    for t in &meta.data_types {
        out.put_u8(t.to_wire());
    }
    if let Some(control) = &meta.control {
        out.put_u8(control.cmd.to_wire());
        out.put_i32_le(control.barrier_group);
        out.put_u64_le(control.msg_sig);
        out.put_u32_le(len_u32(control.nodes.len(), "node count")?);
        for node in control.nodes.iter() {
            encode_node(node, out)?;
        }
    }
    Ok(())
}

fn len_u32(len: usize, field: &'static str) -> Result<u32, WireError> {
    u32::try_from(len).map_err(|_| WireError::Unencodable {
        field,
        reason: "longer than u32::MAX",
    })
}

fn len_u16(len: usize, field: &'static str) -> Result<u16, WireError> {
    u16::try_from(len).map_err(|_| WireError::Unencodable {
        field,
        reason: "longer than 65,535",
    })
}

fn put_short_str(out: &mut BytesMut, s: &str, field: &'static str) -> Result<(), WireError> {
    out.put_u16_le(len_u16(s.len(), field)?);
    out.put_slice(s.as_bytes());
    Ok(())
}

fn encode_node(node: &Node, out: &mut BytesMut) -> Result<(), WireError> {
    out.put_u8(node.role.to_wire());
    out.put_i32_le(node_id_to_wire(node.id, "node id")?);
    put_short_str(out, &node.host, "node host")?;
    out.put_u16_le(node.port);
    put_short_str(out, &node.host_identity, "node host identity")?;
    out.put_u8(u8::from(node.is_recovery));
    out.put_u64_le(node.incarnation);
    match &node.task {
        Some(task) if task.job.is_empty() => {
            return Err(WireError::Unencodable {
                field: "node task",
                reason: "a task's job name is empty (the wire's \"no task\")",
            })
        }
        Some(task) => {
            put_short_str(out, &task.job, "node task job")?;
            out.put_u32_le(task.index);
        }
        None => {
            out.put_u16_le(0);
            out.put_u32_le(0);
        }
    }
    out.put_u16_le(len_u16(node.endpoints.len(), "endpoint count")?);
    for endpoint in &node.endpoints {
        out.put_u8(endpoint.kind.to_wire());
        put_short_str(out, &endpoint.address, "endpoint address")?;
    }
    Ok(())
}

/// A bounds-checked cursor over the meta bytes.
struct Reader {
    bytes: Bytes,
    pos: usize,
}

impl Reader {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&[u8], WireError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or(WireError::MetaTruncated { field })?;
        let slice = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(slice)
    }

    fn take_bytes(&mut self, n: usize, field: &'static str) -> Result<Bytes, WireError> {
        let start = self.pos;
        self.take(n, field)?;
        Ok(self.bytes.slice(start..self.pos))
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], WireError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, field)?);
        Ok(out)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, WireError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, WireError> {
        self.array(field).map(u16::from_le_bytes)
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        self.array(field).map(u32::from_le_bytes)
    }

    fn i32(&mut self, field: &'static str) -> Result<i32, WireError> {
        self.array(field).map(i32::from_le_bytes)
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, WireError> {
        self.array(field).map(u64::from_le_bytes)
    }

    fn short_str(&mut self, field: &'static str) -> Result<String, WireError> {
        let len = usize::from(self.u16(field)?);
        let raw = self.take(len, field)?;
        std::str::from_utf8(raw)
            .map(str::to_owned)
            .map_err(|_| WireError::InvalidUtf8 { field })
    }

    /// Reads a count whose items take at least `min_item` bytes each, rejecting counts that
    /// the remaining bytes cannot hold (so no allocation exceeds the input).
    fn count(&mut self, min_item: usize, field: &'static str) -> Result<usize, WireError> {
        let count = self.u32(field)? as usize;
        let remaining = self.bytes.len() - self.pos;
        if count.saturating_mul(min_item) > remaining {
            return Err(WireError::MetaTruncated { field });
        }
        Ok(count)
    }

    fn code<T>(
        &mut self,
        what: &'static str,
        parse: impl FnOnce(u8) -> Option<T>,
    ) -> Result<T, WireError> {
        let code = self.u8(what)?;
        parse(code).ok_or(WireError::UnknownCode { what, code })
    }
}

/// Decodes a meta that fills `bytes` exactly. The body is a zero-copy slice of `bytes`.
pub fn decode_meta(bytes: Bytes) -> Result<Meta, WireError> {
    let mut r = Reader { bytes, pos: 0 };
    let mut meta = Meta {
        head: r.i32("head")?,
        app_id: r.i32("app_id")?,
        customer_id: r.i32("customer_id")?,
        request_id: r.i32("request_id")?,
        sender: node_id_from_wire(r.i32("sender")?),
        recipient: node_id_from_wire(r.i32("recipient")?),
        ..Meta::default()
    };
    let flags = r.u8("flags")?;
    if flags & !KNOWN_FLAGS != 0 {
        return Err(WireError::UnknownCode {
            what: "meta flags",
            code: flags,
        });
    }
    meta.request = flags & FLAG_REQUEST != 0;
    meta.push = flags & FLAG_PUSH != 0;
    meta.pull = flags & FLAG_PULL != 0;
    meta.simple_app = flags & FLAG_SIMPLE_APP != 0;
    meta.priority = r.i32("priority")?;
    meta.key = r.u64("key")?;
    meta.addr = r.u64("addr")?;
    meta.val_len = r.u64("val_len")?;
    meta.option = r.i32("option")?;
    if flags & FLAG_SEQ != 0 {
        meta.seq = Some(Seq {
            number: r.u64("seq")?,
            to: r.u64("seq recipient incarnation")?,
        });
    }
    let body_len = r.u32("body length")? as usize;
    meta.body = r.take_bytes(body_len, "body")?;
    let types = r.count(1, "data types")?;
    meta.data_types = (0..types)
        .map(|_| r.code("data type", DataType::from_wire))
        .collect::<Result<_, _>>()?;
    if flags & FLAG_CONTROL != 0 {
        let cmd = r.code("command", Command::from_wire)?;
        let barrier_group = r.i32("barrier group")?;
        let msg_sig = r.u64("msg_sig")?;
        let count = r.count(MIN_NODE_LEN, "node count")?;
        let nodes = (0..count)
            .map(|_| decode_node(&mut r))
            .collect::<Result<_, _>>()?;
        meta.control = Some(Control {
            cmd,
            nodes,
            barrier_group,
            msg_sig,
        });
    }
    let extra = r.bytes.len() - r.pos;
    if extra != 0 {
        return Err(WireError::MetaTrailingBytes { extra });
    }
    Ok(meta)
}

fn decode_node(r: &mut Reader) -> Result<Node, WireError> {
    let role = r.code("role", Role::from_wire)?;
    let id = node_id_from_wire(r.i32("node id")?);
    let host = r.short_str("node host")?;
    let port = r.u16("node port")?;
    let host_identity = r.short_str("node host identity")?;
    let is_recovery = match r.u8("node is_recovery")? {
        0 => false,
        1 => true,
        code => {
            return Err(WireError::UnknownCode {
                what: "is_recovery flag",
                code,
            })
        }
    };
    let incarnation = r.u64("node incarnation")?;
    let job = r.short_str("node task job")?;
    let index = r.u32("node task index")?;
    let task = match (job.is_empty(), index) {
        (true, 0) => None,
        (true, _) => {
            return Err(WireError::Invalid {
                field: "node task",
                reason: "a task index without a job name",
            })
        }
        (false, index) => Some(TfTask { job, index }),
    };
    let count = usize::from(r.u16("endpoint count")?);
    let mut endpoints = Vec::with_capacity(count.min(r.bytes.len() - r.pos) / 3);
    for _ in 0..count {
        let kind = r.code("van kind", VanKind::from_wire)?;
        let address = r.short_str("endpoint address")?;
        endpoints.push(Endpoint { kind, address });
    }
    Ok(Node {
        role,
        id,
        host,
        port,
        host_identity,
        endpoints,
        is_recovery,
        incarnation,
        task,
    })
}
