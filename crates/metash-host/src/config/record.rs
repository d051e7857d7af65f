//! `[record]`: whether model turns are recorded at the credential proxy (issue 36,
//! docs/replay.md), and how long their tapes are kept.
//!
//! ```toml
//! [record]
//! enabled = true        # the default: every CLI role's turn is recorded
//! keep_days = 30        # tapes older than this are removed by `metash gc` (`inf` keeps them)
//! max_bytes = "1g"      # then the oldest until the rest fit
//! ```

use serde::Deserialize;

/// The section as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordSection {
    /// Absent: on.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Days a tape is kept (default 30; `inf` keeps them).
    #[serde(default)]
    pub keep_days: Option<f64>,
    /// Bytes of tapes kept: a number or `"512m"`, `"1g"` (default 1 GiB).
    #[serde(default)]
    pub max_bytes: Option<toml::Value>,
}

impl RecordSection {
    /// Whether turns are recorded.
    pub fn enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }

    /// The store's retention for tapes (defaults where unset; [`Self::check`] refuses bad values).
    pub fn retention(&self) -> metash_store::tape::TapeRetention {
        let default = metash_store::tape::TapeRetention::default();
        let days = self.keep_days.filter(|d| *d >= 0.0).unwrap_or(30.0);
        metash_store::tape::TapeRetention {
            max_age: std::time::Duration::try_from_secs_f64(days * 86_400.0)
                .unwrap_or(std::time::Duration::MAX),
            max_total_bytes: self
                .max_bytes
                .as_ref()
                .and_then(|v| bytes(v).ok())
                .unwrap_or(default.max_total_bytes),
        }
    }

    /// What TOML's types cannot say.
    ///
    /// # Errors
    /// The first bad value, with its key.
    pub fn check(&self) -> std::result::Result<(), String> {
        if let Some(d) = self.keep_days.filter(|d| d.is_nan() || *d < 0.0) {
            return Err(format!(
                "[record] keep_days must be a number of days >= 0, not {d}"
            ));
        }
        if let Some(v) = &self.max_bytes {
            bytes(v).map_err(|why| format!("[record] max_bytes {why}"))?;
        }
        Ok(())
    }
}

/// A byte count: an integer, or a string with a `k`/`m`/`g`/`t` suffix (powers of 1024, an
/// optional `i` or `ib`/`b`).
fn bytes(v: &toml::Value) -> std::result::Result<u64, String> {
    let bad = || format!("must be a byte count such as 1073741824 or \"1g\", not {v}");
    match v {
        toml::Value::Integer(n) => u64::try_from(*n).map_err(|_| bad()),
        toml::Value::String(s) => {
            let s = s.trim().to_ascii_lowercase();
            let s = s.trim_end_matches('b').trim_end_matches('i');
            let (num, shift) = match s.chars().last() {
                Some('k') => (&s[..s.len() - 1], 10),
                Some('m') => (&s[..s.len() - 1], 20),
                Some('g') => (&s[..s.len() - 1], 30),
                Some('t') => (&s[..s.len() - 1], 40),
                _ => (s, 0),
            };
            let n: u64 = num.trim().parse().map_err(|_| bad())?;
            n.checked_mul(1u64 << shift).ok_or_else(bad)
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse(text: &str) -> RecordSection {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn defaults_on_thirty_days_one_gib() {
        let r = RecordSection::default();
        assert!(r.enabled());
        let ret = r.retention();
        assert_eq!(ret.max_age.as_secs(), 30 * 86_400);
        assert_eq!(ret.max_total_bytes, 1 << 30);
    }

    #[test]
    fn values_and_sizes_are_read_and_bad_ones_named() {
        let r = parse("enabled = false\nkeep_days = 2\nmax_bytes = \"512m\"");
        assert!(!r.enabled());
        assert_eq!(r.retention().max_age.as_secs(), 2 * 86_400);
        assert_eq!(r.retention().max_total_bytes, 512 << 20);
        assert_eq!(parse("max_bytes = 1000").retention().max_total_bytes, 1000);
        assert!(parse("max_bytes = \"lots\"").check().is_err());
        assert!(parse("max_bytes = -1").check().is_err());
        assert!(parse("keep_days = -1").check().is_err());
        assert!(parse("keep_days = inf").check().is_ok());
    }
}
