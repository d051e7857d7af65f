//! JSON-lines framing of the agent protocol, the same for both sandboxes: one
//! [`ProtocolMessage`] per line, `schema_version` checked before anything else.

use metash_protocol::{AgentEvent, ProtocolMessage, EVENT_PROTOCOL_VERSION};

use crate::error::{Result, RuntimeError};

/// Encode one event as a line (with the trailing newline).
///
/// # Errors
/// Serialization failed (it cannot for the protocol's own types, but the error is kept).
pub fn encode(event: AgentEvent) -> Result<Vec<u8>> {
    let mut line = serde_json::to_vec(&ProtocolMessage::new(event))
        .map_err(|e| RuntimeError::Protocol(e.to_string()))?;
    line.push(b'\n');
    Ok(line)
}

/// Decode one line from an agent. The version is checked first so that a message from a newer
/// protocol is reported as a version mismatch rather than as an unknown event type.
///
/// # Errors
/// [`RuntimeError::UnsupportedVersion`] for another `schema_version`, [`RuntimeError::Protocol`] for
/// anything that is not a valid message.
pub fn decode(line: &[u8]) -> Result<AgentEvent> {
    let value: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| RuntimeError::Protocol(e.to_string()))?;
    match value.get("schema_version").and_then(|v| v.as_str()) {
        Some(EVENT_PROTOCOL_VERSION) => {}
        Some(other) => {
            return Err(RuntimeError::UnsupportedVersion {
                found: other.to_string(),
                supported: EVENT_PROTOCOL_VERSION.to_string(),
            })
        }
        None => return Err(RuntimeError::Protocol("missing schema_version".to_string())),
    }
    let msg: ProtocolMessage =
        serde_json::from_value(value).map_err(|e| RuntimeError::Protocol(e.to_string()))?;
    Ok(msg.event)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn round_trip_and_version() {
        let line = encode(AgentEvent::Done {
            status: None,
            summary: None,
        })
        .unwrap();
        assert!(matches!(decode(&line).unwrap(), AgentEvent::Done { .. }));
        let bad = br#"{"schema_version":"0.2","type":"done"}"#;
        let err = decode(bad).unwrap_err();
        assert_eq!(err.code(), "unsupported_version");
        assert!(err.to_string().contains("0.2"));
        assert_eq!(
            decode(br#"{"type":"done"}"#).unwrap_err().code(),
            "protocol_error"
        );
    }
}
