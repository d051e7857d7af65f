//! The parameters of every served method, decoded by serde into typed structs. Decoding goes
//! through `serde_path_to_error`, so a bad request gets a message naming the dotted field
//! (`options.timeout_seconds must be a number >= 0, got string "ten"`) instead of serde's bare
//! "invalid type". The structs derive `JsonSchema` for MCP's tool input schemas, and MCP decodes
//! them through [`Checked`], so JSON-RPC and MCP refuse the same inputs with the same words.

use metash_protocol::{LogLevel, SpawnOptions};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

mod wording;

/// A parameter that is missing, of the wrong type or unknown. `field` is the dotted path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}` {problem}")]
pub struct ParamError {
    pub field: String,
    pub problem: String,
}

impl ParamError {
    fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

type Result<T> = std::result::Result<T, ParamError>;

/// `spawn_agent(agent_name, system_prompt, user_message, options)` (seed 000).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnAgentParams {
    /// A registered agent (WASM or native) or a model-backed role from `.meta/config.toml`.
    #[serde(deserialize_with = "non_empty")]
    pub agent_name: String,
    /// The sub-agent's system prompt; it gets no other history.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// The task for the sub-agent.
    pub user_message: String,
    /// Limits: `model_hint` (`fast` | `smart`), `timeout_seconds`, `max_tokens`.
    #[serde(default)]
    pub options: Option<SpawnOptions>,
}

/// `update_state(key, value)`: an atomic update of one dotted key path.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateStateParams {
    /// A dotted key path, e.g. `variables.retry_count` or `status`.
    #[serde(deserialize_with = "non_empty")]
    pub key: String,
    /// Any JSON value, `null` included; it is validated against the session schema.
    pub value: Value,
}

/// `get_state(key?)`: the whole session state, or the value at one dotted key path.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetStateParams {
    /// A dotted key path; the whole state when absent or empty.
    #[serde(default)]
    pub key: Option<String>,
}

/// `log_progress(message, level)`: a line for people and a `progress` event for clients.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogProgressParams {
    pub message: String,
    /// `info` (the default), `warn` or `error`.
    #[serde(default)]
    pub level: Option<LogLevel>,
}

/// Answers the pending checkpoint; the answer reaches the next spawn exactly once.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerCheckpointParams {
    /// The checkpoint to answer; the pending one when absent (refused if it is another).
    #[serde(default)]
    pub checkpoint_id: Option<String>,
    /// One of the checkpoint's options (or its 1-based number), or free text when it has none.
    pub answer: String,
}

/// An answer to a consent question waiting for any client (`pendingConsent` lists them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConsentReply {
    AllowOnce,
    /// With `duration_s`.
    AllowFor,
    Deny,
}

/// Answers a waiting consent question; the first answer from any client wins.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerConsentParams {
    /// The question's id (`pendingConsent`).
    #[serde(deserialize_with = "non_empty")]
    pub id: String,
    pub answer: ConsentReply,
    /// Seconds, 1 to 86400, with `allow_for` only.
    #[serde(default)]
    pub duration_s: Option<u64>,
}

impl AnswerConsentParams {
    /// The policy's answer.
    pub fn answer(&self) -> metash_policy::Answer {
        match self.answer {
            ConsentReply::AllowOnce => metash_policy::Answer::AllowOnce,
            ConsentReply::AllowFor => metash_policy::Answer::AllowFor(self.duration_s.unwrap_or(1)),
            ConsentReply::Deny => metash_policy::Answer::Deny,
        }
    }
}

/// Names a running agent (`suspendAgent`, `resumeAgent`).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentParams {
    /// The agent's id, as spawned.
    #[serde(deserialize_with = "non_empty")]
    pub agent: String,
}

/// A string that must hold something: an empty agent name or key path is a caller's mistake.
fn non_empty<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.trim().is_empty() {
        return Err(serde::de::Error::custom("must not be empty"));
    }
    Ok(s)
}

/// A method's parameters: serde decodes them; `NAMES` maps JSON-RPC's positional form.
pub trait Params: DeserializeOwned {
    /// The parameter names in positional order (JSON-RPC allows `params` as an array).
    const NAMES: &'static [&'static str];

    /// What serde cannot say in a type: a range on a number inside a nested object.
    ///
    /// # Errors
    /// A decoded value out of range, named by its field.
    fn check(&self) -> Result<()> {
        Ok(())
    }
}

impl Params for SpawnAgentParams {
    const NAMES: &'static [&'static str] =
        &["agent_name", "system_prompt", "user_message", "options"];

    fn check(&self) -> Result<()> {
        match self.options.as_ref().and_then(|o| o.timeout_seconds) {
            Some(t) if !(t.is_finite() && t >= 0.0) => Err(ParamError::new(
                "options.timeout_seconds",
                format!("must be a number >= 0, got {t}"),
            )),
            Some(t) if t > metash_protocol::MAX_TIMEOUT_SECONDS => Err(ParamError::new(
                "options.timeout_seconds",
                format!(
                    "must be at most {} (30 days), got {}",
                    metash_protocol::MAX_TIMEOUT_SECONDS,
                    metash_protocol::show_seconds(t)
                ),
            )),
            _ => Ok(()),
        }
    }
}

impl Params for UpdateStateParams {
    const NAMES: &'static [&'static str] = &["key", "value"];
}

impl Params for GetStateParams {
    const NAMES: &'static [&'static str] = &["key"];
}

impl Params for LogProgressParams {
    const NAMES: &'static [&'static str] = &["message", "level"];
}

impl Params for AgentParams {
    const NAMES: &'static [&'static str] = &["agent"];
}

impl Params for AnswerCheckpointParams {
    const NAMES: &'static [&'static str] = &["answer", "checkpoint_id"];
}

impl Params for AnswerConsentParams {
    const NAMES: &'static [&'static str] = &["id", "answer", "duration_s"];

    fn check(&self) -> Result<()> {
        match (self.answer, self.duration_s) {
            (ConsentReply::AllowFor, Some(d)) if (1..=86_400).contains(&d) => Ok(()),
            (ConsentReply::AllowFor, Some(d)) => Err(ParamError::new(
                "duration_s",
                format!("must be 1 to 86400 seconds, got {d}"),
            )),
            (ConsentReply::AllowFor, None) => Err(ParamError::new(
                "duration_s",
                "is required with allow_for (seconds, 1 to 86400)",
            )),
            (_, Some(_)) => Err(ParamError::new("duration_s", "goes with allow_for only")),
            (_, None) => Ok(()),
        }
    }
}

/// Decodes a method's named parameters, naming the field in any error.
///
/// # Errors
/// `params` is not an object, or a field is missing, mistyped, out of range or unknown.
pub fn decode<P: Params>(value: &Value) -> Result<P> {
    if !value.is_object() {
        return Err(ParamError::new(
            "params",
            format!("must be an object, got {}", wording::describe(value)),
        ));
    }
    let decoded: P = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        wording::param_error(value, &path, &e.into_inner().to_string())
    })?;
    decoded.check()?;
    Ok(decoded)
}

/// MCP's SDK hands tool arguments to serde; this wrapper routes them through [`decode`] so a
/// model reads the same field-naming message a JSON-RPC client gets. Its schema is `P`'s.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked<P>(pub P);

impl<'de, P: Params> Deserialize<'de> for Checked<P> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        decode(&value)
            .map(Checked)
            .map_err(serde::de::Error::custom)
    }
}

impl<P: JsonSchema> JsonSchema for Checked<P> {
    fn inline_schema() -> bool {
        P::inline_schema()
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        P::schema_name()
    }

    fn schema_id() -> std::borrow::Cow<'static, str> {
        P::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        P::json_schema(generator)
    }
}

/// Positional `params` (a JSON array) as the named object the methods read.
///
/// # Errors
/// More values than the method has parameters.
pub fn positional(names: &[&str], items: &[Value]) -> Result<Value> {
    if items.len() > names.len() {
        return Err(ParamError::new(
            "params",
            format!(
                "has {} positional values but the method takes at most {} ({})",
                items.len(),
                names.len(),
                names.join(", ")
            ),
        ));
    }
    let map: Map<String, Value> = names
        .iter()
        .zip(items)
        .map(|(k, v)| ((*k).to_string(), v.clone()))
        .collect();
    Ok(Value::Object(map))
}

#[cfg(test)]
mod tests;
