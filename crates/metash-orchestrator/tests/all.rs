//! One integration-test binary for the orchestrator (faster to link on a small machine).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
