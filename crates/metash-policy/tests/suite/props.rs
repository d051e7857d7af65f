//! Property tests: the parsers never panic, whatever the input.

use std::path::Path;

use metash_policy::manifest::parse;
use metash_policy::migrate::migrate;
use metash_policy::{Capability, Redactor};
use proptest::prelude::*;

use super::common::SEED;

fn mutate(src: &str, edits: &[(usize, u8, u8)]) -> String {
    String::from_utf8_lossy(&metash_testkit::mutate(src.as_bytes(), edits)).into_owned()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn manifest_parser_never_panics_on_any_string(s in any::<String>()) {
        let _ = parse(Path::new("m.toml"), &s);
        let _ = migrate(Path::new("m.toml"), &s);
    }

    #[test]
    fn manifest_parser_never_panics_on_mutated_manifests(
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), prop::sample::select(b"\"'=[]{}.,#\n :0aZ\\\x00\xff".to_vec())), 1..8)
    ) {
        let src = mutate(SEED, &edits);
        if let Err(d) = parse(Path::new("m.toml"), &src) {
            for e in &d.0 {
                prop_assert!(e.line >= 1 && e.column >= 1);
                prop_assert!(e.line <= src.lines().count() + 1);
            }
        }
        let _ = migrate(Path::new("m.toml"), &src);
    }

    #[test]
    fn capability_parser_never_panics_and_round_trips(s in "[a-z.:*/_-]{0,30}") {
        if let Ok(c) = s.parse::<Capability>() {
            let again: Capability = c.to_string().parse().unwrap();
            prop_assert_eq!(again, c);
        }
    }

    #[test]
    fn redaction_never_panics_and_removes_planted_keys(prefix in ".{0,40}", suffix in ".{0,40}") {
        let r = Redactor::new(b"salt");
        let key = "sk-ant-api03-AbCdEfGhIjKlMnOp";
        let text = format!("{prefix} {key} {suffix}");
        let out = r.redact_str(&text);
        prop_assert!(!out.contains(key));
    }
}
