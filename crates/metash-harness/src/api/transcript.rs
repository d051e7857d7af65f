//! Transcripts of the API frontends, so their continuation keys resume like the CLIs' do: one
//! JSON file per key at `<aspHome>/transcripts/<key>.json`, replaced atomically after each turn.

use std::path::{Path, PathBuf};

use metash_protocol::HarnessFrontend;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{HarnessError, Result};
use crate::fsutil::write_atomic;

pub const TRANSCRIPT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Transcript {
    pub version: u32,
    pub key: String,
    /// The wire format of `messages` is this frontend's; another frontend cannot resume it.
    pub frontend: HarnessFrontend,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub messages: Vec<Value>,
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 128
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

pub fn transcript_path(asp_home: &Path, key: &str) -> PathBuf {
    asp_home.join("transcripts").join(format!("{key}.json"))
}

/// Loads the transcript a key names.
///
/// # Errors
/// `ContinuationNotFound` when there is none, or it belongs to another frontend.
pub fn load(asp_home: &Path, key: &str, frontend: HarnessFrontend) -> Result<Transcript> {
    if !valid_key(key) {
        return Err(HarnessError::ContinuationNotFound(format!(
            "{key:?} is not a transcript key"
        )));
    }
    let path = transcript_path(asp_home, key);
    let bytes = std::fs::read(&path).map_err(|_| {
        HarnessError::ContinuationNotFound(format!("no transcript {}", path.display()))
    })?;
    let t: Transcript = serde_json::from_slice(&bytes).map_err(|e| {
        HarnessError::ContinuationNotFound(format!(
            "transcript {} is unreadable: {e}",
            path.display()
        ))
    })?;
    if t.frontend != frontend {
        return Err(HarnessError::ContinuationNotFound(format!(
            "key {key} is a {} conversation; {} cannot resume it",
            t.frontend.as_str(),
            frontend.as_str()
        )));
    }
    Ok(t)
}

/// Writes the transcript atomically.
///
/// # Errors
/// `Io`.
pub fn save(asp_home: &Path, t: &Transcript) -> Result<()> {
    let mut bytes =
        serde_json::to_vec_pretty(t).map_err(|e| HarnessError::InvalidRequest(e.to_string()))?;
    bytes.push(b'\n');
    write_atomic(&transcript_path(asp_home, &t.key), &bytes)
}
