//! The placeholder ChatGPT sign-in Codex gets in its own `CODEX_HOME` when the role uses the
//! user's subscription (`codex login`): Codex then runs in ChatGPT mode, as it would signed in,
//! and every token it holds is the placeholder the credential proxy replaces.

use base64::Engine;
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};

use crate::request::SignInOptions;

/// The claim Codex reads the account and plan from in its ID token.
const AUTH_CLAIM: &str = "https://api.openai.com/auth";

/// `auth.json` in ChatGPT mode: every token and the account id the placeholder; an ID token
/// that is a well-formed (unsigned) JWT, since Codex parses its claims, naming the placeholder
/// account and the plan; `last_refresh` now, so Codex (whose access token here is not a JWT
/// with an `exp`) does not try to renew it for 8 days.
pub(crate) fn placeholder_auth_json(sign_in: &SignInOptions, now: DateTime<Utc>) -> Value {
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let placeholder = sign_in.placeholder.as_str();
    let mut auth = json!({ "chatgpt_account_id": placeholder });
    if let Some(plan) = &sign_in.plan {
        auth["chatgpt_plan_type"] = plan.as_str().into();
    }
    let id_token = format!(
        "{}.{}.{}",
        b64(json!({"alg": "none", "typ": "JWT"}).to_string().as_bytes()),
        b64(json!({ AUTH_CLAIM: auth }).to_string().as_bytes()),
        b64(placeholder.as_bytes()),
    );
    json!({
        "OPENAI_API_KEY": null,
        "tokens": {
            "id_token": id_token,
            "access_token": placeholder,
            "refresh_token": placeholder,
            "account_id": placeholder,
        },
        "last_refresh": now.to_rfc3339_opts(SecondsFormat::Secs, true),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placeholder_is_a_chatgpt_login_holding_only_the_placeholder() {
        let s = SignInOptions {
            placeholder: "ph".into(),
            plan: Some("plus".into()),
            chatgpt_base_url: None,
        };
        let doc = placeholder_auth_json(&s, Utc::now());
        assert!(doc["OPENAI_API_KEY"].is_null());
        for k in ["access_token", "refresh_token", "account_id"] {
            assert_eq!(doc["tokens"][k], "ph");
        }
        let id = doc["tokens"]["id_token"].as_str().unwrap_or_default();
        let parts: Vec<&str> = id.split('.').collect();
        assert_eq!(parts.len(), 3);
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(parts[1])
            .unwrap_or_default();
        let claims: Value = serde_json::from_slice(&payload).unwrap_or_default();
        assert_eq!(claims[AUTH_CLAIM]["chatgpt_plan_type"], "plus");
        assert_eq!(claims[AUTH_CLAIM]["chatgpt_account_id"], "ph");
        assert!(doc["last_refresh"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')));
    }
    #[test]
    fn a_sign_in_gets_its_own_codex_home_and_a_provider_that_uses_it() {
        use crate::request::{BuildProcessInvocationSpecRequest, Endpoint};
        let dir = tempfile::tempdir().expect("dir");
        let mut req = BuildProcessInvocationSpecRequest::new(
            metash_protocol::HarnessFrontend::CodexCli,
            dir.path(),
            dir.path(),
        );
        req.options.endpoint = Some(Endpoint {
            base_url: "http://127.0.0.1:9/codex".into(),
            api_key_env: Some("OPENAI_API_KEY".into()),
            provider_name: None,
        });
        req.options.sign_in = Some(SignInOptions {
            placeholder: "ph".into(),
            plan: None,
            chatgpt_base_url: Some("http://127.0.0.1:9/chatgpt-account/".into()),
        });
        // Not isolated: a sign-in still never reads the user's CODEX_HOME.
        let m = super::super::invocation::materialize(&req).expect("materialize");
        let home = dir.path().join("codex/home");
        assert_eq!(m.env.get("CODEX_HOME").map(String::as_str), home.to_str());
        let auth: Value =
            serde_json::from_slice(&std::fs::read(home.join("auth.json")).expect("auth.json"))
                .expect("json");
        assert_eq!(auth["tokens"]["access_token"], "ph");
        let config = std::fs::read_to_string(home.join("config.toml")).expect("config");
        assert!(
            config.contains("model_providers.metash.requires_openai_auth = true"),
            "{config}"
        );
        assert!(config.contains("chatgpt_base_url = \"http://127.0.0.1:9/chatgpt-account/\""));
        assert!(!config.contains("env_key"), "{config}");
    }
}
