//! One Rust agent, two sandboxes: `metash-agent`'s `echo` example built for wasm32-wasip1 and for
//! the host (by this test, with the cargo that runs it) and run under both sandboxes. Skips, saying why, when the
//! wasm32-wasip1 target is not installed.

use super::common::*;
use metash_protocol::LogKind;

#[test]
fn rust_sdk_agent_runs_as_wasm() {
    let wasm = match build_example("echo", Some("wasm32-wasip1")) {
        Ok(p) => p,
        Err(why) => {
            metash_testkit::skip("rust_sdk_agent_runs_as_wasm", &why);
            return;
        }
    };
    let f = Fixture::new();
    let mut spec = f.wasm("rs-echo", "", &["files.read"], None);
    spec.entry = wasm;
    let mut a = f.start(spec);
    let (o, ev) = run(&mut a, "hello");
    assert_eq!(
        o.status.agent_status(),
        metash_protocol::AgentStatus::Success,
        "{o:?}"
    );
    assert_eq!(
        text(&ev),
        "echo: hello (workspace says \"hello from inside\")"
    );
    let states: Vec<_> = f
        .events("rs-echo", LogKind::AgentEvent)
        .into_iter()
        .filter(|e| e.data["type"] == "state_update")
        .collect();
    assert_eq!(states[0].data["value"], "hello");
    // The same source built natively, under the native sandbox, gives the same answer.
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("native half of rust_sdk_agent_runs_as_wasm", &why);
        return;
    }
    let native = build_example("echo", None).unwrap();
    let mut spec = f.native("rs-echo-n", &["files.read"], None);
    spec.entry = native;
    let mut n = f.start(spec);
    let (_, ev) = run(&mut n, "hello");
    assert_eq!(
        text(&ev),
        "echo: hello (workspace says \"hello from inside\")"
    );
    n.shutdown().unwrap();
}
