use metash_host::progress::{format_line, use_color};
use metash_protocol::LogLevel;

use super::common::Project;

#[test]
fn colour_only_on_a_terminal_without_no_color() {
    assert!(use_color(None, true));
    assert!(
        use_color(Some(""), true),
        "an empty NO_COLOR does not disable colour"
    );
    assert!(!use_color(Some("1"), true));
    assert!(!use_color(None, false), "never colour into a pipe or file");
    assert_eq!(format_line("hi", LogLevel::Warn, false), "[warn] hi");
    let coloured = format_line("hi", LogLevel::Error, true);
    assert!(
        coloured.starts_with("\x1b[31;1m[error]\x1b[0m"),
        "{coloured:?}"
    );
}

/// log_progress reaches the log and every attached client, in order, after it is durable.
#[test]
fn progress_goes_to_the_log_and_to_subscribers() {
    let p = Project::new();
    let host = p.host(&[]);
    let rx = host.subscribe();
    let seq = host
        .log_progress("planning phase 1", LogLevel::Info)
        .unwrap();
    host.log_progress("task 02 failed verification", LogLevel::Warn)
        .unwrap();
    let first = rx.recv_timeout(std::time::Duration::from_secs(1)).unwrap();
    let second = rx.recv_timeout(std::time::Duration::from_secs(1)).unwrap();
    assert_eq!(first.seq, seq);
    assert_eq!(first.kind, "progress");
    assert_eq!(first.data["message"], "planning phase 1");
    assert_eq!(second.data["level"], "warn");
    let logged = host.store().log().read_all().unwrap();
    assert_eq!(
        logged.last().unwrap().data["message"],
        "task 02 failed verification"
    );
}
