//! The agent protocol end to end: versions, checkpoints, chunk reassembly.

use metash_protocol::AgentStatus;
use metash_protocol::LogKind;
use metash_runtime::InvocationStatus;

use super::common::*;

#[test]
fn unsupported_version_from_agent_is_a_clear_error() {
    let f = Fixture::new();
    let wat = wat_module("", "(call $bad_version) (call $ok) (call $done)", "");
    let mut a = f.start(f.wasm("p-ver", &wat, &[], None));
    let (o, ev) = run(&mut a, "go");
    assert_eq!(text(&ev), "OK");
    assert_eq!(o.protocol_errors, 1);
    let errs = f.events("p-ver", LogKind::ProtocolError);
    assert_eq!(errs[0].data["code"], "unsupported_version");
    assert!(errs[0].data["message"].as_str().unwrap().contains("9.9"));
}

#[test]
fn native_checkpoint_ends_the_invocation() {
    require_native!();
    let f = Fixture::new();
    let mut a = f.start(f.native("p-cp", &[], None));
    let (o, _) = run(&mut a, "checkpoint");
    let InvocationStatus::Checkpoint { signal } = &o.status else {
        panic!("{o:?}")
    };
    assert_eq!(signal.options, ["a", "b"]);
    assert_eq!(o.status.agent_status(), AgentStatus::Checkpoint);
    // Still usable afterwards.
    assert_eq!(text(&run(&mut a, "echo after").1), "after");
}

#[test]
fn native_large_output_is_chunked_and_reassembled() {
    require_native!();
    let f = Fixture::new();
    let mut a = f.start(f.native("p-chunk", &[], None));
    let big = "y".repeat(100_000);
    let mut asm = metash_runtime::ChunkAssembler::new();
    let o = a
        .invoke(&format!("echo {big}"), &[], &mut |e| asm.push(e).unwrap())
        .unwrap();
    assert_eq!(o.status.agent_status(), AgentStatus::Success);
    let cards = asm.finish();
    assert_eq!(cards.len(), 1);
    assert_eq!(cards[0].data, big);
    assert!(cards[0].chunks >= 7);
}

#[test]
fn output_cap_is_a_visible_limit() {
    require_native!();
    let f = Fixture::new();
    let mut spec = f.native("p-cap", &[], None);
    spec.output_cap = 64 * 1024;
    let mut a = f.start(spec);
    let (o, _) = run(&mut a, "flood 5");
    assert_eq!(
        o.status,
        InvocationStatus::LimitExceeded {
            limit: "output_bytes".into()
        }
    );
    assert!(f
        .events("p-cap", LogKind::LimitExceeded)
        .iter()
        .any(|e| e.data["limit"] == "output_bytes"));
}
