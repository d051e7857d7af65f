//! One integration-test binary for the policy crate (faster to link than one per file).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
