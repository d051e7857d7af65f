//! A hostile native agent for the artifact race (issue 30): the prompt `race N OUTSIDE`
//! makes it set up `d/f` (`inside`) and `d.alt` -> OUTSIDE (a directory holding a secret `f`)
//! in its workspace, start a thread that swaps `d` and `d.alt` in a tight loop, and announce
//! `d/f` as the artifacts `r0` .. `r{N-1}`. After each announcement it waits for the host to
//! have handled it (a `state_get` round trip; the host answers events in order), counting the
//! `artifact_refused` errors that come back. It outputs `swaps=S refused=R sent=N`, so the test
//! can tell the race really ran.

// The race needs Unix symlinks: elsewhere the agent only builds (the workspace is checked for
// every target) and refuses.
#![cfg_attr(not(unix), allow(unused, unreachable_code))]

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use metash_agent::Session;
use metash_protocol::AgentEvent;

/// `rename(2)` of `a` and `b` into each other at once (Linux), so `d` always exists.
#[cfg(target_os = "linux")]
fn swap(a: &Path, b: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let (Ok(a), Ok(b)) = (
        std::ffi::CString::new(a.as_os_str().as_bytes()),
        std::ffi::CString::new(b.as_os_str().as_bytes()),
    ) else {
        return false;
    };
    // SAFETY: two NUL-terminated paths, for the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    r == 0
}

#[cfg(not(target_os = "linux"))]
fn swap(a: &Path, b: &Path) -> bool {
    let tmp = a.with_extension("tmp");
    std::fs::rename(a, &tmp).is_ok()
        && std::fs::rename(b, a).is_ok()
        && std::fs::rename(&tmp, b).is_ok()
}

/// Announces `d/f` as artifact `id` and waits for the host to have handled it: whether it
/// was refused.
fn announce<W: std::io::Write>(s: &mut Session<W>, id: &str) -> std::io::Result<bool> {
    s.send(AgentEvent::Artifact {
        id: id.to_string(),
        kind: "file".into(),
        path: "d/f".into(),
        preview_hint: None,
    })?;
    s.send(AgentEvent::StateGet {
        key: "variables.race".into(),
        scope: Some("session".into()),
    })?;
    let mut refused = false;
    loop {
        match s.recv()? {
            Some(AgentEvent::Error { code, .. }) if code == "artifact_refused" => refused = true,
            Some(AgentEvent::StateValue { .. }) | None => return Ok(refused),
            Some(_) => {}
        }
    }
}

fn race<W: std::io::Write>(s: &mut Session<W>, n: usize, outside: &str) -> Result<String, String> {
    let io = |e: std::io::Error| e.to_string();
    let (d, alt) = (Path::new("d"), Path::new("d.alt"));
    std::fs::create_dir_all(d).map_err(io)?;
    std::fs::write(d.join("f"), "inside").map_err(io)?;
    #[cfg(unix)]
    std::os::unix::fs::symlink(outside, alt).map_err(io)?;
    #[cfg(not(unix))]
    return Err(format!(
        "the race needs Unix symlinks, not here ({outside})"
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps) = (Arc::clone(&stop), Arc::clone(&swaps));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if swap(d, alt) {
                    swaps.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let mut refused = 0;
    for i in 0..n {
        if announce(s, &format!("r{i}")).map_err(io)? {
            refused += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = swapper.join();
    Ok(format!(
        "swaps={} refused={refused} sent={n}",
        swaps.load(Ordering::Relaxed)
    ))
}

fn main() {
    let result = metash_agent::run(|s, input| {
        let mut words = input.prompt.split_whitespace();
        let (cmd, n, outside) = (words.next(), words.next(), words.next());
        match (cmd, n.and_then(|n| n.parse().ok()), outside) {
            (Some("race"), Some(n), Some(outside)) => {
                let text = race(s, n, outside)?;
                s.output("text/plain", &text).map_err(|e| e.to_string())
            }
            _ => Err(format!("expected `race N OUTSIDE`, got `{}`", input.prompt)),
        }
    });
    if let Err(e) = result {
        eprintln!("artifact-race-agent: {e}");
        std::process::exit(1);
    }
}
