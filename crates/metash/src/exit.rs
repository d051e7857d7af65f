//! Exit codes, fixed so scripts can branch on them.

/// A command failed (bad input, I/O error, ...).
pub const FAILURE: u8 = 1;
