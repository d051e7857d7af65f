//! The manifest parser, the migration and the capability grammar must never panic, whatever the
//! bytes; every diagnostic must point inside the input.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Err(d) = metash_policy::manifest::parse(Path::new("m.toml"), s) {
        for e in &d.0 {
            assert!(e.line >= 1 && e.column >= 1 && e.line <= s.lines().count() + 1);
        }
    }
    let _ = metash_policy::migrate::migrate(Path::new("m.toml"), s);
    let _ = s.parse::<metash_policy::Capability>();
    let _ = metash_policy::Redactor::new(b"fuzz").redact_str(s);
});
