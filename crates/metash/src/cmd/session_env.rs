//! What a session's launcher gets from the person's shell. tmux gives a new window its server's
//! environment, which may be older than the caller's, so `start`/`resume` pass what the launcher
//! needs: plain variables (where programs are, metash's settings, locale) as `tmux new-window
//! -e`, and the role's key or sign-in through a FIFO in the session's own directory (mode 0600 in
//! a 0700 directory): never in an argv (`ps` shows those to every user), never on disk. The
//! launcher keeps them in its host (`HostOptions::env`), outside the sandbox; the CLI gets a
//! placeholder.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use metash_store::Store;

/// How long the two sides wait for each other.
pub(crate) const HAND_OVER_WITHIN: Duration = Duration::from_secs(30);

/// The FIFO's name in the session's directory.
pub(crate) fn fifo_path(home: &Path) -> PathBuf {
    home.join("launch-env")
}

/// Variables that hold a credential.
const SECRET_NAMES: &[&str] = &[
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "CLAUDE_CODE_OAUTH_TOKEN",
];

/// Plain variables the launcher takes from the caller.
const PLAIN_NAMES: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "TMPDIR",
    "CI",
    "CLAUDE_CONFIG_DIR",
    "CODEX_HOME",
];

/// Variables as `(name, value)` pairs.
pub(crate) type Vars = Vec<(String, String)>;

/// The caller's variables for the launcher: `(plain, secret)`.
pub(crate) fn split(store: &Store, role: Option<&str>) -> (Vars, Vars) {
    let config = metash_host::config::HostConfig::load(store.workspace()).unwrap_or_default();
    let key_var = role
        .and_then(|r| config.roles.get(r))
        .and_then(|r| r.key_env());
    let (mut plain, mut secret) = (Vec::new(), Vec::new());
    for (k, v) in std::env::vars() {
        let is_plain = PLAIN_NAMES.contains(&k.as_str())
            || ["METASH_", "XDG_", "LC_"].iter().any(|p| k.starts_with(p));
        let looks_secret = metash_harness::tmux::looks_secret(&k);
        if SECRET_NAMES.contains(&k.as_str())
            || key_var.as_deref() == Some(k.as_str())
            || (is_plain && looks_secret)
        {
            secret.push((k, v));
        } else if is_plain {
            plain.push((k, v));
        }
    }
    (plain, secret)
}

/// Makes the FIFO (0600) the launcher reads its secrets from.
pub(crate) fn make_fifo(path: &Path) -> Result<()> {
    let _ = std::fs::remove_file(path);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .context("a session path with a NUL byte")?;
    // SAFETY: mkfifo reads the NUL-terminated path only.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("creating {}", path.display()));
    }
    Ok(())
}

/// Writes `secret` into the FIFO once the launcher has opened it (within `within`), then removes
/// it.
///
/// # Errors
/// The launcher never opened it, or the write failed.
pub(crate) fn hand_over(path: &Path, secret: &[(String, String)], within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    let mut file = loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
        {
            Ok(f) => break f,
            // ENXIO: no reader yet.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(e).with_context(|| {
                    format!("the session's launcher did not read {}", path.display())
                });
            }
        }
    };
    let _ = std::fs::remove_file(path);
    let map: BTreeMap<&str, &str> = secret
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let bytes = serde_json::to_vec(&map)?;
    file.write_all(&bytes)
        .context("handing the credentials to the launcher")?;
    Ok(())
}

/// The launcher's side: what `hand_over` wrote (empty when no FIFO was made), read without
/// blocking past `within`.
///
/// # Errors
/// Nothing arrived in time, or it is not a JSON map.
pub(crate) fn receive(path: &Path, within: Duration) -> Result<BTreeMap<String, String>> {
    let mut file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
    };
    let deadline = Instant::now() + within;
    let (mut got, mut buf) = (Vec::new(), [0u8; 4096]);
    let mut writer_seen = false;
    loop {
        match file.read(&mut buf) {
            Ok(0) if writer_seen || !got.is_empty() => break,
            Ok(0) => {}
            Ok(n) => {
                writer_seen = true;
                got.extend_from_slice(&buf[..n]);
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => writer_seen = true,
            Err(e) => return Err(e).context("reading the launcher's credentials"),
        }
        if Instant::now() >= deadline {
            bail!("no credentials arrived for the session within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    serde_json::from_slice(&got).context("the launcher's credentials are not a JSON map")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn secrets_pass_through_the_fifo_and_it_is_gone_after() {
        let d = tempfile::tempdir().unwrap();
        let path = fifo_path(d.path());
        make_fifo(&path).unwrap();
        let p2 = path.clone();
        let writer = std::thread::spawn(move || {
            hand_over(&p2, &[("K".into(), "v=1".into())], Duration::from_secs(10))
        });
        let got = receive(&path, Duration::from_secs(10)).unwrap();
        writer.join().unwrap().unwrap();
        assert_eq!(got.get("K").map(String::as_str), Some("v=1"));
        assert!(!path.exists());
        assert!(receive(&path, Duration::from_secs(1)).unwrap().is_empty());
    }

    #[test]
    fn a_launcher_that_never_reads_times_out_and_the_fifo_is_removed() {
        let d = tempfile::tempdir().unwrap();
        let path = fifo_path(d.path());
        make_fifo(&path).unwrap();
        assert!(hand_over(&path, &[], Duration::from_millis(200)).is_err());
        assert!(!path.exists());
    }
}
