//! # van-rdma: an RDMA verbs van (planned)
//!
//! Reliable-connected queue pairs over `ibverbs`: small messages by SEND/RECV into
//! pre-posted registered buffers with credit-based flow control, large payloads by
//! RDMA WRITE_WITH_IMM into buffers the receiver advertised, selected by
//! `DMLC_ENABLE_RDMA=1`. It will implement [`van_core::Van`] and pass the conformance suite
//! of `van_core::testkit` inside a Soft-RoCE guest.
//!
//! Nothing is implemented yet; this crate exists so the workspace layout is fixed.

/// The van kind this crate will provide.
pub const KIND: van_core::VanKind = van_core::VanKind::Rdma;
