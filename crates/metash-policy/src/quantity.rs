//! Kubernetes-style resource quantities as the seed writes them (`resources.cpu = "500m"`,
//! `resources.mem = "512Mi"`). The runtime enforces the numbers; here they are parsed once so a typo
//! is caught at registration, not when the agent first runs.

/// CPU in millicores: `"500m"` is 500, `"2"` is 2000, `"0.5"` is 500.
///
/// # Errors
/// A message saying what was expected, for the manifest diagnostic.
pub fn cpu_millis(s: &str) -> Result<u64, String> {
    let expected = || format!("a CPU quantity such as \"500m\", \"2\" or \"0.5\", found \"{s}\"");
    let millis = if let Some(m) = s.strip_suffix('m') {
        digits(m).ok_or_else(expected)?
    } else {
        let (int, frac) = s.split_once('.').unwrap_or((s, ""));
        if frac.len() > 3 || (s.contains('.') && frac.is_empty()) {
            return Err(expected());
        }
        let int = digits(int).ok_or_else(expected)?;
        let frac = if frac.is_empty() {
            0
        } else {
            let padded = format!("{frac:0<3}");
            digits(&padded).ok_or_else(expected)?
        };
        int.checked_mul(1000)
            .and_then(|v| v.checked_add(frac))
            .ok_or_else(expected)?
    };
    if millis == 0 {
        return Err(format!("a CPU quantity greater than zero, found \"{s}\""));
    }
    Ok(millis)
}

/// Memory in bytes: `"512Mi"`, `"1Gi"`, `"1000000"`, `"64M"` (binary suffixes Ki Mi Gi Ti Pi, decimal
/// k/K M G T P).
///
/// # Errors
/// A message saying what was expected, for the manifest diagnostic.
pub fn mem_bytes(s: &str) -> Result<u64, String> {
    let expected = || {
        format!(
            "a memory quantity such as \"512Mi\", \"1Gi\" or \"1000000\" (bytes), found \"{s}\""
        )
    };
    const SUFFIXES: &[(&str, u64)] = &[
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("k", 1_000),
        ("K", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
    ];
    let (num, mult) = SUFFIXES
        .iter()
        .find_map(|(suf, mult)| s.strip_suffix(suf).map(|n| (n, *mult)))
        .unwrap_or((s, 1));
    let bytes = digits(num)
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(expected)?;
    if bytes == 0 {
        return Err(format!(
            "a memory quantity greater than zero, found \"{s}\""
        ));
    }
    Ok(bytes)
}

/// ASCII digits only (no sign, no spaces), as a u64.
fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu() {
        assert_eq!(cpu_millis("500m"), Ok(500));
        assert_eq!(cpu_millis("2"), Ok(2000));
        assert_eq!(cpu_millis("0.5"), Ok(500));
        assert_eq!(cpu_millis("1.25"), Ok(1250));
        for bad in [
            "", "m", "0", "0m", "-1", "1.", ".5", "1.2345", "500 m", "2cores",
        ] {
            assert!(cpu_millis(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mem() {
        assert_eq!(mem_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(mem_bytes("1Gi"), Ok(1 << 30));
        assert_eq!(mem_bytes("1000000"), Ok(1_000_000));
        assert_eq!(mem_bytes("64M"), Ok(64_000_000));
        for bad in [
            "",
            "Mi",
            "0",
            "512MB",
            "1.5Gi",
            "-1Gi",
            "99999999999999999999Pi",
        ] {
            assert!(mem_bytes(bad).is_err(), "{bad}");
        }
    }
}
