//! A real OAuth 2.0 / OIDC server for tests (`oidc-provider`, pinned in scripts/setup, run by
//! `crates/metash-auth/tests/oidc/server.mjs` on 127.0.0.1), and a person's browser for it
//! (Debian's Chromium through Playwright's core library, `tests/oidc/browse.mjs`), as the
//! command a login opens (`$BROWSER`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixtures() -> PathBuf {
    repo().join("crates/metash-auth/tests/oidc")
}

/// `.tools` (holding `oidc-provider` and `playwright-core`) and Chromium, or why not.
pub fn prerequisites() -> Result<(PathBuf, PathBuf), String> {
    let tools = repo().join(".tools");
    for pkg in ["oidc-provider", "playwright-core"] {
        if !tools
            .join("node_modules")
            .join(pkg)
            .join("package.json")
            .is_file()
        {
            return Err(format!(
                "{pkg} is not installed under .tools (run scripts/setup)"
            ));
        }
    }
    let chromium = PathBuf::from("/usr/bin/chromium");
    if !chromium.is_file() {
        return Err("Debian's chromium is not installed (run scripts/setup)".into());
    }
    Ok((tools, chromium))
}

/// The running server: its issuer URL and every line it printed after `ready` (`grant TYPE`,
/// `grant-error TYPE ERROR`). Killed when dropped.
pub struct Oidc {
    child: Child,
    pub issuer: String,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Drop for Oidc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Oidc {
    /// Starts a server whose access tokens live `at_ttl` seconds and refresh tokens `rt_ttl`.
    ///
    /// # Panics
    /// Node cannot run the server (a test failure: call [`prerequisites`] first).
    pub fn start(tools: &Path, at_ttl: u32, rt_ttl: u32) -> Self {
        let mut child = Command::new("node")
            .arg(fixtures().join("server.mjs"))
            .arg(tools)
            .args([at_ttl.to_string(), rt_ttl.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node runs");
        let mut out = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        let _ = out.read_line(&mut line);
        let issuer = line
            .trim()
            .strip_prefix("ready ")
            .expect("the OIDC server starts")
            .to_string();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for l in out.lines().map_while(Result::ok) {
                if let Ok(mut v) = sink.lock() {
                    v.push(l);
                }
            }
        });
        Self {
            child,
            issuer,
            lines,
        }
    }

    /// Every line printed so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// The lines once the server has printed what it had to: it reports a grant after its
    /// answer went out, so a client may be done before the line is read. Waits until no new
    /// line came for 250 ms (at most 5 s).
    fn settled(&self) -> Vec<String> {
        let start = std::time::Instant::now();
        let mut seen = self.lines();
        loop {
            std::thread::sleep(std::time::Duration::from_millis(250));
            let now = self.lines();
            if now.len() == seen.len() || start.elapsed() > std::time::Duration::from_secs(5) {
                return now;
            }
            seen = now;
        }
    }

    /// Tokens granted by grant type `kind`.
    pub fn grants(&self, kind: &str) -> usize {
        let want = format!("grant {kind}");
        self.settled().iter().filter(|l| **l == want).count()
    }

    /// Grants of `kind` refused.
    pub fn errors(&self, kind: &str) -> Vec<String> {
        let want = format!("grant-error {kind} ");
        self.settled()
            .into_iter()
            .filter(|l| l.starts_with(&want))
            .collect()
    }

    /// `[oauth.providers.test]` naming this server, for `.meta/config.toml`.
    pub fn provider_toml(&self) -> String {
        format!(
            "[oauth.providers.test]\nissuer = \"{}\"\nclient_id = \"metash-cli\"\n\
             scopes = [\"openid\", \"offline_access\", \"repo\"]\n\
             api_bases = [\"http://127.0.0.1:9/\"]\n",
            self.issuer
        )
    }
}

/// Writes `dir/browser.sh`, a `$BROWSER` that opens its URL in Chromium as a person would
/// (confirming a device code, following a sign-in back to the loopback redirect); its output goes
/// to `dir/browser.log`. Returns its path.
///
/// # Panics
/// The script cannot be written.
pub fn browser(dir: &Path, tools: &Path, chromium: &Path) -> String {
    let script = dir.join("browser.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec node {:?} {:?} {:?} \"$1\" >> {:?} 2>&1\n",
            fixtures().join("browse.mjs"),
            tools,
            chromium,
            dir.join("browser.log")
        ),
    )
    .expect("write browser.sh");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .expect("chmod browser.sh");
    }
    script.display().to_string()
}
