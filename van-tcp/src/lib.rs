//! # van-tcp: the TCP van on tokio
//!
//! [`TcpVan`] implements [`van_core::Van`] over TCP:
//!
//! - **One connection per peer pair.** `connect` dials a peer once; a connection a peer
//!   opened to us is reused for replies as soon as the peer has identified itself (the sender
//!   of its first message), so a pair that talks both ways usually shares one connection.
//!   Each connection has `TCP_NODELAY` set.
//! - **Sending** encodes the message on the caller's task (so encoding errors are returned,
//!   and encoding runs in parallel across callers) into a list of [`bytes::Bytes`] parts that
//!   reference the payload without copying it, and queues it on the peer's bounded queue. One
//!   writer task per connection drains the queue in batches — up to 256 frames and 1024
//!   iovecs per `writev` — so many small messages cost one system call.
//! - **Receiving**: one reader task per connection reads 64 KiB at a time, splits every
//!   complete frame off the buffer as zero-copy [`bytes::Bytes`] and delivers all frames of
//!   a read to the inbox as one batch. Frames over 256 KiB are read into a buffer of their
//!   own, so their payload is copied once, from the kernel; that buffer grows with the bytes
//!   that arrive, so a peer declaring a huge frame cannot make us allocate it up front.
//! - **Bad input**: a frame that fails validation (bad magic, version, lengths, truncation)
//!   closes that connection with a logged, typed error and a [`van_core::PeerLost`] event;
//!   every other connection keeps working.
//! - **Stop** closes the listener and readers, lets writers flush for
//!   [`TcpOptions::flush_timeout`], then closes everything.

mod connection;
mod van;

pub use van::{TcpOptions, TcpVan};
