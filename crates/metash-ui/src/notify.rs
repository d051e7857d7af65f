//! "Needs you" outside the page (issue 15 §6): `[ui] notify_command` in `.meta/config.toml` names
//! a program (an argv list, no shell) that `metash ui` runs once for each new thing a run waits
//! on a person for: a consent question, a checkpoint, the budget checkpoint. The event is one
//! JSON object on the program's stdin, redacted like every other output:
//!
//! ```json
//! {"kind": "consent", "id": "ask-…", "agent": "painter", "capability": "codegen",
//!  "message": "…", "url": "http://127.0.0.1:PORT/"}
//! ```
//!
//! The watcher looks at the log's size and, each time it grew, compares what waits with what it has already announced; so a question is announced once,
//! however many records mention it. A program that fails or hangs (killed after 10 s) is logged
//! on stderr and never stops the UI.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use metash_policy::Redactor;
use metash_store::Store;
use serde::Deserialize;
use serde_json::{json, Value};

/// How long a notifier may run.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(10);

/// `[ui]` of `.meta/config.toml` (the UI's own section; other readers pass it through).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UiSection {
    /// argv of the program run with each "needs you" event as JSON on stdin.
    #[serde(default)]
    pub notify_command: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    ui: UiSection,
}

/// Reads `[ui]`; a file that is not TOML, or a `[ui]` that is wrong, is an error naming the file
/// and why.
///
/// # Errors
/// As above.
pub fn load(root: &Path) -> crate::Result<UiSection> {
    let path = root.join(".meta/config.toml");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(UiSection::default()),
        Err(e) => return Err(crate::UiError::io(path.display().to_string(), e)),
    };
    let f: File = toml::from_str(&text).map_err(|e| {
        crate::UiError::Refused(format!("{}: [ui]: {}", path.display(), e.message()))
    })?;
    if f.ui.notify_command.as_ref().is_some_and(Vec::is_empty) {
        return Err(crate::UiError::Refused(format!(
            "{}: [ui] notify_command is an empty list: name a program",
            path.display()
        )));
    }
    Ok(f.ui)
}

/// What waits on a person now, as notification events (id first, for de-duplication).
fn waiting(store: &Store, url: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    if let Ok(asks) = metash_host::asks::pending(store) {
        for a in asks {
            let ev = json!({"kind": "consent", "id": a.id, "agent": a.agent,
                            "capability": a.capability, "message": a.reason,
                            "deadline": a.deadline, "url": url});
            out.push((a.id, ev));
        }
    }
    if let Ok(Some(cp)) = store.state().map(|s| s.pending_checkpoint) {
        let kind = if cp.id == metash_host::checkpoint::BUDGET_CHECKPOINT {
            "budget"
        } else {
            "checkpoint"
        };
        let ev = json!({"kind": kind, "id": cp.id, "agent": cp.agent,
                        "message": cp.signal.message, "options": cp.signal.options, "url": url});
        out.push((format!("{}@{}", cp.id, cp.raised_at), ev));
    }
    out
}

/// Runs `argv` with `event` on stdin, waiting at most [`NOTIFY_TIMEOUT`].
fn run(argv: &[String], event: &Value) {
    let Some((prog, args)) = argv.split_first() else {
        return;
    };
    let child = Command::new(prog)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!("metash ui: notify_command {prog}: {e}");
            return;
        }
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = writeln!(stdin, "{event}");
    }
    let until = std::time::Instant::now() + NOTIFY_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(st)) if !st.success() => {
                eprintln!("metash ui: notify_command {prog} ended with {st}");
                return;
            }
            Ok(Some(_)) => return,
            Ok(None) if std::time::Instant::now() >= until => {
                let _ = child.kill();
                let _ = child.wait();
                eprintln!("metash ui: notify_command {prog} killed after {NOTIFY_TIMEOUT:?}");
                return;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                eprintln!("metash ui: notify_command {prog}: {e}");
                return;
            }
        }
    }
}

/// Watches the log on a thread of its own until `stop` is set; what waited when it started is
/// not announced (the page shows it).
pub fn watch(
    store: Store,
    argv: Vec<String>,
    redactor: Arc<Redactor>,
    url: String,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    std::thread::spawn(move || {
        let mut told: HashSet<String> = waiting(&store, &url)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        // Any append grows the log: only then is what waits read again.
        let size = |s: &Store| s.log().change_mark();
        let mut seen = size(&store);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            let now = size(&store);
            if now == seen {
                continue;
            }
            seen = now;
            for (id, mut ev) in waiting(&store, &url) {
                if told.insert(id) {
                    redactor.redact_value(&mut ev);
                    run(&argv, &ev);
                }
            }
        }
    });
}
