//! A capability as typed on the command line (`files:read:/data`, `network`): parsed once here
//! for every command that takes one (`consent grant|revoke|check`, `ledger --capability`), so
//! the command groups share the parser without importing each other.

use anyhow::Result;
use metash_policy::{Capability, PolicyError};

/// `s` as a capability, or the policy's error naming it and why.
pub(super) fn parse_cap(s: &str) -> Result<Capability> {
    s.parse::<Capability>().map_err(|reason| {
        PolicyError::InvalidCapability {
            capability: s.to_string(),
            reason,
        }
        .into()
    })
}
