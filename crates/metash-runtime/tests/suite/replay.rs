//! Replay at the credential proxy (issue 36, first step): a turn recorded through the proxy is
//! answered again from its recording with no upstream and no credential, byte for byte as the
//! agent first saw it (the key masked); a request that differs stops the replay there, naming it.

use std::sync::{Arc, Mutex};

use metash_runtime::credential::{
    AuthStyle, Cassette, CredentialProxy, Mount, ProxyConfig, Recorded, Route, StaticSource,
};
use metash_runtime::MemorySink;

use super::record::{exchange, proxy, recorded_after, PLACEHOLDER, REAL};

/// A proxy answering from `cassette`, its upstream a port nobody listens on, no credential.
fn replaying(cassette: Arc<Cassette>) -> CredentialProxy {
    let mut config = ProxyConfig::new(vec![Route {
        id: "model".into(),
        mount: Mount::WholePort,
        upstream: "http://127.0.0.1:9".into(),
        auth: AuthStyle::XApiKey,
    }]);
    config.replay = Some(cassette);
    config.redact = vec![PLACEHOLDER.into()];
    CredentialProxy::start(
        config,
        Arc::new(StaticSource::new()),
        Arc::new(MemorySink::new()),
    )
    .expect("replay proxy starts")
}

/// The status and the (de-chunked) body of a raw HTTP/1.1 answer.
fn status_and_body(raw: &str) -> (u16, String) {
    let (head, rest) = raw.split_once("\r\n\r\n").expect("a head");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return (status, rest.to_string());
    }
    let (mut body, mut rest) = (String::new(), rest);
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).expect("chunk size");
        if n == 0 {
            break;
        }
        body.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    (status, body)
}

fn record_two_turns() -> (Vec<Recorded>, Vec<String>, Vec<String>) {
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let live = proxy(Arc::clone(&recorded));
    let requests: Vec<String> = (0..2)
        .map(|i| format!("{{\"turn\":{i},\"key\":\"{PLACEHOLDER}\"}}"))
        .collect();
    let answers = requests
        .iter()
        .map(|r| status_and_body(&exchange(&live, r)).1)
        .collect();
    let tape = recorded_after(&recorded, 2)
        .into_iter()
        .map(Recorded::from)
        .collect();
    (tape, requests, answers)
}

#[test]
fn a_recorded_turn_is_replayed_offline_as_the_agent_saw_it() {
    let (tape, requests, live) = record_two_turns();
    let cassette = Arc::new(Cassette::new(tape));
    let replay = replaying(Arc::clone(&cassette));
    for (req, live) in requests.iter().zip(&live) {
        let (status, body) = status_and_body(&exchange(&replay, req));
        assert_eq!(status, 200, "{body}");
        // The same answer, the key the upstream echoed masked as it was recorded.
        assert!(live.contains(REAL), "{live}");
        assert_eq!(body, live.replace(REAL, &"*".repeat(REAL.len())));
    }
    assert!(cassette.finished());
    assert_eq!(cassette.served(), 2);
}

#[test]
fn a_changed_request_stops_the_replay_naming_it() {
    let (tape, requests, _) = record_two_turns();
    let cassette = Arc::new(Cassette::new(tape));
    let replay = replaying(Arc::clone(&cassette));
    assert_eq!(status_and_body(&exchange(&replay, &requests[0])).0, 200);
    let changed = requests[1].replace("\"turn\":1", "\"turn\":7");
    let (status, body) = status_and_body(&exchange(&replay, &changed));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("replay stopped at request 2"), "{body}");
    assert!(body.contains("differs at byte 8"), "{body}");
    let d = cassette.divergence().expect("a divergence");
    assert_eq!(d.seq, 2);
    let expected = d.expected.expect("the recorded request");
    assert!(String::from_utf8_lossy(&expected.2).contains("\"turn\":1"));
    assert!(String::from_utf8_lossy(&d.got.2).contains("\"turn\":7"));
    // Stopped: even the recorded request is refused now.
    assert_eq!(status_and_body(&exchange(&replay, &requests[1])).0, 400);
    assert!(!cassette.finished());
}
