//! Every validation error names the exact file, line, column and field, and what was expected.

use std::path::Path;

use metash_policy::manifest::{parse, Diagnostic};
use metash_protocol::{Manifest, SandboxKind};

use super::common::SEED;

const FILE: &str = "/agents/demo/manifest.toml";

fn errors(src: &str) -> Vec<Diagnostic> {
    parse(Path::new(FILE), src).expect_err("must be rejected").0
}

/// The one diagnostic of `src`, checked for place and field; returns its full text.
fn one(src: &str, line: usize, column: usize, field: Option<&str>) -> String {
    let errs = errors(src);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    let d = &errs[0];
    assert_eq!(d.path, Path::new(FILE));
    assert_eq!((d.line, d.column), (line, column), "{d}");
    assert_eq!(d.field.as_deref(), field, "{d}");
    let text = d.to_string();
    let place = format!("{FILE}:{line}:{column}: ");
    assert!(text.starts_with(&place), "{text}");
    if let Some(f) = field {
        assert!(text.contains(&format!("field `{f}`")), "{text}");
    }
    text
}

/// The seed with line `n` (1-based) replaced.
fn seed_with_line(n: usize, line: &str) -> String {
    let mut lines: Vec<&str> = SEED.lines().collect();
    lines[n - 1] = line;
    lines.join("\n") + "\n"
}

#[test]
fn the_seed_manifest_parses_exactly() {
    let m = parse(Path::new(FILE), SEED).unwrap();
    assert_eq!(
        m,
        Manifest {
            schema_version: "0.1".into(),
            name: "Claude Code".into(),
            version: "0.1.0".into(),
            entry: "claude_agent.wasm".into(),
            sandbox: SandboxKind::Wasm,
            capabilities: [
                "codegen",
                "files.read",
                "files.write",
                "network",
                "media.preview"
            ]
            .map(String::from)
            .to_vec(),
            oauth_scopes: vec!["github:repo".into(), "google:drive.readonly".into()],
            resources: metash_protocol::manifest::Resources {
                cpu: Some("500m".into()),
                mem: Some("512Mi".into()),
            },
            ui: metash_protocol::manifest::UiHints {
                hints: vec!["streaming".into(), "diff".into(), "preview".into()],
            },
            hooks: vec![],
        }
    );
}

/// `hooks`: metash's extension for seed 002 §3's `shutdown()`; an unknown hook is located.
#[test]
fn hooks_declare_shutdown_and_unknown_ones_are_located() {
    let m = parse(Path::new(FILE), &format!("{SEED}hooks = [\"shutdown\"]\n")).unwrap();
    assert_eq!(m.hooks, vec![metash_protocol::Hook::Shutdown]);
    let text = format!("{SEED}hooks = [\"teardown\"]\n");
    let err = parse(Path::new(FILE), &text).unwrap_err().to_string();
    let line = text.lines().count();
    assert!(
        err.contains(&format!(":{line}:")) && err.contains("teardown"),
        "{err}"
    );
}

#[test]
fn table_and_inline_forms_parse_like_dotted_keys() {
    let header = SEED
        .replace("resources.cpu = \"500m\"\nresources.mem = \"512Mi\"\n", "")
        .replace("ui.hints = [\"streaming\", \"diff\", \"preview\"]\n", "")
        + "[resources]\ncpu = \"500m\"\nmem = \"512Mi\"\n\n[ui]\nhints = [\"streaming\", \"diff\", \"preview\"]\n";
    let inline = SEED.replace(
        "resources.cpu = \"500m\"\nresources.mem = \"512Mi\"\n",
        "resources = { cpu = \"500m\", mem = \"512Mi\" }\n",
    );
    let seed = parse(Path::new(FILE), SEED).unwrap();
    assert_eq!(parse(Path::new(FILE), &header).unwrap(), seed);
    assert_eq!(parse(Path::new(FILE), &inline).unwrap(), seed);
}

#[test]
fn toml_syntax_error_is_located() {
    let text = one(&seed_with_line(3, "version = \"0.1.0"), 3, 17, None);
    assert!(text.contains("invalid TOML"), "{text}");
}

#[test]
fn unknown_top_level_field_suggests_the_nearest() {
    let text = one(
        &seed_with_line(7, "capabilites = [\"codegen\"]"),
        7,
        1,
        Some("capabilites"),
    );
    assert!(text.contains("unknown field"), "{text}");
    assert!(text.contains("(did you mean `capabilities`?)"), "{text}");
}

#[test]
fn unknown_dotted_field_suggests_the_nearest() {
    let text = one(
        &seed_with_line(11, "resources.memory = \"512Mi\""),
        11,
        11,
        Some("resources.memory"),
    );
    assert!(text.contains("(did you mean `resources.mem`?)"), "{text}");
    let text = one(
        &seed_with_line(13, "ui.hint = [\"diff\"]"),
        13,
        4,
        Some("ui.hint"),
    );
    assert!(text.contains("(did you mean `ui.hints`?)"), "{text}");
}

#[test]
fn unsupported_schema_version_lists_the_supported_ones() {
    let text = one(
        &seed_with_line(1, "schema_version = \"0.9\""),
        1,
        18,
        Some("schema_version"),
    );
    assert!(
        text.contains("unsupported schema version \"0.9\""),
        "{text}"
    );
    assert!(text.contains("this build supports \"0.1\""), "{text}");
}

#[test]
fn missing_schema_version_points_to_migrate() {
    let src = SEED.replacen("schema_version = \"0.1\"\n", "", 1);
    let text = one(&src, 1, 1, Some("schema_version"));
    assert!(text.contains("missing required field"), "{text}");
    assert!(text.contains("metash agents migrate"), "{text}");
}

#[test]
fn missing_required_fields_are_each_reported() {
    let errs = errors("schema_version = \"0.1\"\n");
    let fields: Vec<_> = errs.iter().filter_map(|d| d.field.clone()).collect();
    assert_eq!(fields, ["name", "version", "entry", "sandbox"]);
}

#[test]
fn wrong_type_says_what_was_expected_and_found() {
    let text = one(&seed_with_line(2, "name = 5"), 2, 8, Some("name"));
    assert!(
        text.contains("expected a string, found an integer"),
        "{text}"
    );
    let text = one(&seed_with_line(2, "name = \"  \""), 2, 8, Some("name"));
    assert!(text.contains("expected a non-empty string"), "{text}");
}

#[test]
fn bad_version() {
    let text = one(
        &seed_with_line(3, "version = \"1.0\""),
        3,
        11,
        Some("version"),
    );
    assert!(
        text.contains("expected a semantic version such as \"0.1.0\", found \"1.0\""),
        "{text}"
    );
}

#[test]
fn bad_sandbox() {
    let text = one(
        &seed_with_line(5, "sandbox = \"wsam\""),
        5,
        11,
        Some("sandbox"),
    );
    assert!(
        text.contains("expected \"wasm\" or \"native\", found \"wsam\""),
        "{text}"
    );
    assert!(text.contains("did you mean `wasm`"), "{text}");
}

#[test]
fn bad_capability_points_at_the_element() {
    let text = one(
        &seed_with_line(7, "capabilities = [\"codegen\", \"netwrok\"]"),
        7,
        28,
        Some("capabilities[1]"),
    );
    assert!(
        text.contains("unknown capability category `netwrok` (did you mean `network`?)"),
        "{text}"
    );
    let text = one(
        &seed_with_line(7, "capabilities = [\"network:not a host\"]"),
        7,
        17,
        Some("capabilities[0]"),
    );
    assert!(text.contains("expected a host"), "{text}");
    let text = one(
        &seed_with_line(7, "capabilities = \"network\""),
        7,
        16,
        Some("capabilities"),
    );
    assert!(
        text.contains("expected an array of strings, found a string"),
        "{text}"
    );
}

#[test]
fn scoped_capabilities_are_accepted() {
    let src = seed_with_line(
        7,
        "capabilities = [\"network:api.github.com\", \"network:*.example.com\", \"files.write:docs/\", \"process.spawn:git\", \"oauth:github.repo\", \"memory\"]",
    );
    let m = parse(Path::new(FILE), &src).unwrap();
    assert_eq!(m.capabilities.len(), 6);
}

#[test]
fn bad_oauth_scope() {
    let text = one(
        &seed_with_line(8, "oauth_scopes = [\"github\"]"),
        8,
        17,
        Some("oauth_scopes[0]"),
    );
    assert!(text.contains("expected `PROVIDER:SCOPE`"), "{text}");
}

#[test]
fn bad_cpu_and_mem_quantities() {
    let text = one(
        &seed_with_line(10, "resources.cpu = \"lots\""),
        10,
        17,
        Some("resources.cpu"),
    );
    assert!(
        text.contains("expected a CPU quantity such as \"500m\""),
        "{text}"
    );
    let text = one(
        &seed_with_line(11, "resources.mem = \"512MB\""),
        11,
        17,
        Some("resources.mem"),
    );
    assert!(
        text.contains("expected a memory quantity such as \"512Mi\""),
        "{text}"
    );
    let text = one(
        &seed_with_line(11, "resources.mem = 512"),
        11,
        17,
        Some("resources.mem"),
    );
    assert!(
        text.contains("expected a string, found an integer"),
        "{text}"
    );
    for ok in ["2", "0.5", "1500m"] {
        parse(
            Path::new(FILE),
            &seed_with_line(10, &format!("resources.cpu = \"{ok}\"")),
        )
        .unwrap();
    }
    for ok in ["1Gi", "1000000", "64M"] {
        parse(
            Path::new(FILE),
            &seed_with_line(11, &format!("resources.mem = \"{ok}\"")),
        )
        .unwrap();
    }
}

#[test]
fn resources_must_be_a_table() {
    let src = SEED.replace(
        "resources.cpu = \"500m\"\nresources.mem = \"512Mi\"\n",
        "resources = \"big\"\n",
    );
    let text = one(&src, 10, 13, Some("resources"));
    assert!(text.contains("expected a table, found a string"), "{text}");
}

#[test]
fn ui_hints_must_be_strings() {
    let text = one(
        &seed_with_line(13, "ui.hints = [\"diff\", 3]"),
        13,
        21,
        Some("ui.hints[1]"),
    );
    assert!(
        text.contains("expected a string, found an integer"),
        "{text}"
    );
}

#[test]
fn all_errors_come_in_one_pass_in_file_order() {
    let src = "schema_version = \"0.1\"\nname = \"x\"\nversion = \"1\"\nentry = \"a\"\nsandbox = \"vm\"\nfoo = 1\n";
    let errs = errors(src);
    let places: Vec<_> = errs
        .iter()
        .map(|d| (d.line, d.field.clone().unwrap_or_default()))
        .collect();
    assert_eq!(
        places,
        [
            (3, "version".to_string()),
            (5, "sandbox".to_string()),
            (6, "foo".to_string())
        ]
    );
}

/// A manifest declaring 10,000 capabilities (valid or not) is one clear error, not 10,000, and
/// never a panic or a consent prompt listing them all.
#[test]
fn ten_thousand_capabilities_are_one_clear_error() {
    for entry in ["network:h{i}.example.com", "bogus{i}"] {
        let list: Vec<String> = (0..10_000)
            .map(|i| format!("\"{}\"", entry.replace("{i}", &i.to_string())))
            .collect();
        let src = seed_with_line(7, &format!("capabilities = [{}]", list.join(", ")));
        let text = one(&src, 7, 16, Some("capabilities"));
        assert!(
            text.contains("holds 10000 entries; a manifest may declare at most 256"),
            "{text}"
        );
    }
    let at_limit: Vec<String> = (0..256).map(|i| format!("\"network:h{i}.io\"")).collect();
    let src = seed_with_line(7, &format!("capabilities = [{}]", at_limit.join(", ")));
    assert_eq!(
        parse(Path::new(FILE), &src).unwrap().capabilities.len(),
        256
    );
}
