#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `spawn_agent` end to end: real WASM and native agents through the runtime, model-backed roles
//! through the harness against a loopback provider server, checkpoints, budgets, cleanup.

#[path = "spawn_suite/mod.rs"]
mod suite;
