//! Property tests for the SSE parser: no input panics it, and how the bytes are cut into chunks
//! never changes the events (the network decides the cuts, not the server).

use metash_harness::api::sse::{SseEvent, SseParser};
use proptest::prelude::*;

fn events(chunks: &[&[u8]]) -> Vec<SseEvent> {
    let mut parser = SseParser::new();
    let mut out = Vec::new();
    for chunk in chunks {
        parser.feed(chunk, &mut |e| out.push(e));
    }
    out
}

/// `bytes` cut at the given points (taken modulo its length, in order).
fn cut<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.sort_unstable();
    let mut out = Vec::new();
    let mut start = 0;
    for p in points {
        out.push(&bytes[start..p]);
        start = p;
    }
    out.push(&bytes[start..]);
    out
}

/// A stream of SSE-shaped lines with mixed line ends, as servers send them (and worse).
fn stream() -> impl Strategy<Value = Vec<u8>> {
    let line = prop::sample::select(vec![
        "data: {\"type\":\"x\"}",
        "data:",
        "data: two\u{e9} lines",
        "event: content_block_delta",
        "event:",
        "id: 7",
        "retry: 250",
        "retry: NaN",
        ": keep-alive",
        "",
        "field without colon",
    ]);
    let end = prop::sample::select(vec!["\n", "\r\n", "\r"]);
    prop::collection::vec((line, end), 0..24).prop_map(|lines| {
        lines
            .into_iter()
            .flat_map(|(l, e)| format!("{l}{e}").into_bytes())
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn chunking_never_changes_the_events(
        bytes in stream(),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let whole = events(&[&bytes]);
        prop_assert_eq!(events(&cut(&bytes, &cuts)), whole);
    }

    #[test]
    fn any_bytes_in_any_chunks_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..600),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let whole = events(&[&bytes]);
        prop_assert_eq!(events(&cut(&bytes, &cuts)), whole);
    }
}
