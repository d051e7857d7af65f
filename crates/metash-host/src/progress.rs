//! `log_progress`: a line for people on the terminal (coloured by level unless `NO_COLOR` is set or
//! the stream is not a terminal), and a `progress` event in the log for everyone else.

use std::io::{IsTerminal, Write};

use metash_protocol::LogLevel;

/// Where progress lines are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Terminal {
    /// stderr, so stdout stays clean for `--json` output.
    Stderr,
    Silent,
}

pub fn level_str(level: LogLevel) -> &'static str {
    match level {
        LogLevel::Info => "info",
        LogLevel::Warn => "warn",
        LogLevel::Error => "error",
    }
}

/// Whether to colour: a terminal, and `NO_COLOR` unset or empty (https://no-color.org).
pub fn use_color(no_color: Option<&str>, is_tty: bool) -> bool {
    is_tty && no_color.is_none_or(str::is_empty)
}

/// The line for people. `message` often carries agent-supplied text (a task title, a verifier's
/// finding, a checkpoint message), so it is shown with every terminal control escaped and on
/// one line (`metash_protocol::sanitize_line`); the only escape sequences printed are metash's
/// own colours around the tag.
pub fn format_line(message: &str, level: LogLevel, color: bool) -> String {
    let message = metash_protocol::sanitize_line(message);
    let tag = level_str(level);
    if !color {
        return format!("[{tag}] {message}");
    }
    let code = match level {
        LogLevel::Info => "36",
        LogLevel::Warn => "33",
        LogLevel::Error => "31;1",
    };
    format!("\x1b[{code}m[{tag}]\x1b[0m {message}")
}

pub fn print(terminal: Terminal, message: &str, level: LogLevel) {
    if terminal == Terminal::Silent {
        return;
    }
    let stderr = std::io::stderr();
    let color = use_color(
        std::env::var("NO_COLOR").ok().as_deref(),
        stderr.is_terminal(),
    );
    let _ = writeln!(stderr.lock(), "{}", format_line(message, level, color));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task title or finding from an agent cannot colour, erase or forge a progress line:
    /// its controls and newlines show as escapes; metash's own colour codes stay.
    #[test]
    fn agent_text_in_a_progress_line_is_escaped() {
        let title = "t1 \x1b]0;pwned\x07\r\x1b[2K\u{9b}31m\u{202e}\n[info] all verified";
        let plain = format_line(&format!("task {title}: failed"), LogLevel::Warn, false);
        assert_eq!(
            plain,
            "[warn] task t1 \\x1b]0;pwned\\x07\\r\\x1b[2K\\u{9b}31m\\u{202e}\\n[info] all \
             verified: failed"
        );
        let coloured = format_line(title, LogLevel::Info, true);
        assert_eq!(coloured.matches('\x1b').count(), 2, "{coloured:?}");
        assert!(coloured.starts_with("\x1b[36m[info]\x1b[0m t1 \\x1b]0;"));
    }
}
