//! Reading and writing `.meta/session.json`.

use std::path::Path;

use metash_protocol::{SessionState, SESSION_SCHEMA_VERSION};

use crate::atomic::write_atomic;
use crate::error::{Result, StoreError};
use crate::keypath::check_plan;

/// Parses session.json; any problem names the file, line and column and leaves it alone.
pub fn load(path: &Path) -> Result<SessionState> {
    let bytes = std::fs::read(path).map_err(|e| StoreError::io(path, e))?;
    parse(path, &bytes)
}

pub fn parse(path: &Path, bytes: &[u8]) -> Result<SessionState> {
    let bad = |line: usize, column: usize, message: String| StoreError::BadSessionFile {
        path: path.to_path_buf(),
        line,
        column,
        message,
    };
    let state: SessionState = serde_json::from_slice(bytes)
        .map_err(|e| bad(e.line(), e.column(), without_position(&e)))?;
    if state.schema_version != SESSION_SCHEMA_VERSION {
        return Err(bad(
            1,
            1,
            format!(
                "schema_version {} is not supported (this build reads {SESSION_SCHEMA_VERSION})",
                state.schema_version
            ),
        ));
    }
    check_plan(&state).map_err(|m| bad(1, 1, m))?;
    Ok(state)
}

/// Whether `bytes` are what a power cut can leave of a view written without fsync (see
/// [`crate::atomic::write_view`]): nothing, or blocks of zeros (the new name reached the disk, its
/// data did not). No JSON document looks like that, so a hand-edited file is never taken for a
/// torn one: its mistakes are reported with line and column, not repaired.
pub fn is_torn(bytes: &[u8]) -> bool {
    bytes.iter().all(u8::is_ascii_whitespace) || bytes.contains(&0)
}

pub fn to_bytes(state: &SessionState) -> Result<Vec<u8>> {
    let mut out = serde_json::to_vec_pretty(state)
        .map_err(|e| StoreError::Rejected(format!("session is not serialisable: {e}")))?;
    out.push(b'\n');
    Ok(out)
}

pub fn save(path: &Path, state: &SessionState) -> Result<()> {
    write_atomic(path, &to_bytes(state)?)
}

/// serde_json's message without its trailing " at line L column C" (we print the position first).
pub(crate) fn without_position(e: &serde_json::Error) -> String {
    let msg = e.to_string();
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg,
    }
}
