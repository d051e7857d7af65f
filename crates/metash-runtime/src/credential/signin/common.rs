//! What both sign-ins share: the token endpoint (and its test override), the renewal's HTTP
//! request, reading and atomically rewriting the user's credentials file, and the locks that keep
//! two processes from spending one refresh token.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use base64::Engine;
use reqwest::Url;
use serde_json::Value;
use zeroize::Zeroizing;

use super::{Env, SignInError};
use crate::credential::route::is_loopback;
use crate::credential::secret::Secret;

/// The longest a renewal may take (Claude Code allows the same).
const REFRESH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a renewal waits for another process's lock before giving up.
const LOCK_WAIT: Duration = Duration::from_secs(40);

/// `var`'s URL when set (checked: `https`, or `http` on loopback), else `default`.
pub(super) fn token_url(
    env: Env<'_>,
    var: &'static str,
    default: &str,
) -> Result<String, SignInError> {
    let Some(url) = env(var).filter(|u| !u.trim().is_empty()) else {
        return Ok(default.to_string());
    };
    let bad = |reason: &str| SignInError::Setting {
        var,
        reason: reason.to_string(),
    };
    let parsed = Url::parse(url.trim()).map_err(|e| bad(&format!("not a URL: {e}")))?;
    let host = parsed.host_str().unwrap_or_default();
    match parsed.scheme() {
        "https" => Ok(url.trim().to_string()),
        "http" if is_loopback(host) => Ok(url.trim().to_string()),
        _ => Err(bad("must be https (or http to a loopback address)")),
    }
}

/// The client renewals use: no redirects (a refresh token is never replayed elsewhere), no proxy
/// from the environment, the same TLS stack as the proxy.
pub(super) fn http_client() -> Result<reqwest::Client, String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(REFRESH_TIMEOUT)
        .build()
        .map_err(|e| format!("cannot build the renewal's HTTP client: {e}"))
}

/// POSTs `body` as JSON to the token endpoint and returns its JSON answer (the raw bytes are
/// zeroed; the parsed copy lives only until the caller has written the file). The error names
/// the status and the endpoint's error code, never a body that could hold a token.
pub(super) async fn post_json(
    http: &reqwest::Client,
    url: &str,
    body: &Value,
) -> Result<Value, Failed> {
    let transient = |reason: String| Failed {
        reason,
        permanent: false,
    };
    let bytes = Zeroizing::new(serde_json::to_vec(body).map_err(|e| transient(e.to_string()))?);
    let resp = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(bytes.to_vec())
        .send()
        .await
        .map_err(|e| transient(format!("the token endpoint: {}", e.without_url())))?;
    let status = resp.status();
    let text = Zeroizing::new(
        resp.bytes()
            .await
            .map_err(|e| transient(format!("the token endpoint: {}", e.without_url())))?
            .to_vec(),
    );
    let json: Option<Value> = serde_json::from_slice(&text).ok();
    if !status.is_success() {
        let code = json.as_ref().and_then(error_code).unwrap_or_default();
        let code = if code.is_empty() {
            String::new()
        } else {
            format!(" ({code})")
        };
        return Err(Failed {
            reason: format!("the token endpoint answered {status}{code}"),
            // The grant itself was refused (an expired, revoked or spent refresh token).
            permanent: matches!(status.as_u16(), 400 | 401 | 403),
        });
    }
    json.ok_or_else(|| transient(format!("the token endpoint answered {status} without JSON")))
}

/// Set by a 401 from the provider: the next grant renews the token even when it is not due yet
/// (the provider knows better than the expiry the file states).
#[derive(Default)]
pub(super) struct Rejected(std::sync::atomic::AtomicBool);

impl Rejected {
    pub(super) fn mark(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a 401 came since the last call (and clears it).
    pub(super) fn take(&self) -> bool {
        self.0.swap(false, std::sync::atomic::Ordering::Relaxed)
    }
}

/// What a request gets while a renewal holds the tokens (the proxy answers 503 and the CLI
/// retries).
pub(super) fn renewing(route: &str) -> crate::credential::secret::SourceError {
    crate::credential::secret::SourceError::Unavailable {
        route: route.to_string(),
        reason: "the sign-in is being renewed".into(),
    }
}

/// Why a renewal failed, and whether sending the same refresh token again could ever work.
pub(super) struct Failed {
    pub reason: String,
    pub permanent: bool,
}

/// The refresh token the endpoint refused for good: never sent again (as Claude Code marks its
/// dead refresh tokens), until the user's file holds another (a new sign-in).
#[derive(Default)]
pub(super) struct Refused(std::sync::Mutex<Option<Secret>>);

impl Refused {
    /// `Err` when `refresh` was refused before, saying how to sign in again.
    pub(super) fn check(&self, refresh: &Secret, sign_in: &str) -> Result<(), String> {
        let dead = self.0.lock().map_err(|_| "a poisoned lock".to_string())?;
        if dead
            .as_ref()
            .is_some_and(|d| d.expose() == refresh.expose())
        {
            return Err(format!(
                "the login's refresh token was refused by the token endpoint: sign in again \
                 with `{sign_in}`"
            ));
        }
        Ok(())
    }

    /// Posts the renewal; a permanent refusal marks `refresh` as dead.
    pub(super) async fn post(
        &self,
        http: &reqwest::Client,
        url: &str,
        body: &Value,
        refresh: &Secret,
    ) -> Result<Value, String> {
        post_json(http, url, body).await.map_err(|f| {
            if f.permanent {
                if let Ok(mut dead) = self.0.lock() {
                    *dead = Some(refresh.clone());
                }
            }
            f.reason
        })
    }
}

/// An OAuth error code (`invalid_grant`, `refresh_token_expired`): short, never a token.
fn error_code(v: &Value) -> Option<String> {
    let code = match &v["error"] {
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .get("code")
            .or_else(|| o.get("type"))
            .and_then(Value::as_str)?
            .to_string(),
        _ => v["code"].as_str()?.to_string(),
    };
    let ok = code.len() <= 64
        && code
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    ok.then_some(code)
}

/// The user's credentials file as JSON (its bytes zeroed once parsed).
pub(super) fn read_json(path: &Path) -> Result<Value, SignInError> {
    let bytes = Zeroizing::new(std::fs::read(path).map_err(|e| SignInError::File {
        path: path.to_path_buf(),
        reason: format!("cannot read it: {e}"),
    })?);
    serde_json::from_slice(&bytes).map_err(|e| SignInError::File {
        path: path.to_path_buf(),
        reason: format!("not JSON: {e}"),
    })
}

/// Replaces `path` with `doc` as the CLIs write it (pretty JSON, mode 0600): a temporary file in
/// the same directory, synced, renamed over it, the directory synced. A reader sees the old
/// file or the new one, never a part.
pub(super) fn write_json_atomic(path: &Path, doc: &Value) -> Result<(), String> {
    let dir = path
        .parent()
        .ok_or("the credentials file has no directory")?;
    let bytes = Zeroizing::new(serde_json::to_vec_pretty(doc).map_err(|e| e.to_string())?);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.metash-{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts.open(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}

/// Milliseconds since the epoch.
pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A JWT's payload as JSON (no signature check: only to read `exp` and non-secret claims of
/// the user's own token).
pub(super) fn jwt_payload(jwt: &str) -> Option<Value> {
    let mut parts = jwt.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The lock Claude Code takes around a renewal (npm's `proper-lockfile`): a directory made with
/// `mkdir`, seen as abandoned once its mtime is 10 s old, its mtime renewed every 5 s while
/// held. Taken on each path in order, released (removed) when dropped.
pub(super) struct DirLock {
    held: Vec<PathBuf>,
    keepalive: Option<tokio::task::JoinHandle<()>>,
}

/// `proper-lockfile`'s default: a lock not touched for this long was abandoned.
const STALE: Duration = Duration::from_secs(10);

impl DirLock {
    pub(super) async fn acquire(paths: &[PathBuf]) -> Result<Self, String> {
        let mut lock = Self {
            held: Vec::new(),
            keepalive: None,
        };
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        for p in paths {
            loop {
                match std::fs::create_dir(p) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        if is_stale(p) {
                            let _ = std::fs::remove_dir(p);
                            continue;
                        }
                        if tokio::time::Instant::now() >= deadline {
                            return Err(format!("{} is held by another process", p.display()));
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    Err(e) => return Err(format!("cannot take {}: {e}", p.display())),
                }
            }
            lock.held.push(p.clone());
        }
        let held = lock.held.clone();
        lock.keepalive = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(STALE / 2).await;
                for p in &held {
                    if let Ok(f) = std::fs::File::open(p) {
                        let _ = f.set_modified(SystemTime::now());
                    }
                }
            }
        }));
        Ok(lock)
    }
}

fn is_stale(p: &Path) -> bool {
    std::fs::metadata(p)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|age| age > STALE)
}

impl Drop for DirLock {
    fn drop(&mut self) {
        if let Some(k) = self.keepalive.take() {
            k.abort();
        }
        for p in self.held.iter().rev() {
            let _ = std::fs::remove_dir(p);
        }
    }
}

/// An exclusive `flock` on a directory (Codex's home): two metash processes never renew one
/// login at once. Released when dropped (the descriptor closes).
pub(super) struct Flock {
    _file: std::fs::File,
}

impl Flock {
    pub(super) async fn acquire(dir: &Path) -> Result<Self, String> {
        let file =
            std::fs::File::open(dir).map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        loop {
            if try_flock(&file)? {
                return Ok(Self { _file: file });
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("{} is locked by another process", dir.display()));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

#[cfg(unix)]
fn try_flock(file: &std::fs::File) -> Result<bool, String> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock(2) on a descriptor this function borrows; no memory is shared.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(format!("flock: {e}"))
    }
}

#[cfg(not(unix))]
fn try_flock(_file: &std::fs::File) -> Result<bool, String> {
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_url_overrides_must_stay_on_tls_or_loopback() {
        let env = |v: &str| -> Option<String> {
            match v {
                "A" => Some("http://127.0.0.1:9/t".into()),
                "B" => Some("http://example.com/t".into()),
                "C" => Some("https://example.com/t".into()),
                _ => None,
            }
        };
        assert_eq!(
            token_url(&env, "A", "d").ok().as_deref(),
            Some("http://127.0.0.1:9/t")
        );
        assert!(token_url(&env, "B", "d").is_err());
        assert_eq!(
            token_url(&env, "C", "d").ok().as_deref(),
            Some("https://example.com/t")
        );
        assert_eq!(token_url(&env, "D", "d").ok().as_deref(), Some("d"));
    }

    #[test]
    fn error_codes_are_short_words_only() {
        let v: Value = serde_json::json!({"error": "invalid_grant"});
        assert_eq!(error_code(&v).as_deref(), Some("invalid_grant"));
        let v: Value = serde_json::json!({"error": {"code": "refresh_token_expired"}});
        assert_eq!(error_code(&v).as_deref(), Some("refresh_token_expired"));
        let v: Value = serde_json::json!({"error": "token sk-ant-xyz was bad"});
        assert_eq!(error_code(&v), None);
    }

    #[test]
    fn jwt_payloads_are_read() {
        let p = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"exp":5}"#);
        assert_eq!(
            jwt_payload(&format!("h.{p}.s")).map(|v| v["exp"].clone()),
            Some(5.into())
        );
        assert!(jwt_payload("not-a-jwt").is_none());
    }
}
