//! Names that become file names (agents, KV keys, documents) must not escape their directory.

use crate::error::{Result, StoreError};

pub fn check(name: &str, what: &str) -> Result<()> {
    let bad = |reason: &str| {
        Err(StoreError::InvalidName {
            name: name.to_string(),
            reason: format!("{what} {reason}"),
        })
    };
    if name.is_empty() || name.len() > 200 {
        return bad("must be 1 to 200 characters");
    }
    if name.starts_with('.') {
        return bad("must not start with `.`");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '@' | ' '))
    {
        return bad("may hold only letters, digits, space and - _ . : @");
    }
    Ok(())
}
