//! The host answers an agent mid-invocation on its stdin (`Replier`), in both sandboxes: the reply
//! reaches the agent while it runs, and an agent waiting for an answer that never comes is still
//! ended by its deadline.

use std::time::{Duration, Instant};

use metash_protocol::LogKind;

use metash_protocol::AgentEvent;
use metash_runtime::InvocationStatus;

use super::common::{line, native_unavailable, text, wat_bytes, Fixture};

/// A WASI p1 module that sends a `consent_request`, reads stdin byte by byte until the third line
/// (after `start` and `input`: the host's answer), writes that line back verbatim (it is itself a
/// protocol message), then `done`.
fn wat_asks_and_echoes_the_answer() -> String {
    let ask = line(
        r#"{"schema_version":"0.1","type":"consent_request","capability":"network:api.example.com","reason":"fetch","duration_s":60}"#,
    );
    let done = line(r#"{"schema_version":"0.1","type":"done"}"#);
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 1024) "{ask_b}")
  (data (i32.const 4096) "{done_b}")
  (func $emit (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
  (func (export "_start")
    (local $pos i32) (local $nl i32) (local $start i32)
    (call $emit (i32.const 1024) (i32.const {ask_len}))
    (local.set $pos (i32.const 65536))
    (block $out
      (loop $rd
        (i32.store (i32.const 16) (local.get $pos))
        (i32.store (i32.const 20) (i32.const 1))
        (drop (call $fd_read (i32.const 0) (i32.const 16) (i32.const 1) (i32.const 24)))
        (br_if $out (i32.eqz (i32.load (i32.const 24))))
        (if (i32.eq (i32.load8_u (local.get $pos)) (i32.const 10))
          (then
            (local.set $nl (i32.add (local.get $nl) (i32.const 1)))
            (if (i32.eq (local.get $nl) (i32.const 2))
              (then (local.set $start (i32.add (local.get $pos) (i32.const 1)))))
            (if (i32.eq (local.get $nl) (i32.const 3))
              (then
                (call $emit (local.get $start)
                  (i32.sub (i32.add (local.get $pos) (i32.const 1)) (local.get $start)))
                (br $out)))))
        (local.set $pos (i32.add (local.get $pos) (i32.const 1)))
        (br $rd)))
    (call $emit (i32.const 4096) (i32.const {done_len}))))
"#,
        ask_b = wat_bytes(&ask),
        ask_len = ask.len(),
        done_b = wat_bytes(&done),
        done_len = done.len(),
    )
}

fn grant() -> AgentEvent {
    AgentEvent::ConsentGrant {
        capability: "network:api.example.com".into(),
        expires_at: Some("2030-01-01T00:00:00Z".into()),
    }
}

#[test]
fn a_wasm_agent_gets_the_answer_to_its_request_mid_run() {
    let f = Fixture::new();
    let mut a = f.start(f.wasm("asker", &wat_asks_and_echoes_the_answer(), &[], None));
    let replier = a.replier();
    let mut seen = Vec::new();
    let outcome = a
        .invoke("go", &[], &mut |e| {
            if let AgentEvent::ConsentRequest { capability, .. } = e {
                assert_eq!(capability, "network:api.example.com");
                assert!(replier.send(grant()), "the reply was not accepted");
            }
            seen.push(e.clone());
        })
        .unwrap();
    assert!(
        matches!(outcome.status, InvocationStatus::Done { .. }),
        "{outcome:?}"
    );
    // The guest read our answer from its stdin and wrote it back. An agent may not send a
    // `consent_grant` itself, so the echo arrives as a protocol violation carrying our answer, and
    // never as an event for the host to act on.
    assert!(!seen.contains(&grant()), "{seen:?}");
    let echoed = f.sink.of_kind(LogKind::ProtocolViolation);
    assert_eq!(echoed.len(), 1, "{echoed:?}");
    assert_eq!(
        echoed[0].data["event"],
        serde_json::to_value(grant()).unwrap()
    );
    // After the invocation the stdin is gone: nothing more can be written to that instance.
    assert!(!replier.attached());
    assert!(!replier.send(grant()));
}

#[test]
fn a_wasm_agent_waiting_for_an_answer_is_still_ended_by_its_deadline() {
    let f = Fixture::new();
    let mut spec = f.wasm("waiter", &wat_asks_and_echoes_the_answer(), &[], None);
    spec.timeout = Duration::from_millis(400);
    let mut a = f.start(spec);
    let t = Instant::now();
    // Never answer.
    let outcome = a.invoke("go", &[], &mut |_| {}).unwrap();
    assert_eq!(outcome.status, InvocationStatus::Timeout, "{outcome:?}");
    assert!(
        t.elapsed() < Duration::from_millis(400 + 750),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn a_native_agent_gets_the_answer_to_its_request_mid_run() {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip(
            "a_native_agent_gets_the_answer_to_its_request_mid_run",
            &why,
        );
        return;
    }
    let f = Fixture::new();
    let mut a = f.start(f.native("asker-n", &[], None));
    let replier = a.replier();
    let mut events = Vec::new();
    a.invoke("consent network:api.example.com", &[], &mut |e| {
        if let AgentEvent::ConsentRequest { .. } = e {
            assert!(replier.send(grant()));
        }
        events.push(e.clone());
    })
    .unwrap();
    assert_eq!(text(&events), "granted 2030-01-01T00:00:00Z");
    a.shutdown().unwrap();
    assert!(!replier.attached());
}
