//! # rendezvous: TensorFlow-style step-scoped tensor exchange (planned)
//!
//! The equivalent of TensorFlow's `RendezvousMgrInterface` over vans: a local rendezvous
//! table, a remote rendezvous with pull (RecvTensor) and push (StarServer) semantics, and a
//! manager keyed by step id with cleanup and abort propagation. The key format and the
//! [`van_core::Rendezvous`] trait it will implement already live in `van-core`.
//!
//! Nothing is implemented yet; this crate exists so the workspace layout is fixed.

pub use van_core::rendezvous::{parse_key, ParsedKey};
