//! Turning the manifest's Kubernetes-style `resources` into numbers, and the record of which limits
//! were actually applied and how (the `agent_started` event carries it: no silent limit).

use serde::Serialize;

use crate::error::{Result, RuntimeError};

/// Parse a memory quantity (`"512Mi"`, `"1G"`, `"1048576"`, `"4g"`) into bytes.
///
/// # Errors
/// [`RuntimeError::BadQuantity`] for anything else.
pub fn parse_mem(value: &str) -> Result<u64> {
    parse_bytes("resources.mem", value)
}

/// Parse a byte quantity for `field`: Kubernetes' suffixes (`Ki`, `Mi`, `Gi`, `Ti` binary; `k`/`K`,
/// `M`, `G`, `T` decimal) and Docker's lowercase `m`, `g`, `t` (binary: `mem = "4g"` is 4 GiB, as
/// `docker run --memory 4g` reads it).
///
/// # Errors
/// [`RuntimeError::BadQuantity`] for anything else.
pub fn parse_bytes(field: &'static str, value: &str) -> Result<u64> {
    let v = value.trim();
    let bad = |reason: &str| RuntimeError::BadQuantity {
        field,
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: f64 = num.parse().map_err(|_| bad("not a number"))?;
    const KI: f64 = 1024.0;
    let mult: f64 = match unit {
        "" => 1.0,
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => KI,
        "Mi" | "m" => KI * KI,
        "Gi" | "g" => KI * KI * KI,
        "Ti" | "t" => KI * KI * KI * KI,
        _ => {
            return Err(bad(
                "unknown unit (use Ki, Mi, Gi, K, M, G, or m, g for MiB, GiB)",
            ))
        }
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

/// Bytes a spawn may add, by default, under everything it can write (its workspace, its HOME and
/// TMPDIR): 2 GiB. `[roles.X] disk`, `[host] agent_disk` override it.
pub const DEFAULT_DISK_BYTES: u64 = 2 << 30;
/// Files (and directories, links) a spawn may add there, by default: 100,000. `[roles.X] files`,
/// `[host] agent_files` override it.
pub const DEFAULT_FILES: u64 = 100_000;

/// The write quotas of one spawn: what it may add, while it runs, under every directory it may
/// write. Enforced by a watcher that measures those directories (and, for one file, by
/// `RLIMIT_FSIZE`); past either, the process tree is killed and the turn ends saying why.
#[derive(Debug, Clone, Default)]
pub struct WriteQuota {
    /// Bytes, as written in a config (`"2g"`, `"500Mi"`); `None`: [`DEFAULT_DISK_BYTES`].
    pub disk: Option<String>,
    /// `None`: [`DEFAULT_FILES`].
    pub files: Option<u64>,
    /// Where a hit is told; every copy of the quota shares it, so the caller that set it learns
    /// why the tree was killed.
    pub hit: WriteHit,
}

impl WriteQuota {
    pub fn new(disk: Option<String>, files: Option<u64>) -> Self {
        Self {
            disk,
            files,
            hit: WriteHit::default(),
        }
    }

    /// The quota in numbers (defaults where unset).
    ///
    /// # Errors
    /// A `disk` that does not parse, or a `files` of 0.
    pub fn resolve(&self) -> Result<(u64, u64)> {
        let bytes = match &self.disk {
            Some(d) => parse_bytes("disk", d)?,
            None => DEFAULT_DISK_BYTES,
        };
        let files = self.files.unwrap_or(DEFAULT_FILES);
        if files == 0 {
            return Err(RuntimeError::BadQuantity {
                field: "files",
                value: "0".into(),
                reason: "at least 1".into(),
            });
        }
        Ok((bytes, files))
    }
}

/// Which write quota was hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteLimit {
    Disk,
    Files,
}

impl WriteLimit {
    /// The name in `limit_exceeded` events and `InvocationStatus::LimitExceeded`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disk => "disk",
            Self::Files => "files",
        }
    }
}

/// A write quota that was passed: how much was added (bytes or files) against the maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaHit {
    pub limit: WriteLimit,
    pub used: u64,
    pub max: u64,
}

impl QuotaHit {
    /// What the turn's answer says.
    pub fn explain(&self) -> String {
        match self.limit {
            WriteLimit::Disk => format!(
                "its disk quota: it wrote {} bytes where it may write {} (`disk`); its process \
                 tree was killed and what it wrote is left in place",
                self.used, self.max
            ),
            WriteLimit::Files => format!(
                "its file quota: it made {} files where it may make {} (`files`); its process \
                 tree was killed and what it wrote is left in place",
                self.used, self.max
            ),
        }
    }
}

/// The first [`QuotaHit`] of a spawn, shared between the watcher that finds it and whoever ends
/// the turn.
#[derive(Debug, Clone, Default)]
pub struct WriteHit(std::sync::Arc<std::sync::Mutex<Option<QuotaHit>>>);

impl WriteHit {
    /// The hit, if there was one.
    pub fn get(&self) -> Option<QuotaHit> {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps the first hit; whether this was it.
    pub fn set(&self, hit: QuotaHit) -> bool {
        let mut slot = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot.is_some() {
            return false;
        }
        *slot = Some(hit);
        true
    }
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
        assert_eq!(parse_mem("4g").unwrap(), 4 << 30);
        assert_eq!(parse_bytes("disk", "50m").unwrap(), 50 << 20);
        assert_eq!(WriteQuota::default().resolve().unwrap(), (2 << 30, 100_000));
        assert!(WriteQuota::new(Some("lots".into()), None)
            .resolve()
            .is_err());
        assert!(WriteQuota::new(None, Some(0)).resolve().is_err());
        assert_eq!(parse_cpu("500m").unwrap(), 500);
        assert_eq!(parse_cpu("1.5").unwrap(), 1500);
        assert!(parse_cpu("0").is_err());
    }
}
