//! The ledger view and its redacted export.

use metash_policy::ledger::{self, Filter, Format};
use metash_policy::redact::{project_redactor, Redactor};
use metash_policy::{Answer, CapabilityRequest};
use metash_protocol::LogKind;
use serde_json::{json, Value};

use super::common::{manifest_with, Counting, Project};

const OPENAI: &str = "sk-proj-Abc123Def456Ghi789Jkl012";
const ANTHROPIC: &str = "sk-ant-api03-ZZZyyyXXXwwwVVV-uuu";
const BEARER: &str = "tok_9f8e7d6c5b4a3210fedcba";
const GITHUB: &str = "ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
const AWS: &str = "AKIAIOSFODNN7EXAMPLE";
const JWT: &str =
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
const SLACK: &str = "xoxb-123456789012-abcdefghijkl";
const VAULT: &str = "correct horse battery staple";
const PASSWORD: &str = "hunter2hunter2";

/// A log with a registration, a grant, and events carrying planted secrets.
fn planted() -> Project {
    let p = Project::new();
    p.add_agent("a", &manifest_with(&["network", "process.spawn"], "wasm"));
    let (policy, _) = p.policy();
    policy.registry().record(policy.store()).unwrap();
    policy
        .grant("a", &"network".parse().unwrap(), 60, false, "test")
        .unwrap();
    let store = p.store();
    store
        .append(
            LogKind::AgentAction,
            Some("a"),
            json!({
                "capability": "process.spawn:curl",
                "detail": {
                    "program": "curl",
                    "env": {"OPENAI_API_KEY": OPENAI, "LANG": "C.UTF-8", "GITHUB_TOKEN": GITHUB},
                    "argv": ["curl", "-H", format!("Authorization: Bearer {BEARER}"), "https://api.example.com/v1/items"],
                    "env_list": [format!("ANTHROPIC_API_KEY={ANTHROPIC}"), "HOME=/home/me"],
                },
            }),
        )
        .unwrap();
    store
        .append(
            LogKind::AgentAction,
            Some("a"),
            json!({
                "capability": "network:api.example.com",
                "detail": {
                    "message": format!("retrying with Bearer {BEARER} after 401; aws {AWS}; jwt {JWT}; slack {SLACK}"),
                    "password": PASSWORD,
                    "vault_ref": {"source": "vault", "name": "db", "value": VAULT},
                    "status": 200,
                },
            }),
        )
        .unwrap();
    p
}

const SECRETS: &[&str] = &[
    OPENAI, ANTHROPIC, BEARER, GITHUB, AWS, JWT, SLACK, VAULT, PASSWORD,
];

fn export(p: &Project, format: Format, filter: &Filter) -> String {
    let store = p.store();
    let r = project_redactor(&store).unwrap();
    let mut out = Vec::new();
    ledger::export(&store, filter, format, &r, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn export_contains_no_planted_secret_and_keeps_the_rest() {
    let p = planted();
    let all = Filter {
        all: true,
        ..Filter::default()
    };
    for format in [Format::Jsonl, Format::Csv] {
        let out = export(&p, format, &all);
        for s in SECRETS {
            assert!(!out.contains(s), "{format:?} export leaks {s}:\n{out}");
        }
        for kept in [
            "C.UTF-8",
            "HOME=/home/me",
            "https://api.example.com/v1/items",
            "retrying with Bearer [REDACTED:token:",
            "after 401",
            "[REDACTED:openai_key:",
            "[REDACTED:anthropic_key:",
            "[REDACTED:github_token:",
            "[REDACTED:aws_access_key:",
            "[REDACTED:jwt:",
            "[REDACTED:slack_token:",
            "[REDACTED:vault:",
            "process.spawn:curl",
            "agent_registered",
            "consent_grant",
        ] {
            assert!(
                out.contains(kept),
                "{format:?} export lost `{kept}`:\n{out}"
            );
        }
    }
    let jsonl = export(&p, Format::Jsonl, &all);
    let recs: Vec<Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let action = recs
        .iter()
        .find(|r| r["data"]["capability"] == "process.spawn:curl")
        .unwrap();
    assert_eq!(action["data"]["detail"]["env"]["LANG"], "C.UTF-8");
    assert_eq!(action["data"]["detail"]["program"], "curl");
    assert_eq!(action["agent"], "a");
    let other = recs
        .iter()
        .find(|r| r["data"]["capability"] == "network:api.example.com")
        .unwrap();
    assert_eq!(other["data"]["detail"]["status"], 200);
    assert_eq!(other["data"]["detail"]["vault_ref"]["name"], "db");
    // Equal secrets, equal markers: the bearer token appears in two events.
    let marker = |v: &Value| -> String {
        let s = v.to_string();
        let i = s.find("[REDACTED:token:").unwrap();
        s[i..i + 25].to_string()
    };
    assert_eq!(
        marker(&action["data"]["detail"]["argv"]),
        marker(&other["data"]["detail"]["message"])
    );
    // CSV: a header and one row per record.
    let csv = export(&p, Format::Csv, &all);
    assert!(csv.starts_with("seq,ts,kind,agent,capability,data,hash\n"));
    assert_eq!(csv.lines().count(), recs.len() + 1);
}

#[test]
fn markers_are_stable_per_project_and_salted() {
    let a = Redactor::new(b"one");
    let b = Redactor::new(b"two");
    assert_eq!(a.redact_str(OPENAI), a.redact_str(OPENAI));
    assert_ne!(a.redact_str(OPENAI), b.redact_str(OPENAI));
    let p = Project::new();
    let s = p.store();
    assert_eq!(
        project_redactor(&s).unwrap().marker("x", "k"),
        project_redactor(&s).unwrap().marker("x", "k")
    );
    let salt_events = p
        .kinds()
        .iter()
        .filter(|k| *k == "redaction_salt_created")
        .count();
    assert_eq!(salt_events, 1);
}

#[test]
fn known_vault_values_and_kv_writes_are_redacted() {
    let r = Redactor::new(b"s").with_known_secrets(["s3cr3t-value".to_string()]);
    assert_eq!(
        r.redact_str("token was s3cr3t-value!")
            .matches("[REDACTED:vault:")
            .count(),
        1
    );
    let mut v = json!({"namespace": "a", "key": "GITHUB_TOKEN", "value": "plain"});
    r.redact_value(&mut v);
    assert!(
        v["value"].as_str().unwrap().starts_with("[REDACTED:"),
        "{v}"
    );
    assert_eq!(v["key"], "GITHUB_TOKEN");
    let mut v = json!({"key": "plan.title", "value": "hello"});
    r.redact_value(&mut v);
    assert_eq!(v["value"], "hello");
    let plain = "nothing to see: task-1234567890abcdefgh, mask-abcdefghijklmnopqrs";
    assert_eq!(
        r.redact_str(plain),
        plain,
        "no false positives inside words"
    );
}

#[test]
fn view_filters_by_agent_capability_and_time() {
    let p = planted();
    p.add_agent("b", &manifest_with(&["codegen"], "wasm"));
    let (policy, _) = p.policy();
    let mut ask = Counting::new(Answer::AllowOnce);
    policy
        .authorize(
            "b",
            &CapabilityRequest::parse("codegen", "x").unwrap(),
            &mut ask,
        )
        .unwrap();
    let store = p.store();
    let only_b = ledger::records(
        &store,
        &Filter {
            agent: Some("b".into()),
            ..Filter::default()
        },
    )
    .unwrap();
    assert!(!only_b.is_empty());
    assert!(only_b.iter().all(|r| r.agent.as_deref() == Some("b")));
    let net = ledger::records(
        &store,
        &Filter {
            capability: Some("network".parse().unwrap()),
            ..Filter::default()
        },
    )
    .unwrap();
    let kinds: Vec<_> = net.iter().map(|r| r.kind.as_str()).collect();
    assert!(
        kinds.contains(&"consent_grant") && kinds.contains(&"agent_action"),
        "{kinds:?}"
    );
    assert!(net.iter().all(|r| r.agent.as_deref() == Some("a")));
    let future = chrono::Utc::now() + chrono::Duration::hours(1);
    assert!(ledger::records(
        &store,
        &Filter {
            since: Some(future),
            ..Filter::default()
        }
    )
    .unwrap()
    .is_empty());
    let past = chrono::Utc::now() - chrono::Duration::hours(1);
    assert!(ledger::records(
        &store,
        &Filter {
            until: Some(past),
            ..Filter::default()
        }
    )
    .unwrap()
    .is_empty());
    // The default view leaves out unrelated store events (session_init).
    let default = ledger::records(&store, &Filter::default()).unwrap();
    assert!(default.iter().all(|r| r.kind != "session_init"));
    let table = ledger::render_table(&default, &project_redactor(&store).unwrap());
    assert!(table.starts_with("SEQ"));
    for s in SECRETS {
        assert!(!table.contains(s), "view leaks {s}");
    }
    assert!(table.contains("agent_registered"));
}

#[test]
fn time_arguments() {
    let now = chrono::Utc::now();
    assert_eq!(
        ledger::parse_time("10m", now).unwrap(),
        now - chrono::Duration::minutes(10)
    );
    assert_eq!(
        ledger::parse_time("2026-11-22", now).unwrap().to_rfc3339(),
        "2026-11-22T00:00:00+00:00"
    );
    assert!(ledger::parse_time("2026-11-22T09:00:00Z", now).is_ok());
    assert!(ledger::parse_time("yesterday", now).is_err());
}

#[test]
fn credentials_in_free_text_do_not_slip_past() {
    let r = Redactor::new(b"s");
    for (text, secret, kept) in [
        (
            "X_API_KEY: Bearer abcdefgh12345678",
            "abcdefgh12345678",
            "X_API_KEY: Bearer [REDACTED:",
        ),
        (
            "GET https://x.test/?api_key=abc123xyz&page=2",
            "abc123xyz",
            "&page=2",
        ),
        (
            r#"body {"password": "hunter2hunter2", "user": "me"}"#,
            "hunter2hunter2",
            r#""user": "me""#,
        ),
        ("DB_PASSWORD=opensesame ./run", "opensesame", "./run"),
        (
            "Authorization: Basic dXNlcjpwYXNzd29yZA==",
            "dXNlcjpwYXNzd29yZA==",
            "Authorization: Basic [REDACTED:",
        ),
    ] {
        let out = r.redact_str(text);
        assert!(!out.contains(secret), "{text} -> {out}");
        assert!(out.contains(kept), "{text} -> {out}");
    }
}
