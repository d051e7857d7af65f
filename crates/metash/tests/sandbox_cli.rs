#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `metash sandbox --role R -- CMD…` (issue 13 item 2): any command under a role's sandbox. The
//! command works in its directory and gets its exit code back; it cannot read outside, cannot see
//! `.meta/`, holds the placeholder instead of the role's key; without the native consent nothing
//! runs and the ledger says why.

use std::path::Path;
use std::process::{Command, Output, Stdio};

const KEY: &str = "sk-sandbox-cli-real-key-0123456789";

fn project() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(d.path())
        .arg("init")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(
        d.path().join(".meta/config.toml"),
        "[roles.coder]\nfrontend = \"pi-sdk\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
         api_key_env = \"METASH_SANDBOX_KEY\"\nmax_pids = 64\n",
    )
    .unwrap();
    d
}

fn sandbox(ws: &Path, consent: bool, script: &str) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metash"));
    c.arg("-C")
        .arg(ws)
        .args(["sandbox", "--role", "coder", "--non-interactive"]);
    if consent {
        c.args(["--yes-to", "native"]);
    }
    c.args(["--", "/bin/bash", "-c", script])
        .current_dir(ws)
        .env("METASH_SANDBOX_KEY", KEY)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_command_runs_under_the_roles_sandbox() {
    if let Some(why) = metash_runtime_unavailable() {
        metash_testkit::skip("a_command_runs_under_the_roles_sandbox", &why);
        return;
    }
    let p = project();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "outside-secret").unwrap();
    let script = format!(
        "echo work > made.txt; cat {}/secret 2>&1; ls .meta 2>&1; \
         echo \"key=$METASH_SANDBOX_KEY\"; exit 7",
        outside.path().display()
    );
    let out = sandbox(p.path(), true, &script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(7),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(p.path().join("made.txt")).unwrap(),
        "work\n"
    );
    assert!(!stdout.contains("outside-secret"), "{stdout}");
    assert!(stdout.contains("secret: Permission denied"), "{stdout}");
    assert!(stdout.contains("'.meta': Permission denied"), "{stdout}");
    assert!(stdout.contains("key=metash-placeholder"), "{stdout}");
    assert!(!stdout.contains(KEY));
    // The consent and the sandbox are in the log.
    let log = std::fs::read_to_string(p.path().join(".meta/events.jsonl")).unwrap();
    let started: serde_json::Value = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["data"].get("sandbox_command").is_some())
        .expect("the sandbox is in the log");
    // The role's quota (max_pids = 64) was applied.
    assert_eq!(
        started["data"]["report"]["limits"]["pids"]["value"], 64,
        "{started}"
    );
    assert!(!log.contains(KEY));
}

#[test]
fn without_native_consent_nothing_runs() {
    let p = project();
    let out = sandbox(p.path(), false, "echo ran > ran.txt");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("native execution of the role `coder` is not allowed"),
        "{stderr}"
    );
    assert!(!p.path().join("ran.txt").exists());
    let log = std::fs::read_to_string(p.path().join(".meta/events.jsonl")).unwrap();
    assert!(
        log.contains("consent_denied") || log.contains("\"error\""),
        "{log}"
    );
}

/// Why the native sandbox cannot run here (no Landlock), if so.
fn metash_runtime_unavailable() -> Option<String> {
    // SAFETY: the VERSION query of landlock_create_ruleset reads nothing.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    (abi < 1).then(|| "Landlock is not available in this kernel".to_string())
}

#[test]
fn a_roles_network_allowlist_is_reachable_through_the_proxy_and_nothing_else() {
    if let Some(why) = metash_runtime_unavailable() {
        metash_testkit::skip(
            "a_roles_network_allowlist_is_reachable_through_the_proxy_and_nothing_else",
            &why,
        );
        return;
    }
    let p = project();
    let config = std::fs::read_to_string(p.path().join(".meta/config.toml")).unwrap();
    std::fs::write(
        p.path().join(".meta/config.toml"),
        format!("{config}network = [\"localhost\"]\n"),
    )
    .unwrap();
    // A plain HTTP server the allowlist names.
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut c in server.incoming().flatten() {
            let mut buf = [0u8; 2048];
            let _ = c.read(&mut buf);
            let _ = c.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 19\r\nconnection: close\r\n\r\nhello-through-proxy");
        }
    });
    let py = format!(
        "import os, urllib.request as u\n\
         o = u.build_opener(u.ProxyHandler({{'http': os.environ['HTTP_PROXY']}}))\n\
         print(o.open('http://localhost:{port}/').read().decode())\n\
         try:\n    o.open('http://blocked.example/')\n    print('BLOCKED-REACHED')\n\
         except Exception as e:\n    print('blocked:', e)\n\
         import socket\n\
         try:\n    socket.create_connection(('127.0.0.1', {port}))\n    print('DIRECT-REACHED')\n\
         except Exception as e:\n    print('direct:', e)\n"
    );
    std::fs::write(p.path().join("probe.py"), py).unwrap();
    let out = sandbox(p.path(), true, "/usr/bin/python3 probe.py 2>&1");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("hello-through-proxy"), "{stdout}");
    assert!(
        !stdout.contains("BLOCKED-REACHED") && stdout.contains("blocked:"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("DIRECT-REACHED") && stdout.contains("direct:"),
        "{stdout}"
    );
    let log = std::fs::read_to_string(p.path().join(".meta/events.jsonl")).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("sandbox_denied") && l.contains("blocked.example")),
        "{log}"
    );
}

/// A sandboxed command's model exchanges are recorded like a spawn's (issue 36 item 1): one tape
/// tagged `sandbox-…`, holding the request and the answer, without the key the proxy added even
/// when the model echoes it back.
#[test]
fn a_sandboxed_commands_model_exchange_is_recorded_without_the_key() {
    if let Some(why) = metash_runtime_unavailable() {
        metash_testkit::skip(
            "a_sandboxed_commands_model_exchange_is_recorded_without_the_key",
            &why,
        );
        return;
    }
    // A loopback "model" that answers with every header it got: the real key included.
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let (saw_key, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::{BufRead, BufReader, Read, Write};
        for c in server.incoming().flatten() {
            let mut r = BufReader::new(c);
            let (mut head, mut len) = (String::new(), 0usize);
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
                head.push_str(&line);
            }
            let mut body = vec![0u8; len];
            let _ = r.read_exact(&mut body);
            let _ = saw_key.send(head.contains(KEY));
            let answer = format!("SANDBOX-ANSWER {head}");
            let _ = r.get_mut().write_all(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n{answer}",
                    answer.len()
                )
                .as_bytes(),
            );
        }
    });
    let p = project();
    let config = std::fs::read_to_string(p.path().join(".meta/config.toml")).unwrap();
    std::fs::write(
        p.path().join(".meta/config.toml"),
        config.replace("127.0.0.1:9/v1", &format!("127.0.0.1:{port}/v1")),
    )
    .unwrap();
    let py = "import os, urllib.request as u\n\
              o = u.build_opener(u.ProxyHandler({}))\n\
              r = u.Request(os.environ['METASH_MODEL_BASE_URL'] + '/messages',\n\
                  data=b'{\"prompt\": \"SANDBOX-PROMPT\"}',\n\
                  headers={'x-api-key': os.environ['METASH_SANDBOX_KEY'],\n\
                           'content-type': 'application/json'})\n\
              print(o.open(r).read().decode())\n";
    std::fs::write(p.path().join("ask.py"), py).unwrap();
    let out = sandbox(p.path(), true, "/usr/bin/python3 ask.py 2>&1");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("SANDBOX-ANSWER"), "{stdout}");
    assert!(seen.try_recv().unwrap(), "the model got the real key");
    let list = Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(p.path())
        .args(["--json", "tape", "list"])
        .output()
        .unwrap();
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let tape = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| {
            t["session_id"]
                .as_str()
                .is_some_and(|s| s.starts_with("sandbox-"))
        })
        .unwrap_or_else(|| panic!("no tape of the sandboxed command: {list}"));
    let shown = Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(p.path())
        .args([
            "--json",
            "tape",
            "show",
            tape["id"].as_str().unwrap(),
            "--bodies",
        ])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("SANDBOX-PROMPT") && shown.contains("SANDBOX-ANSWER"),
        "{shown}"
    );
    let mut stack = vec![p.path().join(".meta/tapes")];
    let mut files = 0;
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
                continue;
            }
            let text = String::from_utf8_lossy(&std::fs::read(e.path()).unwrap()).to_string();
            assert!(!text.contains(KEY), "{} holds the key", e.path().display());
            files += 1;
        }
    }
    assert!(files >= 2, "an index and its blobs");
}
