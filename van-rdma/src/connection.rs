//! One RDMA connection's resources and what the van shares with its engine: [`Setup`]
//! creates the completion queue, the queue pair (in INIT) and both rings and posts every
//! receive before the handshake; [`ConnectionIo`] holds the flag and the eventfd `send` rings,
//! and is what the van's link table ends the connection through.
//! The thread that drives a connected setup is [`crate::engine::Engine`].

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use van_core::link::Connection;

use crate::device::Device;
use crate::protocol::QpAttributes;
use crate::sizing::RingSizes;
use crate::verbs::{Cq, Mr, Qp, Remote};
use crate::wr_id::RECV;

/// A counter `send` rings to wake the engine (Linux eventfd).
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    /// A non-blocking eventfd.
    pub(crate) fn new() -> std::io::Result<EventFd> {
        // SAFETY: eventfd has no memory arguments; a negative result is an error.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Wakes the engine (a full counter already means "awake").
    pub(crate) fn notify(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our descriptor.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// The descriptor, readable while the counter is non-zero.
    pub(crate) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Resets the counter.
    pub(crate) fn drain(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live buffer from our descriptor.
        let _ = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    }
}

/// What the van and the engine share about one connection.
#[derive(Debug)]
pub(crate) struct ConnectionIo {
    /// Set when the connection ends for any reason (or must end: stop, drop).
    pub(crate) closed: AtomicBool,
    /// Rung by `send` after queueing, and by the link table when the queue closes.
    pub(crate) wake: EventFd,
}

impl ConnectionIo {
    /// Flags of an open connection.
    pub(crate) fn new() -> std::io::Result<ConnectionIo> {
        Ok(ConnectionIo {
            closed: AtomicBool::new(false),
            wake: EventFd::new()?,
        })
    }
}

impl Connection for ConnectionIo {
    /// The queue was closed by a stop: the engine, woken, sees it, flushes and tells the peer.
    fn finish(&self) {
        self.wake.notify();
    }

    /// The engine, woken, sees the flag and ends without flushing.
    fn abort(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake.notify();
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// A queue pair in INIT with its rings, receives posted, waiting for the peer's attributes.
pub(crate) struct Setup {
    pub(crate) send_wr: u32,
    pub(crate) qp: Qp,
    pub(crate) cq: Arc<Cq>,
    pub(crate) rx: Mr,
    pub(crate) tx: Mr,
    pub(crate) psn: u32,
    pub(crate) sizes: RingSizes,
}

/// A random initial packet sequence number (24 bits), from the kernel.
fn random_psn() -> std::io::Result<u32> {
    Ok(getrandom::u32().map_err(std::io::Error::from)? & 0x00ff_ffff)
}

impl Setup {
    /// Creates the completion queue, the queue pair (in INIT) and both rings, and posts every
    /// receive buffer. The van checked `sizes` against the device at start
    /// ([`RingSizes::check`]).
    pub(crate) fn new(device: &Device, sizes: RingSizes) -> std::io::Result<Setup> {
        let depth = sizes.recv_wr();
        let send_wr = sizes.send_wr();
        let cq = Cq::new(&device.context, sizes.cq_entries())?;
        let qp = Qp::new(&device.pd, &cq, send_wr, depth, device.max_sge)?;
        let ring = depth as usize * sizes.slot_bytes;
        let rx = Mr::new(&device.pd, ring)?;
        let tx = Mr::new(&device.pd, ring)?;
        let setup = Setup {
            send_wr,
            qp,
            cq,
            rx,
            tx,
            psn: random_psn()?,
            sizes,
        };
        for slot in 0..depth as usize {
            setup.post_receive(slot)?;
        }
        Ok(setup)
    }

    fn post_receive(&self, slot: usize) -> std::io::Result<()> {
        post_receive(&self.qp, &self.rx, slot, self.sizes.slot_bytes)
    }

    /// What to tell the peer.
    pub(crate) fn attributes(&self, device: &Device) -> QpAttributes {
        QpAttributes {
            qpn: self.qp.qpn(),
            psn: self.psn,
            lid: device.lid,
            mtu: u8::try_from(device.mtu).unwrap_or(1),
            gid: device.gid.raw,
            rx_depth: self.sizes.rx_depth,
            slot_bytes: u32::try_from(self.sizes.slot_bytes).unwrap_or(u32::MAX),
        }
    }

    /// Moves the queue pair to RTR and RTS towards the peer.
    pub(crate) fn connect(&self, device: &Device, peer: &QpAttributes) -> std::io::Result<()> {
        let remote = Remote {
            qpn: peer.qpn,
            psn: peer.psn,
            lid: peer.lid,
            gid: peer.gid,
            mtu: device.mtu.min(u32::from(peer.mtu)),
        };
        let gid_index = u8::try_from(device.gid.index)
            .map_err(|_| std::io::Error::other("GID index above 255"))?;
        self.qp.connect(&remote, gid_index, self.psn)
    }
}

pub(crate) fn post_receive(
    qp: &Qp,
    rx: &Mr,
    slot: usize,
    slot_bytes: usize,
) -> std::io::Result<()> {
    let sge = rx
        .sge(slot * slot_bytes, slot_bytes)
        .ok_or_else(|| std::io::Error::other("receive slot outside its ring"))?;
    // SAFETY: the slot lies in `rx`, registered with the QP's PD; the engine (or setup)
    // owns `rx` for at least as long as the QP (the QP is dropped first) and reads the slot
    // only after its completion, reposting it only after it is done with the bytes.
    unsafe { qp.post_recv(RECV | slot as u64, sge) }
}
