//! Turning the manifest's Kubernetes-style `resources` into numbers, and the record of which limits
//! were actually applied and how (the `agent_started` event carries it: no silent limit).

use serde::Serialize;

use crate::error::{Result, RuntimeError};

/// Parse a memory quantity (`"512Mi"`, `"1G"`, `"1048576"`) into bytes.
///
/// # Errors
/// [`RuntimeError::BadQuantity`] for anything else.
pub fn parse_mem(value: &str) -> Result<u64> {
    let v = value.trim();
    let bad = |reason: &str| RuntimeError::BadQuantity {
        field: "resources.mem",
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: f64 = num.parse().map_err(|_| bad("not a number"))?;
    let mult: f64 = match unit {
        "" => 1.0,
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(bad("unknown unit (use Ki, Mi, Gi, K, M, G)")),
    };
    let bytes = n * mult;
    if !(1.0..1e18).contains(&bytes) {
        return Err(bad("out of range"));
    }
    Ok(bytes as u64)
}

/// Parse a CPU quantity (`"500m"`, `"2"`, `"0.5"`) into millicores.
///
/// # Errors
/// [`RuntimeError::BadQuantity`] for anything else.
pub fn parse_cpu(value: &str) -> Result<u64> {
    let v = value.trim();
    let bad = |reason: &str| RuntimeError::BadQuantity {
        field: "resources.cpu",
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let milli = if let Some(m) = v.strip_suffix('m') {
        m.parse::<u64>().map_err(|_| bad("not a number"))?
    } else {
        let cores: f64 = v.parse().map_err(|_| bad("not a number"))?;
        (cores * 1000.0).round() as u64
    };
    if milli == 0 || milli > 1_000_000 {
        return Err(bad("out of range"));
    }
    Ok(milli)
}

/// How one limit was enforced.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Applied {
    /// The limit's value in its unit (bytes, millicores, processes, milliseconds, fuel units).
    pub value: u64,
    /// `cgroup-v2`, `cgroup-v1`, `rlimit`, `wasm-store-limits`, `wasm-epoch`, `wasm-fuel`, or
    /// `none`.
    pub via: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Applied {
    pub fn new(value: u64, via: &str) -> Self {
        Self {
            value,
            via: via.to_string(),
            note: None,
        }
    }

    pub fn with_note(mut self, note: &str) -> Self {
        self.note = Some(note.to_string());
        self
    }
}

/// Every limit of one agent as applied (for the `agent_started` event).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AppliedLimits {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<Applied>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<Applied>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids: Option<Applied>,
    pub timeout_ms: Option<Applied>,
    pub output_bytes: Option<Applied>,
    pub events_per_s: Option<Applied>,
    /// WASM fuel units per invocation (`AgentSpec::fuel`), when set: a deterministic bound on the
    /// guest's work, next to the wall-clock deadline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fuel: Option<Applied>,
}

/// The start report's view of the scoped file grants: each path, read-only or read-write, where a
/// WASM guest sees it, and the ones skipped (missing; for WASM also plain files, since WASI preopens
/// are directories).
pub fn paths_report(
    spec: &crate::spec::AgentSpec,
    guest_workspace: Option<&str>,
) -> serde_json::Value {
    let (applied, missing) = spec.split_paths();
    let mut out = Vec::new();
    let mut not_dirs = Vec::new();
    for p in applied {
        let mut v = serde_json::json!({
            "path": p.path,
            "access": if p.write { "read-write" } else { "read-only" },
        });
        if let Some(g) = guest_workspace {
            if !p.path.is_dir() {
                not_dirs.push(&p.path);
                continue;
            }
            v["guest"] = serde_json::json!(p.guest_path(&spec.workspace, g));
        }
        out.push(v);
    }
    serde_json::json!({
        "applied": out,
        "skipped_missing": missing.into_iter().map(|p| &p.path).collect::<Vec<_>>(),
        "skipped_not_a_directory": not_dirs,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_mem("512Mi").unwrap(), 512 * 1024 * 1024);
        assert_eq!(parse_mem("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_mem("4096").unwrap(), 4096);
        assert!(parse_mem("12XB").is_err());
        assert_eq!(parse_cpu("500m").unwrap(), 500);
        assert_eq!(parse_cpu("1.5").unwrap(), 1500);
        assert!(parse_cpu("0").is_err());
    }
}
