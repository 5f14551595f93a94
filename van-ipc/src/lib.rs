//! # van-ipc: a shared-memory van for co-located nodes (planned)
//!
//! Single-producer single-consumer rings in memfd segments passed over a Unix socket,
//! adaptive wake-ups (spin, then futex), and buffers a sender can allocate directly in
//! shared memory so a push moves no payload bytes. It will implement [`van_core::Van`] and
//! pass the conformance suite of `van_core::testkit` between two processes.
//!
//! Nothing is implemented yet; this crate exists so the workspace layout is fixed.

/// The van kind this crate will provide.
pub const KIND: van_core::VanKind = van_core::VanKind::Ipc;
