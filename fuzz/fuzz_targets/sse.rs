//! A model server's event stream: any bytes, cut anywhere, give the same events as uncut, and
//! never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use metash_harness::api::sse::{SseEvent, SseParser};

fn events(chunks: &[&[u8]]) -> Vec<SseEvent> {
    let mut parser = SseParser::new();
    let mut out = Vec::new();
    for c in chunks {
        parser.feed(c, &mut |e| out.push(e));
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, bytes)) = data.split_first() else {
        return;
    };
    let at = usize::from(cut) % (bytes.len() + 1);
    let (a, b) = bytes.split_at(at);
    assert_eq!(events(&[a, b]), events(&[bytes]));
});
