use std::time::{Duration, Instant};

use metash_host::{Host, HostOptions, SpawnRequest, Spawner};
use metash_protocol::{AgentStatus, SpawnOptions};

use super::common::Project;
use super::provider::{Provider, Reply};

fn role_project(provider: &Provider, extra: &str) -> Project {
    let p = Project::new();
    p.config(&format!(
        "[roles.writer]\nfrontend = \"anthropic-api\"\nmodel_fast = \"fast-model\"\nmodel_smart = \"smart-model\"\n\
         base_url = \"{}\"\napi_key_env = \"METASH_TEST_KEY\"\nmax_tokens = 64\n{extra}",
        provider.base_url
    ));
    p
}

fn host(p: &Project) -> Host {
    Host::open(
        p.path(),
        HostOptions::silent().with_env("METASH_TEST_KEY", "sk-test-123"),
    )
    .unwrap()
}

fn spawn(h: &Host, msg: &str, opts: SpawnOptions) -> metash_protocol::AgentResponse {
    let mut req = SpawnRequest::new("writer", "You write haiku.", msg);
    req.options = opts;
    h.spawn_agent(&req).unwrap()
}

/// Success with measured tokens, and isolation: each spawn is a fresh conversation holding only its
/// own system prompt and message, never an earlier spawn's.
#[test]
fn model_role_success_is_isolated_and_measured() {
    let provider = Provider::start(vec![
        Reply::text("first answer"),
        Reply::text("second answer"),
    ]);
    let p = role_project(&provider, "");
    let h = host(&p);
    let r = spawn(
        &h,
        "orchestrator secret plan: step one",
        SpawnOptions::default(),
    );
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert_eq!(r.data, "first answer");
    assert_eq!(r.metadata.tokens_used, 11 + 7);
    let r2 = spawn(
        &h,
        "write about autumn",
        SpawnOptions {
            model_hint: Some(metash_protocol::ModelHint::Fast),
            max_tokens: Some(32),
            ..SpawnOptions::default()
        },
    );
    assert_eq!(r2.data, "second answer");
    let bodies = provider.bodies();
    assert_eq!(bodies.len(), 2);
    let second = &bodies[1];
    let messages = second["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "the sub-agent got history: {second}");
    assert!(
        !second.to_string().contains("orchestrator secret plan"),
        "{second}"
    );
    assert!(second.to_string().contains("write about autumn"));
    assert!(
        second["system"].to_string().contains("You write haiku."),
        "{second}"
    );
    assert_eq!(second["model"], "fast-model");
    assert_eq!(second["max_tokens"], 32, "max_tokens goes to the API");
    assert_eq!(bodies[0]["model"], "smart-model");
    assert_eq!(bodies[0]["max_tokens"], 64, "the role's default cap");
    let used = metash_host::budget::used(h.store()).unwrap();
    assert_eq!(used.tokens_used, 36);
}

#[test]
fn model_role_timeout_cancels_the_request() {
    let provider = Provider::start(vec![Reply::Slow(Duration::from_secs(20))]);
    let p = role_project(&provider, "");
    let h = host(&p);
    let t = Instant::now();
    let r = spawn(
        &h,
        "hi",
        SpawnOptions {
            timeout_seconds: Some(0.7),
            ..SpawnOptions::default()
        },
    );
    assert_eq!(r.status, AgentStatus::Timeout, "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    super::common::assert_clean(p.path());
}

#[test]
fn answer_cut_at_max_tokens_is_an_error() {
    let provider = Provider::start(vec![Reply::Text {
        text: "a very long".into(),
        input_tokens: 5,
        output_tokens: 3,
        stop: "max_tokens",
    }]);
    let p = role_project(&provider, "");
    let r = spawn(
        &host(&p),
        "hi",
        SpawnOptions {
            max_tokens: Some(3),
            ..SpawnOptions::default()
        },
    );
    assert_eq!(r.status, AgentStatus::Error);
    assert!(r.data.contains("max_tokens (3) reached"), "{}", r.data);
    assert_eq!(r.metadata.tokens_used, 8);
}

#[test]
fn missing_key_stops_before_any_request() {
    let provider = Provider::start(vec![Reply::text("x")]);
    let p = role_project(&provider, "");
    let h = Host::open(p.path(), HostOptions::silent()).unwrap();
    if std::env::var_os("METASH_TEST_KEY").is_some() {
        eprintln!(
            "SKIP missing_key_stops_before_any_request: METASH_TEST_KEY is set in this environment"
        );
        return;
    }
    let err = h.preflight().unwrap_err();
    assert!(err.to_string().contains("METASH_TEST_KEY"), "{err}");
    let r = spawn(&h, "hi", SpawnOptions::default());
    assert_eq!(r.status, AgentStatus::Error);
    assert!(r.data.contains("METASH_TEST_KEY"), "{}", r.data);
    assert!(provider.bodies().is_empty());
}

/// A spawn that would pass the run budget becomes a checkpoint and spends nothing; `continue`
/// lets exactly one spawn through.
#[test]
fn budget_stops_at_a_checkpoint_and_spends_nothing() {
    let provider = Provider::start(vec![Reply::text("ok")]);
    let p = role_project(&provider, "[budget]\nmax_tokens = 90\n");
    let h = host(&p);
    assert_eq!(
        spawn(&h, "one", SpawnOptions::default()).status,
        AgentStatus::Success
    ); // 18 used
       // 18 used + 64 reserved = 82 <= 90: allowed. Then 36 + 64 > 90: not.
    assert_eq!(
        spawn(&h, "two", SpawnOptions::default()).status,
        AgentStatus::Success
    );
    let r = spawn(&h, "three", SpawnOptions::default());
    assert_eq!(r.status, AgentStatus::Checkpoint, "{r:?}");
    assert!(r.data.contains("run budget"), "{}", r.data);
    assert_eq!(
        provider.bodies().len(),
        2,
        "nothing was sent past the budget"
    );
    assert_eq!(
        metash_host::budget::used(h.store()).unwrap().tokens_used,
        36
    );
    h.answer_checkpoint(None, "continue").unwrap();
    assert_eq!(
        spawn(&h, "three", SpawnOptions::default()).status,
        AgentStatus::Success
    );
    assert_eq!(provider.bodies().len(), 3);
    assert_eq!(
        spawn(&h, "four", SpawnOptions::default()).status,
        AgentStatus::Checkpoint
    );
    assert_eq!(provider.bodies().len(), 3);
}

/// A model answering with seed 000's checkpoint JSON pauses like any agent.
#[test]
fn model_role_checkpoint() {
    let cp = r#"{"type":"checkpoint","reason":"human_verify","message":"Does the haiku scan?","options":["yes","no"]}"#;
    let provider = Provider::start(vec![Reply::text(cp)]);
    let p = role_project(&provider, "");
    let h = host(&p);
    let r = spawn(&h, "hi", SpawnOptions::default());
    assert_eq!(r.status, AgentStatus::Checkpoint, "{r:?}");
    let pending = h.pending_checkpoint().unwrap().unwrap();
    assert_eq!(
        pending.signal.reason,
        metash_protocol::CheckpointReason::HumanVerify
    );
    assert_eq!(pending.agent, "writer");
}

/// Usage is counted as the turn streams: a turn whose reported output passes the cap is stopped
/// and ends in an error, even if the provider did not stop it.
#[test]
fn streamed_usage_past_max_tokens_ends_the_agent() {
    let provider = Provider::start(vec![Reply::Text {
        text: "a provider that ignores the cap".into(),
        input_tokens: 5,
        output_tokens: 50,
        stop: "end_turn",
    }]);
    let p = role_project(&provider, "");
    let r = spawn(
        &host(&p),
        "hi",
        SpawnOptions {
            max_tokens: Some(10),
            ..SpawnOptions::default()
        },
    );
    assert_eq!(r.status, AgentStatus::Error, "{r:?}");
    assert!(r.data.contains("max_tokens exceeded"), "{}", r.data);
    assert_eq!(r.metadata.tokens_used, 55);
}

/// Cost is priced from streamed usage with the project's price table: a turn that would pass the
/// run's `max_cost_usd` is stopped, what it used is charged, and the next spawn meets the budget
/// checkpoint, as for tokens.
#[test]
fn streamed_cost_past_max_cost_usd_ends_the_turn() {
    let provider = Provider::start(vec![
        Reply::Text {
            text: "cheap".into(),
            input_tokens: 0,
            output_tokens: 1_000,
            stop: "end_turn",
        },
        Reply::Text {
            text: "a provider that talks too long".into(),
            input_tokens: 0,
            output_tokens: 50_000,
            stop: "end_turn",
        },
    ]);
    let p = role_project(
        &provider,
        "[budget]\nmax_cost_usd = 0.1\n[prices.\"smart-model\"]\ninput_per_mtok = 0.0\noutput_per_mtok = 10.0\n",
    );
    let h = host(&p);
    let big = SpawnOptions {
        max_tokens: Some(100_000),
        ..SpawnOptions::default()
    };
    let r = spawn(&h, "hi", big.clone());
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    let used = metash_host::budget::used(h.store()).unwrap();
    assert!(
        (used.cost_usd - 0.01).abs() < 1e-9,
        "priced by the host: {used:?}"
    );
    let r = spawn(&h, "more", big.clone());
    assert_eq!(r.status, AgentStatus::Error, "{r:?}");
    assert!(r.data.contains("max_cost_usd exceeded"), "{}", r.data);
    let used = metash_host::budget::used(h.store()).unwrap();
    assert!((used.cost_usd - 0.51).abs() < 1e-9, "{used:?}");
    let r = spawn(&h, "again", big);
    assert_eq!(
        r.status,
        AgentStatus::Checkpoint,
        "the budget checkpoint follows: {r:?}"
    );
    assert!(r.data.contains("run budget"), "{}", r.data);
    assert_eq!(
        provider.bodies().len(),
        2,
        "no request after the budget is spent"
    );
}

#[test]
fn a_bad_price_names_the_file_and_the_field() {
    let provider = Provider::start(vec![Reply::text("unused")]);
    let p = role_project(
        &provider,
        "[prices.\"m\"]\ninput_per_mtok = -1.0\noutput_per_mtok = 1.0\n",
    );
    let err = Host::open(p.path(), HostOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("config.toml") && err.contains("prices") && err.contains("input_per_mtok"),
        "{err}"
    );
}
