//! Migration round trip: an unversioned manifest migrates, validates and keeps its comments.

use std::path::Path;

use metash_policy::manifest::parse;
use metash_policy::migrate::migrate;

const OLD: &str = r#"# Claude Code agent: written before manifests had versions.
# Maintainer: someone@example.com

name = "Claude Code"   # shown in the UI
version = "0.1.0"
entry = "claude_agent.wasm"
sandbox = "wasm"              # wasm | native

# What it may do.
capabilities = ["codegen", "files.read"]

resources.cpu = "500m"
resources.mem = "512Mi"

[ui]
# hints for the TUI
hints = ["streaming"]
"#;

#[test]
fn unversioned_manifest_migrates_validates_and_keeps_comments() {
    let path = Path::new("/a/manifest.toml");
    let err = parse(path, OLD).unwrap_err().to_string();
    assert!(
        err.contains("field `schema_version`: missing required field"),
        "{err}"
    );
    let m = migrate(path, OLD).unwrap();
    assert_eq!(m.changes.len(), 1);
    assert_eq!(m.changes[0].line, 4);
    assert_eq!(m.changes[0].added, "schema_version = \"0.1\"");
    // Exactly one line added after the header block; every other byte kept.
    let expected = OLD.replacen("\n\nname", "\n\nschema_version = \"0.1\"\nname", 1);
    assert_eq!(m.output, expected);
    for comment in [
        "# Claude Code agent",
        "# shown in the UI",
        "# wasm | native",
        "# What it may do.",
        "# hints for the TUI",
    ] {
        assert!(m.output.contains(comment));
    }
    let manifest = parse(path, &m.output).unwrap();
    assert_eq!(manifest.schema_version, "0.1");
    assert_eq!(manifest.ui.hints, ["streaming"]);
    // Idempotent.
    let again = migrate(path, &m.output).unwrap();
    assert!(again.changes.is_empty());
    assert_eq!(again.output, m.output);
}

#[test]
fn a_comment_on_the_first_key_stays_with_it() {
    let src = "# the name\nname = \"x\"\n";
    let m = migrate(Path::new("m.toml"), src).unwrap();
    assert_eq!(
        m.output,
        "schema_version = \"0.1\"\n# the name\nname = \"x\"\n"
    );
}

#[test]
fn broken_toml_is_reported_with_its_place() {
    let e = migrate(Path::new("m.toml"), "name = \"x\"\nversion = \n")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("m.toml:2:"), "{e}");
}
