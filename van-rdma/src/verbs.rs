//! A small owning wrapper over the verbs of `ibverbs-sys` that the data path needs and the
//! `ibverbs` crate's safe API does not expose (its handles hide their raw pointers, so RDMA
//! WRITE_WITH_IMM, a chosen PSN, and memory registered by us are out of its reach).
//!
//! Ownership mirrors the verbs' own rules, so that destruction always succeeds: a protection
//! domain, completion queue or queue pair holds an `Arc` of what it was created from, and a
//! memory region holds its protection domain. Rust drops a value's fields in declaration
//! order; [`Qp`] is declared before the memory it uses wherever both live in one struct.
//!
//! Posting work requests stays `unsafe`: the device reads or writes the memory named by a
//! work request until its completion is polled, which the type system cannot see. Callers
//! (the connection engine) keep that memory alive and untouched until the completion or the
//! queue pair's destruction, and say so in `// SAFETY:` comments.

use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use ibverbs_sys as ffi;

/// The port every queue pair uses (the `ibverbs` crate, ps-lite and BytePS use port 1 too).
pub const PORT: u8 = 1;

/// The `errno` of the last failed call, as an error.
fn last_error() -> io::Error {
    io::Error::last_os_error()
}

fn from_errno(code: i32) -> io::Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(code.abs()))
    }
}

/// Names of the devices libibverbs lists, and a way to open one.
pub struct DeviceList {
    list: NonNull<*mut ffi::ibv_device>,
    len: usize,
}

impl DeviceList {
    /// `ibv_get_device_list`. `ENOSYS` means the kernel has no RDMA support.
    pub fn get() -> io::Result<DeviceList> {
        let mut n = 0i32;
        // SAFETY: `n` is a valid out-pointer; the list is freed in `Drop`.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        let list = NonNull::new(list).ok_or_else(last_error)?;
        Ok(DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    fn device(&self, index: usize) -> Option<*mut ffi::ibv_device> {
        if index >= self.len {
            return None;
        }
        // SAFETY: libibverbs returned an array of `len` valid device pointers (NULL after
        // them), alive until `ibv_free_device_list`; `index < len`.
        let device = unsafe { *self.list.as_ptr().add(index) };
        (!device.is_null()).then_some(device)
    }

    /// The device names, in libibverbs' order.
    pub fn names(&self) -> Vec<String> {
        (0..self.len)
            .filter_map(|i| self.device(i))
            .map(|d| {
                // SAFETY: `d` is a listed device; the name is a NUL-terminated string owned
                // by the device, copied out before the list can be freed.
                let name = unsafe { ffi::ibv_get_device_name(d) };
                if name.is_null() {
                    String::new()
                } else {
                    // SAFETY: non-null, NUL-terminated (see above).
                    unsafe { CStr::from_ptr(name) }
                        .to_string_lossy()
                        .into_owned()
                }
            })
            .collect()
    }

    /// Opens device `index` (`ibv_open_device`). The context stays valid after the list is
    /// freed (libibverbs keeps the device referenced while a context is open).
    pub fn open(&self, index: usize) -> io::Result<Context> {
        let name = self.names().get(index).cloned().unwrap_or_default();
        let device = self
            .device(index)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        // SAFETY: `device` is a listed device.
        let ctx = unsafe { ffi::ibv_open_device(device) };
        let ctx = NonNull::new(ctx).ok_or_else(last_error)?;
        Ok(Context { ctx, name })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from `ibv_get_device_list` and is freed once.
        unsafe { ffi::ibv_free_device_list(self.list.as_ptr()) };
    }
}

/// What a port reports.
#[derive(Debug, Clone, Copy)]
pub struct PortAttributes {
    /// `ibv_port_state` (4: ACTIVE).
    pub state: u32,
    /// Active MTU (verbs enum, 1..=5).
    pub active_mtu: u32,
    /// Local identifier.
    pub lid: u16,
    /// `IBV_LINK_LAYER_*`.
    pub link_layer: u8,
    /// Entries in the GID table.
    pub gid_table_len: i32,
    /// Largest message the port carries.
    pub max_msg_size: u32,
}

/// What a device allows (the part of `ibv_device_attr` the van sizes its queues by).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttributes {
    /// Scatter/gather entries per work request (at least 1).
    pub max_sge: u32,
    /// Work requests one queue (send or receive) of a queue pair may hold.
    pub max_qp_wr: u32,
    /// Entries one completion queue may hold.
    pub max_cqe: u32,
    /// Largest memory region one registration may cover, in bytes.
    pub max_mr_size: u64,
}

/// An open device context (`ibv_context`).
pub struct Context {
    ctx: NonNull<ffi::ibv_context>,
    name: String,
}

// SAFETY: libibverbs contexts are thread-safe: every verb may be called from any thread
// (the library and providers lock internally), and the pointer is only freed in `Drop`.
unsafe impl Send for Context {}
// SAFETY: as above; `&Context` only issues thread-safe verbs.
unsafe impl Sync for Context {}

impl Context {
    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ibv_query_port` for [`PORT`].
    pub fn query_port(&self) -> io::Result<PortAttributes> {
        let mut attr = ffi::ibv_port_attr::default();
        // SAFETY: `attr` is a zeroed, full-size `ibv_port_attr`; the exported symbol takes the
        // compat type, whose layout is a prefix of the full one, and fills at most that.
        let code = unsafe {
            ffi::ibv_query_port(
                self.ctx.as_ptr(),
                PORT,
                ptr::addr_of_mut!(attr).cast::<ffi::_compat_ibv_port_attr>(),
            )
        };
        from_errno(code)?;
        Ok(PortAttributes {
            state: attr.state,
            active_mtu: attr.active_mtu,
            lid: attr.lid,
            link_layer: attr.link_layer,
            gid_table_len: attr.gid_tbl_len,
            max_msg_size: attr.max_msg_sz,
        })
    }

    /// `ibv_query_gid` for [`PORT`].
    pub fn query_gid(&self, index: i32) -> io::Result<[u8; 16]> {
        let mut gid = ffi::ibv_gid::default();
        // SAFETY: `gid` is a valid out-pointer for one GID.
        let code = unsafe { ffi::ibv_query_gid(self.ctx.as_ptr(), PORT, index, &mut gid) };
        from_errno(code)?;
        // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
        Ok(unsafe { gid.raw })
    }

    /// The device's limits on work requests, completion queues, registrations and
    /// scatter/gather entries (`ibv_query_device`).
    pub fn query_device(&self) -> io::Result<DeviceAttributes> {
        let mut attr = ffi::ibv_device_attr::default();
        // SAFETY: `attr` is a valid out-pointer for one `ibv_device_attr`.
        let code = unsafe { ffi::ibv_query_device(self.ctx.as_ptr(), &mut attr) };
        from_errno(code)?;
        // Negative counts (a broken provider) read as 0: every check against them then fails
        // with the value shown, instead of wrapping to a huge limit.
        let count = |n: i32| u32::try_from(n).unwrap_or(0);
        Ok(DeviceAttributes {
            max_sge: count(attr.max_sge).max(1),
            max_qp_wr: count(attr.max_qp_wr),
            max_cqe: count(attr.max_cqe),
            max_mr_size: attr.max_mr_size,
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child (PD, CQ, channel) holds an `Arc<Context>`, so none is left.
        unsafe { ffi::ibv_close_device(self.ctx.as_ptr()) };
    }
}

/// A protection domain.
pub struct Pd {
    pd: NonNull<ffi::ibv_pd>,
    context: Arc<Context>,
}

// SAFETY: a PD is a handle used through thread-safe verbs; freed only in `Drop`.
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl Pd {
    /// `ibv_alloc_pd`.
    pub fn new(context: Arc<Context>) -> io::Result<Arc<Pd>> {
        // SAFETY: the context is open.
        let pd = unsafe { ffi::ibv_alloc_pd(context.ctx.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(last_error)?;
        Ok(Arc::new(Pd { pd, context }))
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.context
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of this PD holds an `Arc<Pd>`, so none is left.
        unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// Bytes of a region holding `len`: at least one page, a whole number of pages; `None` when
/// that overflows (a length from a peer or the environment must not wrap to zero).
pub fn region_len(len: usize) -> Option<usize> {
    len.max(1).checked_next_multiple_of(4096)
}

/// Page-aligned, zeroed memory registered with a protection domain (`ibv_reg_mr`), local
/// write and remote write allowed.
pub struct Mr {
    mr: NonNull<ffi::ibv_mr>,
    memory: NonNull<u8>,
    layout: std::alloc::Layout,
    _pd: Arc<Pd>,
}

// SAFETY: the registration and the memory are owned by this value; registration handles are
// used through thread-safe verbs; the memory is plain bytes.
unsafe impl Send for Mr {}
// SAFETY: `&Mr` gives addresses and keys only; reading or writing the bytes goes through
// raw pointers whose users uphold exclusivity (see the pool and the engine).
unsafe impl Sync for Mr {}

impl Mr {
    /// Allocates `len` zeroed bytes (rounded up to a page) and registers them.
    pub fn new(pd: &Arc<Pd>, len: usize) -> io::Result<Mr> {
        let len = region_len(len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "region too large"))?;
        let layout = std::alloc::Layout::from_size_align(len, 4096)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout has a non-zero size (`region_len` is at least one page).
        let memory = unsafe { std::alloc::alloc_zeroed(layout) };
        let memory = NonNull::new(memory)
            .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "allocation failed"))?;
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        // SAFETY: `memory` is valid for `len` bytes and stays allocated until after the
        // deregistration in `Drop`.
        let mr = unsafe {
            ffi::ibv_reg_mr(pd.pd.as_ptr(), memory.as_ptr().cast(), len, access.0 as i32)
        };
        match NonNull::new(mr) {
            Some(mr) => Ok(Mr {
                mr,
                memory,
                layout,
                _pd: Arc::clone(pd),
            }),
            None => {
                let error = last_error();
                // SAFETY: allocated above with this layout, never registered.
                unsafe { std::alloc::dealloc(memory.as_ptr(), layout) };
                Err(error)
            }
        }
    }

    /// Start of the memory.
    pub fn ptr(&self) -> NonNull<u8> {
        self.memory
    }

    /// Length in bytes (a multiple of the page size).
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Whether it has no bytes (never: at least one page).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The local key, for scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `mr` is a live registration owned by `self`.
        unsafe { self.mr.as_ref().lkey }
    }

    /// The remote key a peer writes with.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as in `lkey`.
        unsafe { self.mr.as_ref().rkey }
    }

    /// An entry for `len` bytes at `offset`, or `None` when that range is outside.
    pub fn sge(&self, offset: usize, len: usize) -> Option<Sge> {
        let end = offset.checked_add(len)?;
        if end > self.len() {
            return None;
        }
        Some(Sge {
            addr: self.memory.as_ptr() as u64 + offset as u64,
            len: u32::try_from(len).ok()?,
            lkey: self.lkey(),
        })
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: deregistered once (queue pairs that used it were destroyed first, see the
        // module docs).
        let code = unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
        if code != 0 {
            // Still registered: the device (or a peer holding the rkey) may write it, so the
            // memory is leaked rather than handed back to the allocator.
            return;
        }
        // SAFETY: no longer registered, so the device does not touch it; allocated in `new`
        // with this layout and freed once.
        unsafe { std::alloc::dealloc(self.memory.as_ptr(), self.layout) };
    }
}

/// A completion queue with its own completion channel, so a thread can sleep in `poll(2)`
/// until work completes.
pub struct Cq {
    cq: NonNull<ffi::ibv_cq>,
    channel: NonNull<ffi::ibv_comp_channel>,
    context: Arc<Context>,
}

// SAFETY: CQ and channel are handles used through thread-safe verbs; freed only in `Drop`.
unsafe impl Send for Cq {}
// SAFETY: as above; polling from two threads at once is allowed by libibverbs.
unsafe impl Sync for Cq {}

/// One work completion, with what the engine needs.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    /// The work request id.
    pub wr_id: u64,
    /// `IBV_WC_SUCCESS` or the failure.
    pub status: u32,
    /// `IBV_WC_RECV`, `IBV_WC_RECV_RDMA_WITH_IMM`, `IBV_WC_SEND`, …
    pub opcode: u32,
    /// Bytes received.
    pub byte_len: u32,
    /// Immediate data, host order.
    pub imm: u32,
}

impl Completion {
    /// Whether it succeeded.
    pub fn ok(&self) -> bool {
        self.status == ffi::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// Whether it is a receive that carried an RDMA write with immediate data.
    pub fn is_write_with_imm(&self) -> bool {
        self.opcode == ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM
    }

    /// The status, readable (`transport retry counter exceeded`, …).
    pub fn status_text(&self) -> String {
        // SAFETY: returns a pointer to a static string for any value.
        let text = unsafe { ffi::ibv_wc_status_str(self.status) };
        if text.is_null() {
            format!("status {}", self.status)
        } else {
            // SAFETY: non-null static NUL-terminated string.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        }
    }
}

impl Cq {
    /// A completion queue of at least `entries` entries with a non-blocking channel.
    pub fn new(context: &Arc<Context>, entries: u32) -> io::Result<Arc<Cq>> {
        // SAFETY: the context is open.
        let channel = unsafe { ffi::ibv_create_comp_channel(context.ctx.as_ptr()) };
        let channel = NonNull::new(channel).ok_or_else(last_error)?;
        // SAFETY: `channel` was just created; its fd is owned by libibverbs.
        let fd = unsafe { channel.as_ref().fd };
        // SAFETY: fcntl on a valid descriptor with integer arguments.
        let nonblocking = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        let entries = i32::try_from(entries).unwrap_or(i32::MAX);
        // SAFETY: context and channel are live; a NULL cq_context is allowed.
        let cq = unsafe {
            ffi::ibv_create_cq(
                context.ctx.as_ptr(),
                entries,
                ptr::null_mut(),
                channel.as_ptr(),
                0,
            )
        };
        let Some(cq) = NonNull::new(cq).filter(|_| nonblocking) else {
            let error = last_error();
            if !cq.is_null() {
                // SAFETY: created above, unused.
                unsafe { ffi::ibv_destroy_cq(cq) };
            }
            // SAFETY: created above; no CQ uses it any more.
            unsafe { ffi::ibv_destroy_comp_channel(channel.as_ptr()) };
            return Err(error);
        };
        Ok(Arc::new(Cq {
            cq,
            channel,
            context: Arc::clone(context),
        }))
    }

    /// The channel's descriptor, readable when a completion event is pending.
    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel lives as long as `self`.
        unsafe { self.channel.as_ref().fd }
    }

    fn ops(&self) -> &ffi::ibv_context_ops {
        // SAFETY: the context outlives `self` (held by `Arc`); `ops` is set by the provider
        // when the context is opened and never changes.
        unsafe { &(*self.context.ctx.as_ptr()).ops }
    }

    /// Asks for an event at the next completion (`ibv_req_notify_cq`).
    pub fn arm(&self) -> io::Result<()> {
        let notify = self
            .ops()
            .req_notify_cq
            .ok_or_else(|| io::Error::other("provider has no req_notify_cq"))?;
        // SAFETY: the CQ is live; the provider's function takes it and a flag.
        from_errno(unsafe { notify(self.cq.as_ptr(), 0) })
    }

    /// Consumes pending channel events (non-blocking) and acknowledges them.
    pub fn drain_events(&self) {
        loop {
            let mut cq: *mut ffi::ibv_cq = ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = ptr::null_mut();
            // SAFETY: the channel is live and non-blocking; out-pointers are valid.
            let got = unsafe { ffi::ibv_get_cq_event(self.channel.as_ptr(), &mut cq, &mut ctx) };
            if got != 0 || cq.is_null() {
                return;
            }
            // SAFETY: `cq` is the CQ the event was for (ours: only it uses this channel).
            unsafe { ffi::ibv_ack_cq_events(cq, 1) };
        }
    }

    /// Polls up to `out.len()` completions (never blocks); returns how many.
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> io::Result<usize> {
        let poll = self
            .ops()
            .poll_cq
            .ok_or_else(|| io::Error::other("provider has no poll_cq"))?;
        // SAFETY: `ibv_wc` is plain integers, for which all-zero is a valid value.
        let mut raw = [unsafe { std::mem::zeroed::<ffi::ibv_wc>() }; 32];
        let want = max.min(raw.len());
        // SAFETY: the CQ is live and `raw` has room for `want` completions.
        let n = unsafe { poll(self.cq.as_ptr(), want as i32, raw.as_mut_ptr()) };
        if n < 0 {
            return Err(io::Error::other("ibv_poll_cq failed"));
        }
        let n = usize::try_from(n).unwrap_or(0).min(want);
        for wc in &raw[..n] {
            out.push(Completion {
                wr_id: wc.wr_id(),
                status: wc
                    .error()
                    .map_or(ffi::ibv_wc_status::IBV_WC_SUCCESS, |e| e.0),
                opcode: wc.opcode(),
                byte_len: wc.len() as u32,
                imm: wc.imm_data().map_or(0, u32::from_be),
            });
        }
        Ok(n)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an `Arc<Cq>`, so none is left; events were
        // acknowledged as they were taken, so destroying the CQ cannot block; the channel is
        // destroyed after the only CQ attached to it.
        unsafe {
            ffi::ibv_destroy_cq(self.cq.as_ptr());
            ffi::ibv_destroy_comp_channel(self.channel.as_ptr());
        }
    }
}

/// One scatter/gather entry: `len` bytes at `addr` in memory registered under `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Address.
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// Local key of the registration holding it.
    pub lkey: u32,
}

/// What a send work request does.
#[derive(Debug, Clone, Copy)]
pub enum SendOp {
    /// IBV_WR_SEND: consumes one posted receive of the peer.
    Send,
    /// IBV_WR_RDMA_WRITE: writes at `remote_addr` (registered by the peer under `rkey`);
    /// consumes nothing at the peer and completes nothing there.
    Write {
        /// Where.
        remote_addr: u64,
        /// The peer's key for it.
        rkey: u32,
    },
    /// IBV_WR_RDMA_WRITE_WITH_IMM: writes at `remote_addr` (registered by the peer under
    /// `rkey`) and consumes one posted receive, which completes with `imm`.
    WriteWithImm {
        /// Where.
        remote_addr: u64,
        /// The peer's key for it.
        rkey: u32,
        /// Immediate data (host order).
        imm: u32,
    },
}

/// The remote side of a connection, as the handshake exchanged it.
#[derive(Debug, Clone, Copy)]
pub struct Remote {
    /// Its queue pair number.
    pub qpn: u32,
    /// The PSN it sends with (our receive PSN).
    pub psn: u32,
    /// Its LID.
    pub lid: u16,
    /// Its GID.
    pub gid: [u8; 16],
    /// Path MTU both support (verbs enum).
    pub mtu: u32,
}

/// A reliable-connected queue pair.
pub struct Qp {
    qp: NonNull<ffi::ibv_qp>,
    _cq: Arc<Cq>,
    _pd: Arc<Pd>,
}

// SAFETY: a QP handle is used through thread-safe verbs (posting from several threads is
// allowed by libibverbs; the engine posts from one); freed only in `Drop`.
unsafe impl Send for Qp {}
// SAFETY: as above.
unsafe impl Sync for Qp {}

impl Qp {
    /// Creates an RC queue pair on `cq` (send and receive) and moves it to INIT.
    pub fn new(pd: &Arc<Pd>, cq: &Arc<Cq>, send_wr: u32, recv_wr: u32, sge: u32) -> io::Result<Qp> {
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: cq.cq.as_ptr(),
            recv_cq: cq.cq.as_ptr(),
            srq: ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: send_wr,
                max_recv_wr: recv_wr,
                max_send_sge: sge,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: PD and CQ are live; `init` is fully initialised.
        let qp = unsafe { ffi::ibv_create_qp(pd.pd.as_ptr(), &mut init) };
        let qp = Qp {
            qp: NonNull::new(qp).ok_or_else(last_error)?,
            _cq: Arc::clone(cq),
            _pd: Arc::clone(pd),
        };
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: PORT,
            qp_access_flags: (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
                .0,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ffi::ibv_qp_attr_mask::IBV_QP_PORT
            | ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        qp.modify(&mut attr, mask)?;
        Ok(qp)
    }

    fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: ffi::ibv_qp_attr_mask) -> io::Result<()> {
        // SAFETY: the QP is live; `attr` is initialised for every field `mask` names.
        from_errno(unsafe { ffi::ibv_modify_qp(self.qp.as_ptr(), attr, mask.0 as i32) })
    }

    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: the QP is live; `qp_num` is set at creation and never changes.
        unsafe { self.qp.as_ref().qp_num }
    }

    /// INIT → RTR → RTS, connected to `remote`, sending from GID `gid_index` with `our_psn`.
    pub fn connect(&self, remote: &Remote, gid_index: u8, our_psn: u32) -> io::Result<()> {
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: remote.mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: ffi::ibv_ah_attr {
                dlid: remote.lid,
                sl: 0,
                src_path_bits: 0,
                port_num: PORT,
                is_global: 1,
                grh: ffi::ibv_global_route {
                    dgid: ffi::ibv_gid { raw: remote.gid },
                    flow_label: 0,
                    sgid_index: gid_index,
                    hop_limit: 64,
                    traffic_class: 0,
                },
                ..Default::default()
            },
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_AV
            | ffi::ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ffi::ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ffi::ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ffi::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut attr, mask)?;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            sq_psn: our_psn,
            // 4.096 µs × 2^14 ≈ 67 ms per try, 7 tries: a dead peer fails sends within a
            // second even on a slow (emulated) fabric.
            timeout: 14,
            retry_cnt: 7,
            // Credits keep receives posted; 7 = retry forever should an RNR happen anyway.
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ffi::ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ffi::ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut attr, mask)
    }

    fn ops(&self) -> &ffi::ibv_context_ops {
        // SAFETY: the QP's context outlives it (the QP holds its PD, which holds the
        // context); `ops` never changes after the context is opened.
        unsafe { &(*self.qp.as_ref().context).ops }
    }

    /// Posts one signaled send work request.
    ///
    /// # Safety
    ///
    /// Every entry of `sges` must lie in memory registered under its `lkey` with this
    /// queue pair's protection domain, and that memory must stay allocated and unmodified
    /// until the completion with `wr_id` has been polled or the queue pair is destroyed.
    pub unsafe fn post_send(&self, wr_id: u64, sges: &[Sge], op: SendOp) -> io::Result<()> {
        let mut list: Vec<ffi::ibv_sge> = sges
            .iter()
            .map(|s| ffi::ibv_sge {
                addr: s.addr,
                length: s.len,
                lkey: s.lkey,
            })
            .collect();
        let mut wr = ffi::ibv_send_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: list.as_mut_ptr(),
            num_sge: i32::try_from(list.len()).unwrap_or(i32::MAX),
            opcode: ffi::ibv_wr_opcode::IBV_WR_SEND,
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        match op {
            SendOp::Send => {}
            SendOp::Write { remote_addr, rkey } => {
                wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
            }
            SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => {
                wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                wr.__bindgen_anon_1.imm_data = imm.to_be();
                wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
            }
        }
        let post = self
            .ops()
            .post_send
            .ok_or_else(|| io::Error::other("provider has no post_send"))?;
        let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is live; `wr` and `list` outlive the call (the provider copies them
        // into its queue); the memory they name is kept alive by the caller's contract.
        from_errno(unsafe { post(self.qp.as_ptr(), &mut wr, &mut bad) })
    }

    /// Posts one receive work request into `sge`.
    ///
    /// # Safety
    ///
    /// `sge` must lie in memory registered under its `lkey` with this queue pair's
    /// protection domain, which nothing else reads or writes until the completion with
    /// `wr_id` has been polled or the queue pair is destroyed.
    pub unsafe fn post_recv(&self, wr_id: u64, sge: Sge) -> io::Result<()> {
        let mut entry = ffi::ibv_sge {
            addr: sge.addr,
            length: sge.len,
            lkey: sge.lkey,
        };
        let mut wr = ffi::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut entry,
            num_sge: 1,
        };
        let post = self
            .ops()
            .post_recv
            .ok_or_else(|| io::Error::other("provider has no post_recv"))?;
        let mut bad: *mut ffi::ibv_recv_wr = ptr::null_mut();
        // SAFETY: as in `post_send`.
        from_errno(unsafe { post(self.qp.as_ptr(), &mut wr, &mut bad) })
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: destroyed once; after it returns the device no longer accesses the memory
        // of this QP's work requests, which the owner frees afterwards.
        unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_lengths_are_whole_pages_and_never_wrap() {
        assert_eq!(region_len(0), Some(4096));
        assert_eq!(region_len(4096), Some(4096));
        assert_eq!(region_len(4097), Some(8192));
        assert_eq!(region_len(usize::MAX - 100), None);
    }
}
