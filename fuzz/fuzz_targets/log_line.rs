//! One line of `.meta/events.jsonl`: decoded (its own hash checked) or refused; never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = metash_store::log::decode(data);
});
