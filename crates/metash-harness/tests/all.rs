//! One integration-test binary (links once on a small machine); the modules are in `suite/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
