//! The command line's grammar, checked: help on every flag and command, `--help` output kept as
//! snapshots (`UPDATE_HELP=1 cargo test -p metash grammar` rewrites them), and every exit code in
//! docs/cli.md.

use std::path::PathBuf;

use clap::CommandFactory;

use crate::exit::Exit;
use crate::Cli;

/// Every command path: `[]`, `["init"]`, `["state", "get"]`, ...
fn command_paths(cmd: &clap::Command, prefix: &[String], out: &mut Vec<Vec<String>>) {
    out.push(prefix.to_vec());
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        let mut p = prefix.to_vec();
        p.push(sub.get_name().to_string());
        command_paths(sub, &p, out);
    }
}

fn find<'a>(root: &'a mut clap::Command, path: &[String]) -> &'a mut clap::Command {
    path.iter().fold(root, |c, name| {
        c.find_subcommand_mut(name)
            .unwrap_or_else(|| panic!("no subcommand {name}"))
    })
}

#[test]
fn every_flag_and_command_has_help() {
    let mut root = Cli::command();
    root.build();
    let mut paths = Vec::new();
    command_paths(&root, &[], &mut paths);
    let mut missing = Vec::new();
    for path in &paths {
        let cmd = find(&mut root, path);
        let name = format!("metash {}", path.join(" "));
        if cmd.get_about().is_none() && !path.is_empty() {
            missing.push(format!("{name}: no about"));
        }
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") || arg.is_hide_set() {
                continue;
            }
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                missing.push(format!("{name}: --{id} has no help"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "without help text:\n{}",
        missing.join("\n")
    );
}

#[test]
fn help_output_matches_the_snapshots() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/help");
    let update = std::env::var_os("UPDATE_HELP").is_some();
    let mut root = Cli::command().term_width(100);
    root.build();
    let mut paths = Vec::new();
    command_paths(&root, &[], &mut paths);
    let mut stale = Vec::new();
    let mut expected = std::collections::BTreeSet::new();
    for path in &paths {
        let file = dir.join(format!(
            "{}.txt",
            ["metash"]
                .iter()
                .copied()
                .chain(path.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join("-")
        ));
        expected.insert(file.clone());
        let help = find(&mut root, path).render_long_help().to_string();
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&file, &help).unwrap();
        } else if std::fs::read_to_string(&file).ok().as_deref() != Some(help.as_str()) {
            stale.push(file.display().to_string());
        }
    }
    let extra: Vec<_> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| !expected.contains(p))
                .collect()
        })
        .unwrap_or_default();
    assert!(
        stale.is_empty() && extra.is_empty(),
        "--help changed (review, then UPDATE_HELP=1 cargo test -p metash grammar):\n  differs: {stale:?}\n  no such command: {extra:?}"
    );
}

#[test]
fn every_exit_code_is_in_the_table_and_none_is_clap_s() {
    let doc = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/cli.md"),
    )
    .unwrap();
    let codes = [
        Exit::Failure,
        Exit::AgentError,
        Exit::Checkpoint,
        Exit::Halted,
        Exit::Timeout,
        Exit::Refused,
        Exit::Usage,
    ];
    for e in codes {
        let code = e as u8;
        assert_ne!(code, 2, "{e:?} collides with clap's usage code");
        assert!(
            doc.contains(&format!("| {code} |")),
            "docs/cli.md has no row for {code} ({e:?})"
        );
    }
    assert!(doc.contains("| 0 |"));
}
