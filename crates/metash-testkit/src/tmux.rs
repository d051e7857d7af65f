//! Typing into a CLI's terminal UI in a tmux pane, as a person would, on a machine that may be
//! slow: the session tests of several binaries drive Claude Code, Codex and pi this way.

use std::process::Output;
use std::time::{Duration, Instant};

/// Whether `ok` holds within `time` (looked at every 250 ms).
pub fn within(time: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + time;
    while !ok() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    true
}

/// What the pane `target` shows; `tmux` runs a tmux command on the test's server.
pub fn screen(tmux: &dyn Fn(&[&str]) -> Output, target: &str) -> String {
    String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", target]).stdout).into_owned()
}

/// Types the prompt `line` into the pane, and Enter once the pane shows it (apart, so a TUI does
/// not take both as one paste), until `reached` says the model got it. A CLI still starting may
/// drop the keys, or read text and Enter as a paste (a newline in its input box, nothing sent):
/// then the input is erased and the prompt typed again, up to five times (a prompt the CLI did
/// send, only slowly, is then sent twice: the test models answer a copy alike).
pub fn type_prompt(
    tmux: &dyn Fn(&[&str]) -> Output,
    target: &str,
    line: &str,
    reached: impl Fn() -> bool,
) {
    for _ in 0..5 {
        let out = tmux(&["send-keys", "-t", target, "-l", line]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if within(Duration::from_secs(10), || {
            screen(tmux, target).contains(line)
        }) {
            tmux(&["send-keys", "-t", target, "Enter"]);
            if within(Duration::from_secs(20), &reached) {
                return;
            }
        }
        eprintln!("{line} did not reach the model: erased and typed again");
        let erase = vec!["BSpace"; line.len() + 8];
        tmux(&[&["send-keys", "-t", target][..], &erase].concat());
    }
    panic!("{line} never reached the model:\n{}", screen(tmux, target));
}
