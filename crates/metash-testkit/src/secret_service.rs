//! A real Secret Service for tests: a private D-Bus session bus (Debian's `dbus-daemon`) with
//! GNOME Keyring's secrets component on it, its login keyring created and unlocked with a
//! password the test gives. Nothing of the machine's own session is used or touched: the bus
//! listens on a socket in the test's directory and the keyring files live under it.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const DBUS: &str = "/usr/bin/dbus-daemon";
const KEYRING: &str = "/usr/bin/gnome-keyring-daemon";
const SEND: &str = "/usr/bin/dbus-send";

/// A session bus that starts nothing by itself (no service directories): a client that asks
/// for the Secret Service before the test's keyring has taken the name gets an error, never a
/// second keyring started by activation with the machine's own files.
const BUS_CONFIG: &str = r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>ADDRESS</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"#;

/// Both programs, or why not.
pub fn prerequisites() -> Result<(), String> {
    for (bin, pkg) in [
        (DBUS, "dbus-daemon"),
        (SEND, "dbus-bin"),
        (KEYRING, "gnome-keyring"),
    ] {
        if !Path::new(bin).is_file() {
            return Err(format!(
                "{bin} is missing (Debian's {pkg}; run scripts/setup)"
            ));
        }
    }
    Ok(())
}

/// The running bus and keyring; both killed when dropped.
pub struct SecretService {
    bus: Child,
    keyring: Child,
    /// `DBUS_SESSION_BUS_ADDRESS` for clients of this bus.
    pub address: String,
    /// The keyring's files (`keyrings/login.keyring`).
    pub data_home: PathBuf,
}

impl Drop for SecretService {
    fn drop(&mut self) {
        for child in [&mut self.keyring, &mut self.bus] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl SecretService {
    /// Starts a bus under `dir` and the keyring on it, unlocked with `password`.
    ///
    /// # Errors
    /// Either program failed to start or to say it is ready.
    pub fn start(dir: &Path, password: &str) -> Result<Self, String> {
        let runtime = dir.join("run");
        let data_home = dir.join("data");
        for d in [&runtime, &data_home] {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        {
            use std::os::unix::fs::PermissionsExt;
            // A runtime directory is its owner's alone (the keyring checks).
            std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("{}: {e}", runtime.display()))?;
        }
        let address = format!("unix:path={}", runtime.join("bus").display());
        let config = dir.join("bus.conf");
        std::fs::write(&config, BUS_CONFIG.replace("ADDRESS", &address))
            .map_err(|e| format!("{}: {e}", config.display()))?;
        let mut bus = Command::new(DBUS)
            .args(["--nofork", "--nopidfile", "--print-address=1"])
            .arg(format!("--config-file={}", config.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{DBUS}: {e}"))?;
        // The bus prints its address once it listens.
        let ready = first_line(&mut bus);
        if !ready.starts_with("unix:") {
            let _ = bus.kill();
            return Err(format!("dbus-daemon did not start (it printed {ready:?})"));
        }
        let keyring = start_keyring(&address, &runtime, &data_home, dir, password);
        match keyring {
            Ok(keyring) => Ok(Self {
                bus,
                keyring,
                address,
                data_home,
            }),
            Err(e) => {
                let _ = bus.kill();
                let _ = bus.wait();
                Err(e)
            }
        }
    }
}

fn first_line(child: &mut Child) -> String {
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    line.trim().to_string()
}

/// `gnome-keyring-daemon --unlock` reads the login password on stdin and creates the login
/// keyring (the default collection) if it is new; it is ready once it owns the Secret
/// Service's name on the bus.
fn start_keyring(
    address: &str,
    runtime: &Path,
    data_home: &Path,
    home: &Path,
    password: &str,
) -> Result<Child, String> {
    let mut child = Command::new(KEYRING)
        .args(["--foreground", "--unlock", "--components=secrets"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home)
        .env("XDG_RUNTIME_DIR", runtime)
        .env("XDG_DATA_HOME", data_home)
        .env("DBUS_SESSION_BUS_ADDRESS", address)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{KEYRING}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(password.as_bytes());
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        if owns_secrets(address) {
            return Ok(child);
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("gnome-keyring-daemon exited: {status}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err("gnome-keyring-daemon did not take org.freedesktop.secrets within 20 s".into())
}

/// Whether someone owns `org.freedesktop.secrets` on the bus at `address`.
fn owns_secrets(address: &str) -> bool {
    Command::new(SEND)
        .arg(format!("--bus={address}"))
        .args([
            "--print-reply",
            "--dest=org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus.NameHasOwner",
            "string:org.freedesktop.secrets",
        ])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("boolean true"))
}
