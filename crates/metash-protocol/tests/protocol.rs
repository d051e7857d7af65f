#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The wire types against the seeds' own examples, and the checked-in schemas against the code.

use std::path::PathBuf;

use metash_protocol::*;
use serde_json::{json, Value};

fn schemas_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../schemas")
}

/// The files in `schemas/` must be exactly what the code generates. Run with
/// `UPDATE_SCHEMAS=1` to rewrite them after an intended change.
#[test]
fn checked_in_schemas_match_the_code() {
    let update = std::env::var_os("UPDATE_SCHEMAS").is_some();
    let mut drift = Vec::new();
    for name in schema::NAMES {
        let generated = schema::schema_json(name).unwrap();
        let path = schemas_dir().join(format!("{name}.json"));
        if update {
            std::fs::write(&path, &generated).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(on_disk) if on_disk == generated => {}
            Ok(_) => drift.push(format!("{name}: differs")),
            Err(_) => drift.push(format!("{name}: missing")),
        }
    }
    assert!(
        drift.is_empty(),
        "schemas/ out of date (run UPDATE_SCHEMAS=1 cargo test -p metash-protocol): {drift:?}"
    );
    // And nothing stale lies beside them.
    for entry in std::fs::read_dir(schemas_dir()).unwrap() {
        let file = entry.unwrap().file_name().to_string_lossy().into_owned();
        let name = file.trim_end_matches(".json");
        assert!(schema::NAMES.contains(&name), "schemas/{file} has no type");
    }
}

#[test]
fn unknown_schema_name_is_none() {
    assert!(schema::schema("no-such-type").is_none());
}

/// Seed 001's runtime snapshot, plus the fields the store adds, round-trips unchanged.
#[test]
fn seed_session_example_round_trips() {
    let mut seed: Value = serde_json::from_str(metash_testkit::SEED_SESSION).unwrap();
    seed["schema_version"] = json!(1);
    seed["revision"] = json!(7);
    let state: SessionState = serde_json::from_value(seed.clone()).unwrap();
    assert_eq!(state.status, SessionStatus::Executing);
    let plan = state.plan.as_ref().unwrap();
    assert_eq!(plan.tasks[2].commits, None, "absent commits stay absent");
    assert_eq!(plan.tasks[1].commits, Some(vec![]));
    assert_eq!(serde_json::to_value(&state).unwrap(), seed);
}

#[test]
fn session_rejects_unknown_status_and_fields() {
    let mut v = serde_json::to_value(SessionState::new("s")).unwrap();
    v["status"] = json!("paused");
    let err = serde_json::from_value::<SessionState>(v.clone()).unwrap_err();
    assert!(err.to_string().contains("paused"), "{err}");
    v["status"] = json!("planning");
    v["extra"] = json!(1);
    assert!(serde_json::from_value::<SessionState>(v).is_err());
}

/// Seed 000's checkpoint JSON, and the `human_verify` reason.
#[test]
fn checkpoint_signal_matches_seed() {
    let seed = json!({
      "type": "checkpoint",
      "reason": "decision_required",
      "message": "Which auth provider?",
      "options": ["Auth0", "Supabase"],
      "resume_id": "step_2_auth_decision"
    });
    let cp: CheckpointSignal = serde_json::from_value(seed.clone()).unwrap();
    assert_eq!(cp.reason, CheckpointReason::DecisionRequired);
    assert_eq!(serde_json::to_value(&cp).unwrap(), seed);
    let verify: CheckpointSignal = serde_json::from_value(
        json!({"type": "checkpoint", "reason": "human_verify", "message": "Looks right?"}),
    )
    .unwrap();
    assert!(verify.options.is_empty() && verify.resume_id.is_none());
    assert!(serde_json::from_value::<CheckpointSignal>(
        json!({"type": "pause", "reason": "human_action", "message": "x"})
    )
    .is_err());
}

#[test]
fn agent_response_uses_seed_names() {
    let r = AgentResponse {
        status: AgentStatus::Timeout,
        data: "partial".into(),
        metadata: ResponseMetadata {
            tokens_used: 12,
            duration_ms: 3400,
        },
    };
    assert_eq!(
        serde_json::to_value(&r).unwrap(),
        json!({"status": "timeout", "data": "partial", "metadata": {"tokens_used": 12, "duration_ms": 3400}})
    );
}

/// Seed 002 events carry `schema_version` and use snake_case; the seed 003 envelope camelCase.
#[test]
fn events_inside_the_envelope() {
    let msg = ProtocolMessage::new(AgentEvent::Output {
        agent_id: "a".into(),
        chunk_id: "c1".into(),
        content_type: "text/plain".into(),
        data: "hi".into(),
    });
    let v = serde_json::to_value(&msg).unwrap();
    assert_eq!(v["schema_version"], "0.1");
    assert_eq!(v["type"], "output");
    assert_eq!(v["chunk_id"], "c1");
    let env = EventEnvelope {
        ts: "2026-11-22T00:00:00Z".into(),
        seq: 3,
        cp_session_id: "cp".into(),
        run_id: "r".into(),
        continuation: Some(HarnessContinuationRef {
            provider: ProviderDomain::Anthropic,
            key: Some("k".into()),
        }),
        payload: Some(msg.event.clone()),
    };
    let v: Value = serde_json::to_value(&env).unwrap();
    assert_eq!(v["cpSessionId"], "cp");
    assert_eq!(v["runId"], "r");
    assert_eq!(v["continuation"]["provider"], "anthropic");
    assert_eq!(v["payload"]["type"], "output");
    let back: EventEnvelope = serde_json::from_value(v).unwrap();
    assert_eq!(back, env);
}

#[test]
fn frontends_are_typed_by_provider() {
    use HarnessFrontend::*;
    assert_eq!(AgentSdk.provider(), ProviderDomain::Anthropic);
    assert_eq!(ClaudeCode.provider(), ProviderDomain::Anthropic);
    assert_eq!(PiSdk.provider(), ProviderDomain::Openai);
    assert_eq!(CodexCli.provider(), ProviderDomain::Openai);
    assert_eq!(serde_json::to_value(CodexCli).unwrap(), json!("codex-cli"));
    assert_eq!(
        serde_json::to_value(InteractionMode::NonInteractive).unwrap(),
        json!("nonInteractive")
    );
}

#[test]
fn log_kinds_are_one_closed_set_that_still_reads_newer_logs() {
    use metash_protocol::LogKind;
    let mut seen = std::collections::BTreeSet::new();
    for k in LogKind::KNOWN {
        let json = serde_json::to_string(k).unwrap();
        assert_eq!(json, format!("\"{}\"", k.as_str()));
        assert_eq!(&serde_json::from_str::<LogKind>(&json).unwrap(), k);
        assert!(seen.insert(k.as_str()), "{} listed twice", k.as_str());
        assert!(k
            .as_str()
            .chars()
            .all(|c| c.is_ascii_lowercase() || c == '_'));
    }
    // A kind written by a newer metash is kept verbatim (the hash chain covers its bytes).
    let newer: LogKind = serde_json::from_str("\"vault_unsealed\"").unwrap();
    assert_eq!(newer, LogKind::Unknown("vault_unsealed".into()));
    assert_eq!(serde_json::to_string(&newer).unwrap(), "\"vault_unsealed\"");
    assert!(serde_json::from_str::<LogKind>("42").is_err());
}

/// Seed 001's example exactly as the seed prints it (no `schema_version`, no `revision`) is a
/// valid session: version 1, revision 0.
#[test]
fn seed_session_example_without_version_loads() {
    let seed: Value = serde_json::from_str(metash_testkit::SEED_SESSION).unwrap();
    let state: SessionState = serde_json::from_value(seed).unwrap();
    assert_eq!(
        state.schema_version,
        metash_protocol::SESSION_SCHEMA_VERSION
    );
    assert_eq!(state.revision, 0);
    let written = serde_json::to_value(&state).unwrap();
    assert_eq!(
        written["schema_version"], 1,
        "the next write says its version"
    );
}
