//! An agent's `manifest.toml`: parsed, or refused with diagnostics that point inside the file.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = std::path::Path::new("/a/manifest.toml");
    if let Err(d) = metash_policy::manifest::parse(path, text) {
        for e in &d.0 {
            assert!(e.line >= 1 && e.column >= 1);
        }
    }
    let _ = metash_policy::migrate::migrate(path, text);
});
