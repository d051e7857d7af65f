//! `.meta/session.json` as a user or a crash may leave it: any bytes parse or are refused, naming
//! the file; never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::path::Path::new("/p/.meta/session.json");
    if let Err(e) = metash_store::session::parse(path, data) {
        assert!(e.to_string().contains("session.json"));
    }
});
