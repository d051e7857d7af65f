#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `metash auth login | list | logout` as a person runs them, against a real OIDC server on
//! loopback (`oidc-provider`) with Chromium as their browser (`$BROWSER`): the device flow, the
//! list without a token, logout revoking at the server; a provider not configured is named.

use std::path::Path;
use std::process::{Command, Output};

use metash_testkit::oidc::{browser, prerequisites, Oidc};

fn metash(ws: &Path, home: &Path, browser: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(ws)
        .args(args)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("HOME", home)
        .env("METASH_VAULT_PASSPHRASE", "a passphrase for the test")
        .env("BROWSER", browser)
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn login_list_and_logout_through_the_cli() {
    let (tools, chromium) = match prerequisites() {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("auth CLI test", &why),
    };
    let server = Oidc::start(&tools, 600, 3600);
    let dir = tempfile::tempdir().unwrap();
    let (ws, home) = (dir.path().join("ws"), dir.path().join("home"));
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    let browse = browser(dir.path(), &tools, &chromium);
    ok(&metash(&ws, &home, &browse, &["init"]));
    let config = ws.join(".meta/config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap_or_default();
    text.push_str(&server.provider_toml());
    std::fs::write(&config, text).unwrap();

    let login = metash(&ws, &home, &browse, &["auth", "login", "test", "--device"]);
    let said = String::from_utf8_lossy(&login.stderr).into_owned();
    assert!(ok(&login).contains("logged in to test (device"), "{said}");
    assert!(said.contains("enter the code"), "{said}");
    let list = ok(&metash(&ws, &home, &browse, &["--json", "auth", "list"]));
    let v: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(v[0]["provider"], "test");
    assert_eq!(v[0]["refreshable"], true);
    assert!(
        !list.contains("access_token") && !list.contains("refresh_token"),
        "{list}"
    );
    let vault = std::fs::read_to_string(home.join("config/metash/vault.json")).unwrap();
    assert!(vault.contains("\"passphrase\""));
    assert!(
        ok(&metash(&ws, &home, &browse, &["auth", "logout", "test"]))
            .contains("revoked at the provider")
    );
    assert_eq!(
        server.grants("urn:ietf:params:oauth:grant-type:device_code"),
        1
    );
    assert!(ok(&metash(&ws, &home, &browse, &["auth", "list"])).contains("no login kept"));

    let unknown = metash(&ws, &home, &browse, &["auth", "login", "nope"]);
    assert!(!unknown.status.success());
    let err = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        err.contains("no OAuth provider `nope`") && err.contains("github"),
        "{err}"
    );
}
