#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The docs say what the code does (issue 37), checked so they stay that way:
//!
//! - every test docs/conformance.md names in its "tested by" column exists: the file resolves
//!   (the table's header says how) and holds a `fn NAME` marked as a test; a test named without
//!   its file is refused, since it could not be checked;
//! - docs/cli.md lists every command and every flag the built `metash` prints in `--help`,
//!   recursively: one row per command (its first cell starts with `` `metash COMMAND ``), holding
//!   each of the command's own flags; the flags every command takes in the page at all.
//!
//! Both fail listing everything missing, so one run says all there is to fix.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root.
fn root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// docs/conformance.md

/// A table row's cells: split on `|` outside code spans and not escaped (`\|`).
fn cells(row: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let (mut in_code, mut escaped) = (false, false);
    for c in row
        .trim()
        .trim_start_matches('|')
        .trim_end_matches('|')
        .chars()
    {
        match c {
            '`' => in_code = !in_code,
            '|' if !in_code && !escaped => {
                out.push(String::new());
                continue;
            }
            _ => {}
        }
        escaped = c == '\\';
        out.last_mut().unwrap().push(c);
    }
    out.into_iter().map(|c| c.trim().to_string()).collect()
}

/// The text of each code span in `cell`.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// A test reference in a code span: `path.rs::name` or a bare `path.rs` (the whole file).
fn reference(span: &str) -> Option<(&str, Option<&str>)> {
    let (path, name) = match span.split_once("::") {
        Some((p, n)) => (p, Some(n)),
        None => (span, None),
    };
    let plain = |s: &str| s.chars().all(|c| c.is_alphanumeric() || "_-./".contains(c));
    (path.ends_with(".rs") && plain(path) && name.is_none_or(|n| plain(n) && !n.is_empty()))
        .then_some((path, name))
}

/// Whether a code span is a test's name alone (`snake_case` with two underscores or more, as
/// tests are named; a field such as `content_type` has one), which the check could not resolve.
fn bare_test_name(span: &str) -> bool {
    span.chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && span.matches('_').count() >= 2
}

/// The crate directory a path starts with (`host/...` is `crates/metash-host`, `metash/...`
/// `crates/metash`), if it starts with one.
fn crate_dir(path: &str) -> Option<(PathBuf, &str)> {
    let (first, rest) = path.split_once('/')?;
    let crates = root().join("crates");
    [first.to_string(), format!("metash-{first}")]
        .into_iter()
        .map(|d| crates.join(d))
        .find(|d| d.join("Cargo.toml").is_file())
        .map(|d| (d, rest))
}

/// Every `.rs` file under `dir` (not `target/`).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() && e.file_name() != "target" {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The files `rel` names inside `krate`: those whose path ends with it, plus, for `x.rs`, the
/// files of its module directory `x/` (where its `tests` module may live).
fn candidates(krate: &Path, rel: &str) -> Vec<PathBuf> {
    let mut all = Vec::new();
    rust_files(krate, &mut all);
    let module_dir = format!("/{}/", rel.trim_end_matches(".rs"));
    all.into_iter()
        .filter(|f| {
            let s = f.to_string_lossy();
            s.ends_with(&format!("/{rel}")) || s.contains(&module_dir)
        })
        .collect()
}

/// Whether `src` has `fn name(` with a test attribute among the attributes and comments just
/// above it.
fn has_test(src: &str, name: &str) -> bool {
    let lines: Vec<&str> = src.lines().collect();
    lines.iter().enumerate().any(|(i, line)| {
        let l = line.trim_start();
        let is_fn = [format!("fn {name}("), format!("async fn {name}(")]
            .iter()
            .any(|f| l.starts_with(f.as_str()) || l.starts_with(&format!("pub {f}")));
        is_fn
            && lines[..i]
                .iter()
                .rev()
                .map(|l| l.trim())
                .take_while(|l| l.starts_with("#[") || l.starts_with("//"))
                .any(|l| l.starts_with("#[") && l.contains("test"))
    })
}

/// What is wrong with one reference (`None`: it exists). `context`: the crate named last before
/// it in the same cell, for a path that names none.
fn check_reference(path: &str, name: Option<&str>, context: &Option<PathBuf>) -> Option<String> {
    let (krate, rel) = match crate_dir(path) {
        Some((k, rest)) if k.join(rest).is_file() => (k, rest.to_string()),
        _ => match context {
            Some(k) => (k.clone(), path.to_string()),
            None => return Some("no crate named before it in its cell".into()),
        },
    };
    let files = candidates(&krate, &rel);
    let exact: Vec<&PathBuf> = files
        .iter()
        .filter(|f| f.to_string_lossy().ends_with(&format!("/{rel}")))
        .collect();
    if exact.is_empty() {
        return Some(format!("no file {rel} in {}", krate.display()));
    }
    let name = name?;
    let found = files
        .iter()
        .any(|f| has_test(&std::fs::read_to_string(f).unwrap_or_default(), name));
    (!found).then(|| format!("no test fn {name} in {rel} (crate {})", krate.display()))
}

/// Every reference in the "tested by" cells, with what is wrong with each one that is.
fn conformance_problems(doc: &str) -> (usize, Vec<String>) {
    let (mut checked, mut problems) = (0, Vec::new());
    let mut tested_by = None;
    for line in doc.lines() {
        if !line.starts_with('|') {
            tested_by = None;
            continue;
        }
        let row = cells(line);
        if tested_by.is_none() {
            tested_by = row.iter().position(|c| c == "tested by");
            continue;
        }
        let Some(cell) = tested_by.and_then(|i| row.get(i)) else {
            continue;
        };
        for bare in code_spans(cell).into_iter().filter(|s| bare_test_name(s)) {
            problems.push(format!(
                "`{bare}`: a test named without its file (write `file.rs::{bare}`) (row: {})",
                &row[0]
            ));
        }
        let mut context: Option<PathBuf> = None;
        for (path, name) in code_spans(cell).into_iter().filter_map(reference) {
            checked += 1;
            if let Some(why) = check_reference(path, name, &context) {
                let shown = name.map_or(path.to_string(), |n| format!("{path}::{n}"));
                problems.push(format!("`{shown}`: {why} (row: {})", &row[0]));
            }
            if let Some((k, _)) = crate_dir(path).filter(|(k, r)| k.join(r).is_file()) {
                context = Some(k);
            }
        }
    }
    (checked, problems)
}

#[test]
fn every_test_the_conformance_table_names_exists() {
    let (checked, problems) = conformance_problems(&read("docs/conformance.md"));
    assert!(
        checked > 50,
        "only {checked} references found: is the table still parsed?"
    );
    assert!(
        problems.is_empty(),
        "docs/conformance.md names tests that do not exist ({} of {checked}):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// docs/cli.md

/// A command's `--help`: its subcommands (not `help`) and its flags (`-n`, `--lines`).
fn help(path: &[String]) -> (Vec<String>, Vec<String>) {
    let out = Command::new(env!("CARGO_BIN_EXE_metash"))
        .args(path)
        .arg("--help")
        .output()
        .expect("run metash");
    assert!(
        out.status.success(),
        "metash {} --help failed",
        path.join(" ")
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8 help");
    let (mut commands, mut flags, mut section) = (Vec::new(), Vec::new(), "");
    for line in text.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            section = line;
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        if section == "Commands:" && indent == 2 {
            let name = line.split_whitespace().next().unwrap_or_default();
            if name != "help" {
                commands.push(name.to_string());
            }
        }
        if section == "Options:" && (2..=6).contains(&indent) && line.trim().starts_with('-') {
            // The flags, up to the description (two spaces on) or the value (`<VALUE>`).
            let spec = line.trim().split("  ").next().unwrap_or_default();
            for token in spec.split_whitespace() {
                let t = token.trim_end_matches(',');
                if t.starts_with('-') && !t.contains('<') && !t.contains('[') {
                    flags.push(t.to_string());
                }
            }
        }
    }
    (commands, flags)
}

/// Whether `text` holds `flag` as a whole word (`--all` is not in `--all-agents`).
fn has_word(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + flag.len()..].chars().next();
        let word = |c: char| c.is_alphanumeric() || c == '-' || c == '_';
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

/// docs/cli.md's row for `metash PATH`: a table row whose first cell starts with it.
fn row<'a>(doc: &'a str, path: &[String]) -> Option<&'a str> {
    let command = format!("`metash {}", path.join(" "));
    doc.lines().filter(|l| l.starts_with('|')).find(|l| {
        let first = cells(l).into_iter().next().unwrap_or_default();
        first
            .strip_prefix(command.trim_end())
            .is_some_and(|rest| rest.starts_with([' ', '`']))
    })
}

/// Walks `metash PATH --help` and its subcommands, noting what docs/cli.md lacks.
fn cli_problems(doc: &str, path: Vec<String>, global: &[String], problems: &mut Vec<String>) {
    let (commands, flags) = help(&path);
    let shown = format!("metash {}", path.join(" "));
    if path.is_empty() {
        for f in &flags {
            if !has_word(doc, f) {
                problems.push(format!(
                    "`{f}` (a flag every command takes) is not in the page"
                ));
            }
        }
    } else {
        match row(doc, &path) {
            None => problems.push(format!("`{}`: no row", shown.trim_end())),
            Some(r) => {
                for f in flags.iter().filter(|f| !global.contains(f)) {
                    if !has_word(r, f) {
                        problems.push(format!("`{shown}`: flag `{f}` not in its row"));
                    }
                }
            }
        }
    }
    for c in commands {
        let mut p = path.clone();
        p.push(c);
        cli_problems(doc, p, global, problems);
    }
}

#[test]
fn the_cli_page_lists_every_command_and_flag_help_prints() {
    let doc = read("docs/cli.md");
    let (commands, global) = help(&[]);
    assert!(commands.len() > 20, "metash --help lists {commands:?}");
    assert!(global.contains(&"--json".to_string()), "{global:?}");
    let mut problems = Vec::new();
    cli_problems(&doc, Vec::new(), &global, &mut problems);
    assert!(
        problems.is_empty(),
        "docs/cli.md does not list what `metash --help` prints ({}):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The parsers above, on text whose answer is known, so a check that finds nothing is not a
/// parser that reads nothing.
#[test]
fn the_parsers_read_what_they_are_given() {
    let r = "| a `x|y` \\| b | `host/tests/spawn.rs` | `serve/rpc.rs::m`, `x.rs` (every test) |";
    let c = cells(r);
    assert_eq!(c.len(), 3, "{c:?}");
    let spans = code_spans(&c[2]);
    assert_eq!(reference(spans[0]), Some(("serve/rpc.rs", Some("m"))));
    assert_eq!(reference("*_mid_run"), None);
    assert!(has_word("`--all` and --all-x", "--all"));
    assert!(!has_word("--all-x --allow", "--all"));
    let src = "#[test]\n/// doc\nfn t() {}\nfn helper() {}\n#[tokio::test]\nasync fn u() {}";
    assert!(has_test(src, "t") && has_test(src, "u"));
    assert!(!has_test(src, "helper") && !has_test(src, "absent"));
    let bad = "| r | i | tested by |\n| - | - | - |\n| x | y | `host/tests/spawn_suite/revocation.rs::no_such_test`, `nowhere.rs` |";
    let (n, problems) = conformance_problems(bad);
    assert_eq!((n, problems.len()), (2, 2), "{problems:?}");
    let bare = "| r | tested by |\n| - | - |\n| x | `store/tests/all.rs`, `a_test_alone`, `content_type` |";
    let (_, problems) = conformance_problems(bare);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("a_test_alone"), "{problems:?}");
}
