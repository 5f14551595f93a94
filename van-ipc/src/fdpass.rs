//! Passing file descriptors (the rings' memfds) over a Unix socket with `SCM_RIGHTS`.
//!
//! A message is a small fixed header (`u64` little-endian words) plus up to [`MAX_FDS`]
//! descriptors. The receiving side owns what it receives: every descriptor arrives as an
//! [`OwnedFd`], closed when dropped, so nothing leaks if the handshake fails halfway.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tokio::io::Interest;
use tokio::net::UnixStream;

/// Most descriptors one handshake message carries.
pub(crate) const MAX_FDS: usize = 4;
/// Words in a handshake message.
pub(crate) const WORDS: usize = 4;

/// Room for the control message, in `u64`s so the buffer is aligned for `cmsghdr`: 64
/// bytes, more than `CMSG_SPACE` of [`MAX_FDS`] descriptors (32 on Linux x86-64). Extra
/// descriptors a peer sends still arrive (and are closed, as `OwnedFd`s, when the handshake
/// rejects their number).
const CMSG_WORDS: usize = 8;

/// Sends `words` and `fds` as one message.
pub(crate) async fn send(
    stream: &UnixStream,
    words: [u64; WORDS],
    fds: &[RawFd],
) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors",
        ));
    }
    let mut payload = [0u8; WORDS * 8];
    for (chunk, word) in payload.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    loop {
        stream.writable().await?;
        match stream.try_io(Interest::WRITABLE, || {
            send_now(stream.as_raw_fd(), &payload, fds)
        }) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            result => return result,
        }
    }
}

fn send_now(socket: RawFd, payload: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut control = [0u64; CMSG_WORDS];
    let fd_bytes = std::mem::size_of_val(fds);
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // SAFETY: an all-zero msghdr is a valid "no name, no iov, no control" header; every
    // field we use is set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        // SAFETY: CMSG_SPACE only computes a size from its argument.
        let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
        if space > std::mem::size_of_val(&control) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "control buffer too small",
            ));
        }
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: msg_control points at `control`, which is at least `space` bytes, aligned
        // for cmsghdr (u64), so CMSG_FIRSTHDR returns a pointer inside it (non-null because
        // msg_controllen >= sizeof(cmsghdr)); CMSG_DATA of that header has room for
        // `fd_bytes` bytes by the CMSG_SPACE computation; the copy source is `fds` itself.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&msg);
            if header.is_null() {
                return Err(io::Error::other("no room for the control header"));
            }
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(header),
                fd_bytes,
            );
        }
    }
    // SAFETY: `msg` points at `iov`/`payload` and `control`, all alive for this call.
    let sent = unsafe { libc::sendmsg(socket, &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    if sent as usize != payload.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short handshake write",
        ));
    }
    Ok(())
}

/// Receives one message: its words and the descriptors it carried (owned by the caller).
pub(crate) async fn recv(stream: &UnixStream) -> io::Result<([u64; WORDS], Vec<OwnedFd>)> {
    loop {
        stream.readable().await?;
        match stream.try_io(Interest::READABLE, || recv_now(stream.as_raw_fd())) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            result => return result,
        }
    }
}

fn recv_now(socket: RawFd) -> io::Result<([u64; WORDS], Vec<OwnedFd>)> {
    let mut payload = [0u8; WORDS * 8];
    let mut control = [0u64; CMSG_WORDS];
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr().cast(),
        iov_len: payload.len(),
    };
    // SAFETY: as in `send_now`, a zeroed msghdr is valid; fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `msg` points at buffers we own that outlive the call; MSG_CMSG_CLOEXEC makes
    // the received descriptors close-on-exec.
    let received = unsafe { libc::recvmsg(socket, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if received < 0 {
        return Err(io::Error::last_os_error());
    }
    // Take ownership of every descriptor first, so none leaks whatever happens next.
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `control` up to msg_controllen; CMSG_FIRSTHDR/NXTHDR walk
    // only within it and return null at its end. For an SCM_RIGHTS header, the data holds
    // (cmsg_len - CMSG_LEN(0)) / sizeof(int) descriptors that are now ours; they are read
    // unaligned because CMSG_DATA need not be aligned for c_int.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header);
                let bytes =
                    ((*header).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                for i in 0..bytes / std::mem::size_of::<libc::c_int>() {
                    let fd = data
                        .add(i * std::mem::size_of::<libc::c_int>())
                        .cast::<libc::c_int>()
                        .read_unaligned();
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "peer sent too many descriptors",
        ));
    }
    if received == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    if received as usize != payload.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "short handshake message",
        ));
    }
    let mut words = [0u64; WORDS];
    for (word, chunk) in words.iter_mut().zip(payload.chunks_exact(8)) {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(chunk);
        *word = u64::from_le_bytes(bytes);
    }
    Ok((words, fds))
}
