//! Test support shared by metash's crates, so each test suite does not grow its own copy.
//! A dev-dependency only: nothing in a shipped crate depends on it. Failures here are test
//! failures, so these helpers panic with a message rather than return errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod anthropic;
pub mod procs;
pub mod wasm;
