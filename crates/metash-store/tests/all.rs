#![allow(clippy::unwrap_used, clippy::expect_used)]
//! One test binary for the store (faster to link): `mod suite` holds the parts.

mod suite;
