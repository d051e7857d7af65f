//! `.meta/config.toml`: the host's and the orchestrator's readers, and `metash migrate`'s edit.
//! Each reads the file or refuses it naming the file; the migrated text still parses.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = std::path::Path::new("/w/.meta/config.toml");
    if let Err(e) = metash_host::config::HostConfig::parse(text, path) {
        assert!(e.to_string().contains("config.toml"), "{e}");
    }
    if let Err(e) = metash_orchestrator::config::OrchestratorConfig::parse(text, path) {
        assert!(e.to_string().contains("config.toml"), "{e}");
    }
    if let Ok(m) = metash_policy::migrate::add_version_key(path, text, "schema_version = 1", "v") {
        assert!(m.output.parse::<toml_edit::DocumentMut>().is_ok());
    }
});
