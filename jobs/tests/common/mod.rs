//! The cluster tests' helpers, shared with `examples` (its tests/common, included by path),
//! and a `vans-master` for the tests of the job service.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../examples/tests/common/mod.rs"]
mod shared;

pub(crate) mod master;

pub(crate) use shared::*;
