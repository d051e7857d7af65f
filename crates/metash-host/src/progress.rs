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

pub fn format_line(message: &str, level: LogLevel, color: bool) -> String {
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
