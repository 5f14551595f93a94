//! # van-uring: an io_uring stream van (planned)
//!
//! A drop-in alternative to `van-tcp` driven by `io_uring`: one ring per I/O thread, each
//! thread owning its connections (share-nothing), multishot receive into provided-buffer
//! rings, vectored and zero-copy sends where they pay. It will implement
//! [`van_core::Van`] and pass the conformance suite of `van_core::testkit`.
//!
//! Nothing is implemented yet; this crate exists so the workspace layout is fixed.

/// The van kind this crate will provide.
pub const KIND: van_core::VanKind = van_core::VanKind::Uring;
