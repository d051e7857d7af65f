#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The house rules of docs/architecture.md, checked over the source of every crate in the
//! workspace (issue 37), so that they stay kept:
//!
//! - **No import circle between the modules of one crate.** A module's references to the rest of
//!   its crate (`use crate::…`, `use super::…`, `use self::…`, grouped trees such as
//!   `use crate::{a, b::c}`, and paths written in code such as `crate::x::y(…)`) are edges to the
//!   module each path lands in: its longest prefix that is a module, so `crate::pages::esc` is an
//!   edge to `pages` even when `pages` only re-exports it. An edge between a module and one of its
//!   ancestors or descendants (a child using its parent's items, `mod.rs` or `lib.rs` reaching
//!   into its submodules) is how Rust is written and does not count; every other edge does, and
//!   a cycle among them fails the test, which prints every cycle found (the shortest through
//!   each module on one) with the line that makes each edge. Each crate root (`lib.rs`,
//!   `main.rs`, `bin/*.rs`) is a crate of its own; code under `#[cfg(test)]` is left out.
//! - **Functions are at most 80 lines** (from `fn` to its closing brace, signature included)
//!   outside test code, but for at most three exceptions listed in [`LONG`] with their reason,
//!   none over 150 lines.
//!
//! Both read the source with a small tokenizer (`house_rules/lex.rs`), not the compiler: a path
//! in a string or a comment is no reference, and one reached only through a name a glob import
//! brought in (`use super::*; sibling::f()`) is not seen.

#[path = "house_rules/lex.rs"]
mod lex;
#[path = "house_rules/modules.rs"]
mod modules;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use modules::{Crate, ModPath};

/// The longest a function may be.
const LIMIT: usize = 80;

/// The functions allowed to be longer, by file (from the workspace root) and name, with why:
/// at most three, none over [`HARD_LIMIT`] lines. An entry whose function is short again is
/// reported (remove it), not failed, so that the work that shortens it needs no edit here.
const LONG: &[(&str, &str, &str)] = &[];

/// Circles that were there when this check was written and are still to be broken (issue 37),
/// by crate root and cycle as the test prints it: reported, not failed. The list may only
/// shrink: a circle that is gone is reported (remove its entry), and any circle not listed fails.
const KNOWN: &[(&str, &str)] = &[];

/// The longest an exception may be.
const HARD_LIMIT: usize = 150;

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every crate root of the workspace, named `crate` or `crate (bin x)`, loaded.
fn workspace() -> Vec<(String, Crate)> {
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    dirs.sort();
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let src = dir.join("src");
        let mut roots = vec![
            (name.clone(), src.join("lib.rs")),
            (format!("{name} (bin)"), src.join("main.rs")),
        ];
        if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
            for bin in bins.flatten().map(|e| e.path()) {
                let stem = bin.file_stem().unwrap().to_string_lossy().to_string();
                roots.push((format!("{name} (bin {stem})"), bin));
            }
        }
        for (label, file) in roots.into_iter().filter(|(_, f)| f.is_file()) {
            out.push((label, modules::load(&file, &read)));
        }
    }
    out
}

fn show(m: &ModPath) -> String {
    if m.is_empty() {
        "crate".to_string()
    } else {
        m.join("::")
    }
}

/// A path from the workspace root, for messages.
fn rel(p: &Path) -> String {
    let root = root().canonicalize().unwrap();
    let p = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    p.strip_prefix(&root).unwrap_or(&p).display().to_string()
}

/// The cycles of `krate`: each as `a → b → a`, and as a paragraph that adds where each of its
/// edges is made.
fn circles(name: &str, krate: &Crate) -> Vec<(String, String)> {
    let edges = krate.edges();
    krate
        .cycles()
        .into_iter()
        .map(|cycle| {
            let mut names: Vec<String> = cycle.iter().map(show).collect();
            names.push(show(&cycle[0]));
            let cycle_text = names.join(" → ");
            let mut s = format!("{name}: {cycle_text}");
            for (k, from) in cycle.iter().enumerate() {
                let to = &cycle[(k + 1) % cycle.len()];
                let (file, line) = &edges[&(from.clone(), to.clone())];
                s.push_str(&format!(
                    "\n    {} → {}: {}:{line}",
                    show(from),
                    show(to),
                    rel(file)
                ));
            }
            (cycle_text, s)
        })
        .collect()
}

#[test]
fn no_import_circle_between_the_modules_of_a_crate() {
    let crates = workspace();
    // Not vacuous: the crates were found and read.
    assert!(crates.len() >= 12, "{} crate roots found", crates.len());
    let store = &crates.iter().find(|(n, _)| n == "metash-store").unwrap().1;
    assert!(store
        .modules
        .contains_key(&vec!["pg".to_string(), "store".to_string()]));
    assert!(
        store.edges().len() > 10,
        "metash-store: {:?}",
        store.edges()
    );
    let (mut found, mut known) = (Vec::new(), Vec::new());
    for (name, krate) in &crates {
        for (cycle, text) in circles(name, krate) {
            match KNOWN.iter().find(|(n, c)| n == name && *c == cycle) {
                Some(k) => known.push((k, text)),
                None => found.push(text),
            }
        }
    }
    for (_, text) in &known {
        eprintln!("known, still to break (KNOWN):\n{text}");
    }
    for k in KNOWN.iter().filter(|k| !known.iter().any(|(f, _)| f == k)) {
        eprintln!("no longer a circle, remove it from KNOWN: {}: {}", k.0, k.1);
    }
    assert!(
        found.is_empty(),
        "{} import circle(s) between modules of one crate (docs/architecture.md, the house \
         rules); move what both sides use below both, or make one side depend on a trait the \
         other implements:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn functions_are_at_most_80_lines() {
    assert!(LONG.len() <= 3, "at most three exceptions");
    let mut too_long = Vec::new();
    let mut excepted = Vec::new();
    for (_, krate) in workspace() {
        for f in &krate.fns {
            let file = rel(&f.file);
            let exception = LONG.iter().find(|(p, n, _)| *p == file && *n == f.name);
            let limit = if exception.is_some() {
                HARD_LIMIT
            } else {
                LIMIT
            };
            if exception.is_some() {
                excepted.push((file.clone(), f.name.clone(), f.lines));
            }
            if f.lines > limit {
                too_long.push(format!("{file}:{} `{}`: {} lines", f.line, f.name, f.lines));
            }
        }
    }
    too_long.sort();
    too_long.dedup();
    for (p, n, _) in LONG {
        if !excepted
            .iter()
            .any(|(f, g, lines)| f == p && g == n && *lines > LIMIT)
        {
            eprintln!("{p} `{n}` is no longer over {LIMIT} lines: remove it from LONG");
        }
    }
    assert!(
        too_long.is_empty(),
        "{} function(s) over {LIMIT} lines outside tests (docs/architecture.md, the house \
         rules):\n{}",
        too_long.len(),
        too_long.join("\n")
    );
}

/// The checks themselves, on a made-up crate: every form of reference they read, and what they
/// must leave out.
#[test]
fn the_checks_see_every_form_of_reference_and_only_those() {
    let files: HashMap<PathBuf, &str> = [
        (
            "src/lib.rs",
            "mod a;\npub mod b;\nmod c;\nmod d;\npub use a::X;\n",
        ),
        // A grouped tree: edges to b (through `b::{self, …}`) and to c.
        (
            "src/a.rs",
            "use crate::{b::{self, Y}, c as cc};\npub struct X;\n",
        ),
        // An inline path: b → a, so a ↔ b.
        (
            "src/b.rs",
            "pub struct Y;\nfn f() {\n    let _ = crate::a::X;\n}\ntrait T {\n    fn g();\n}\n",
        ),
        // In a comment or a string: no reference. `super::d` is an edge to d.
        (
            "src/c/mod.rs",
            "mod e;\nuse super::d::Z; // crate::a::X\nconst S: &str = \"crate::a::X\";\n",
        ),
        // To a grandparent's child (an edge), and to its parent (none).
        ("src/c/e.rs", "use super::super::a as _a;\nuse super::*;\n"),
        // Test code: neither edges nor lengths.
        (
            "src/d.rs",
            "pub struct Z;\n#[cfg(test)]\nmod tests {\n    use crate::c;\n    fn t() {\n    }\n}\n",
        ),
    ]
    .into_iter()
    .map(|(p, s)| (PathBuf::from(p), s))
    .collect();
    let read = |p: &Path| files.get(p).map(|s| s.to_string());
    let krate = modules::load(Path::new("src/lib.rs"), &read);
    let m = |s: &str| -> ModPath { s.split("::").map(str::to_string).collect() };
    let edges: Vec<(ModPath, ModPath)> = krate.edges().into_keys().collect();
    assert_eq!(
        edges,
        vec![
            (m("a"), m("b")),
            (m("a"), m("c")),
            (m("b"), m("a")),
            (m("c"), m("d")),
            (m("c::e"), m("a")),
        ]
    );
    assert_eq!(krate.cycles(), vec![vec![m("a"), m("b")]]);
    let fns: Vec<(String, usize)> = krate
        .fns
        .iter()
        .map(|f| (f.name.clone(), f.lines))
        .collect();
    assert_eq!(fns, vec![("f".to_string(), 3)]);
    let text: Vec<String> = circles("made-up", &krate)
        .into_iter()
        .map(|c| c.1)
        .collect();
    let text = text.join("\n");
    assert!(text.contains("a → b → a"), "{text}");
    assert!(text.contains("b → a: src/b.rs:3"), "{text}");
}
