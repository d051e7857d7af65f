//! Property tests: the session and log-line parsers never panic on any bytes, a bad session file
//! is named in its error, and a log line's hash catches any change to the line.

use std::path::Path;
use std::sync::OnceLock;

use metash_store::{log, session, Store};
use metash_testkit::mutate;
use proptest::prelude::*;

/// A real `session.json` and a real log line (its trailing newline cut), made once.
fn fixture() -> &'static (Vec<u8>, Vec<u8>) {
    static FIXTURE: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::init(dir.path(), Some("# props\n")).unwrap();
        store
            .update_state("variables.n", serde_json::json!({"deep": [1, "two", null]}))
            .unwrap();
        let meta = dir.path().join(".meta");
        let session = std::fs::read(meta.join("session.json")).unwrap();
        let events = std::fs::read(meta.join("events.jsonl")).unwrap();
        let line = events
            .split(|b| *b == b'\n')
            .rfind(|l| !l.is_empty())
            .unwrap()
            .to_vec();
        (session, line)
    })
}

fn edits() -> impl Strategy<Value = Vec<(usize, u8, u8)>> {
    let byte = prop::sample::select(b"\"{}[],:0123456789aez -.\\\n\x00\xff".to_vec());
    prop::collection::vec((any::<usize>(), any::<u8>(), byte), 1..6)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn parsers_never_panic_on_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let path = Path::new("/p/.meta/session.json");
        if let Err(e) = session::parse(path, &bytes) {
            prop_assert!(e.to_string().contains("session.json"), "{e}");
        }
        let _ = log::decode(&bytes);
    }

    #[test]
    fn a_mutated_session_is_loaded_or_refused_by_name(edits in edits()) {
        let bytes = mutate(&fixture().0, &edits);
        let path = Path::new("/p/.meta/session.json");
        if let Err(e) = session::parse(path, &bytes) {
            prop_assert!(e.to_string().contains("session.json"), "{e}");
        }
    }

    #[test]
    fn any_change_to_a_log_line_is_caught(edits in edits()) {
        let line = &fixture().1;
        prop_assert!(log::decode(line).is_ok());
        let changed = mutate(line, &edits);
        if &changed != line {
            prop_assert!(log::decode(&changed).is_err(), "{}", String::from_utf8_lossy(&changed));
        }
    }
}
