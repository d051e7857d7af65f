//! `.meta/context.md`: the project's immutable vision. Its hash is recorded at init and checked by
//! every later open, so an edited vision is noticed before anything acts on it.

use sha2::{Digest, Sha256};

/// The template `metash init` writes when no context file is given: the seed's sections.
pub const TEMPLATE: &str = "# Project: <name>

## Vision

<What is being built, for whom, and why.>

## Tech Stack

- Language:
- Storage:
- UI:

## Architecture Constraints

1.  **<Constraint>**: <what it rules in or out>.

## Current Phase Focus

Phase 1: <the first milestone>.
";

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}
