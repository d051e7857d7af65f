//! The versioned envelope of the store's small JSON documents (each KV namespace, the
//! scratchpad, other layers' documents such as consent grants and the journal's loss count):
//! `{"schema_version": 1, "data": …}`. The data stays a plain JSON value, so a key named
//! `schema_version` inside a namespace is just data.
//!
//! A document written before documents were versioned is its bare data: it is read as it is,
//! and wrapped at its next write or by `metash migrate`. A newer version is refused, naming the
//! file, never overwritten.

use std::path::Path;

use serde_json::{json, Value};

use crate::error::{Result, StoreError};

/// The document format this build writes and reads.
pub const DOC_SCHEMA_VERSION: u32 = 1;

/// A document as found on disk.
#[derive(Debug, Clone, PartialEq)]
pub enum Doc {
    /// In the envelope, at this build's version.
    Current(Value),
    /// Bare data, from before documents were versioned.
    Unversioned(Value),
}

impl Doc {
    pub fn data(self) -> Value {
        match self {
            Self::Current(v) | Self::Unversioned(v) => v,
        }
    }
}

/// Reads the document at `path` from its parsed JSON.
///
/// # Errors
/// [`StoreError::NewerVersion`] for a newer envelope, [`StoreError::BadFile`] for a version that
/// is not a positive integer.
pub fn open(path: &Path, value: Value) -> Result<Doc> {
    let Value::Object(mut m) = value else {
        return Ok(Doc::Unversioned(value));
    };
    if m.len() != 2 || !m.contains_key("data") || !m.contains_key("schema_version") {
        return Ok(Doc::Unversioned(Value::Object(m)));
    }
    let version = m.get("schema_version").cloned().unwrap_or(Value::Null);
    match version.as_u64() {
        Some(v) if v == u64::from(DOC_SCHEMA_VERSION) => {
            Ok(Doc::Current(m.remove("data").unwrap_or(Value::Null)))
        }
        Some(v) if v > u64::from(DOC_SCHEMA_VERSION) => Err(StoreError::NewerVersion {
            path: path.to_path_buf(),
            what: "the document".into(),
            found: v.to_string(),
            supported: DOC_SCHEMA_VERSION.to_string(),
        }),
        _ => Err(StoreError::BadFile {
            path: path.to_path_buf(),
            line: 1,
            message: format!(
                "`schema_version` must be an integer from 1 to {DOC_SCHEMA_VERSION}, not {version}"
            ),
        }),
    }
}

/// `data` in the envelope, as written.
pub fn seal(data: &Value) -> Value {
    json!({"schema_version": DOC_SCHEMA_VERSION, "data": data})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_shapes_and_refuses_newer_or_nonsense() {
        let p = Path::new("kv/a.json");
        let data = json!({"k": 1, "schema_version": "mine"});
        assert_eq!(open(p, seal(&data)).ok(), Some(Doc::Current(data.clone())));
        assert_eq!(open(p, data.clone()).ok(), Some(Doc::Unversioned(data)));
        let newer = open(p, json!({"schema_version": 2, "data": {}}));
        assert!(
            matches!(&newer, Err(StoreError::NewerVersion { found, .. }) if found == "2"),
            "{newer:?}"
        );
        let text = newer.map(|_| ()).unwrap_err().to_string();
        assert!(
            text.contains("kv/a.json") && text.contains("upgrade metash"),
            "{text}"
        );
        assert!(matches!(
            open(p, json!({"schema_version": -1, "data": {}})),
            Err(StoreError::BadFile { .. })
        ));
    }
}
