//! Passing file descriptors (the rings' memfds, the arenas, the doorbells) over a Unix socket
//! with `SCM_RIGHTS`.
//!
//! A message is a small fixed header (`u64` little-endian words) plus up to [`MAX_FDS`]
//! descriptors. The receiving side owns what it receives: every descriptor arrives as an
//! [`OwnedFd`], closed when dropped, so nothing leaks if the handshake fails halfway.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// Most descriptors one handshake message carries.
pub(crate) const MAX_FDS: usize = 5;
/// Words in a handshake message.
pub(crate) const WORDS: usize = 4;

/// Sends `words` and `fds` as one message.
pub(crate) async fn send(
    stream: &UnixStream,
    words: [u64; WORDS],
    fds: &[BorrowedFd<'_>],
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
            send_now(stream.as_fd(), &payload, fds)
        }) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            result => return result,
        }
    }
}

fn send_now(socket: BorrowedFd<'_>, payload: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "control buffer too small",
        ));
    }
    let sent = sendmsg(
        socket,
        &[IoSlice::new(payload)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent != payload.len() {
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
        match stream.try_io(Interest::READABLE, || recv_now(stream.as_fd())) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            result => return result,
        }
    }
}

fn recv_now(socket: BorrowedFd<'_>) -> io::Result<([u64; WORDS], Vec<OwnedFd>)> {
    let mut payload = [0u8; WORDS * 8];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    // CMSG_CLOEXEC: the received descriptors are not inherited by child processes.
    let received = recvmsg(
        socket,
        &mut [IoSliceMut::new(&mut payload)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    // Take ownership of every descriptor first, so none leaks whatever happens next.
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if received.flags.contains(ReturnFlags::CTRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "peer sent too many descriptors",
        ));
    }
    if received.bytes == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    if received.bytes != payload.len() {
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
