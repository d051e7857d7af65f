//! The parameters of every served method, validated by hand so that a bad request gets a message
//! naming the field (`options.timeout_seconds must be a number >= 0, got "ten"`), which serde's
//! derived errors do not. The structs derive `JsonSchema` for MCP's tool input schemas; their
//! `Deserialize` goes through the same validation, so JSON-RPC and MCP refuse the same inputs with
//! the same words.

use metash_protocol::{LogLevel, ModelHint, SpawnOptions};
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

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
#[derive(Debug, Clone, PartialEq, JsonSchema)]
pub struct SpawnAgentParams {
    /// A registered agent (WASM or native) or a model-backed role from `.meta/config.toml`.
    pub agent_name: String,
    /// The sub-agent's system prompt; it gets no other history.
    pub system_prompt: Option<String>,
    /// The task for the sub-agent.
    pub user_message: String,
    /// Limits: `model_hint` (`fast` | `smart`), `timeout_seconds`, `max_tokens`.
    pub options: Option<SpawnOptions>,
}

/// `update_state(key, value)`: an atomic update of one dotted key path.
#[derive(Debug, Clone, PartialEq, JsonSchema)]
pub struct UpdateStateParams {
    /// A dotted key path, e.g. `variables.retry_count` or `status`.
    pub key: String,
    /// Any JSON value; it is validated against the session schema.
    pub value: Value,
}

/// `get_state(key?)`: the whole session state, or the value at one dotted key path.
#[derive(Debug, Clone, Default, PartialEq, JsonSchema)]
pub struct GetStateParams {
    /// A dotted key path; the whole state when absent or empty.
    pub key: Option<String>,
}

/// `log_progress(message, level)`: a line for people and a `progress` event for clients.
#[derive(Debug, Clone, PartialEq, JsonSchema)]
pub struct LogProgressParams {
    pub message: String,
    /// `info` (the default), `warn` or `error`.
    pub level: Option<LogLevel>,
}

/// Answers the pending checkpoint; the answer reaches the next spawn exactly once.
#[derive(Debug, Clone, PartialEq, JsonSchema)]
pub struct AnswerCheckpointParams {
    /// The checkpoint to answer; the pending one when absent (refused if it is another).
    pub checkpoint_id: Option<String>,
    /// One of the checkpoint's options (or its 1-based number), or free text when it has none.
    pub answer: String,
}

/// Reads a JSON object field by field, remembering where it is for error messages.
pub(crate) struct Fields<'a> {
    map: &'a Map<String, Value>,
    prefix: String,
}

impl<'a> Fields<'a> {
    pub(crate) fn new(value: &'a Value, prefix: &str) -> Result<Self> {
        match value {
            Value::Object(map) => Ok(Self {
                map,
                prefix: prefix.to_string(),
            }),
            other => Err(ParamError::new(
                if prefix.is_empty() { "params" } else { prefix },
                format!("must be an object, got {}", describe(other)),
            )),
        }
    }

    fn path(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// The field, with JSON `null` treated as absent.
    fn get(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    fn string(&self, name: &str) -> Result<String> {
        self.opt_string(name)?
            .ok_or_else(|| ParamError::new(self.path(name), "is required (a string)"))
    }

    fn opt_string(&self, name: &str) -> Result<Option<String>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(ParamError::new(
                self.path(name),
                format!("must be a string, got {}", describe(other)),
            )),
        }
    }

    fn opt_number(&self, name: &str) -> Result<Option<f64>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(f) if f.is_finite() && f >= 0.0 => Ok(Some(f)),
                _ => Err(ParamError::new(
                    self.path(name),
                    format!("must be a number >= 0, got {n}"),
                )),
            },
            Some(other) => Err(ParamError::new(
                self.path(name),
                format!("must be a number >= 0, got {}", describe(other)),
            )),
        }
    }

    fn opt_u64(&self, name: &str) -> Result<Option<u64>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
            Some(other) => Err(ParamError::new(
                self.path(name),
                format!("must be a non-negative integer, got {}", describe(other)),
            )),
        }
    }

    /// A required field that may hold any JSON value, `null` included.
    fn any(&self, name: &str) -> Result<Value> {
        self.map
            .get(name)
            .cloned()
            .ok_or_else(|| ParamError::new(self.path(name), "is required (any JSON value)"))
    }

    fn one_of<T: Copy>(&self, name: &str, choices: &[(&str, T)]) -> Result<Option<T>> {
        let Some(s) = self.opt_string(name)? else {
            return Ok(None);
        };
        match choices.iter().find(|(k, _)| *k == s) {
            Some((_, v)) => Ok(Some(*v)),
            None => Err(ParamError::new(
                self.path(name),
                format!(
                    "must be one of {}, got {:?}",
                    choices
                        .iter()
                        .map(|(k, _)| format!("\"{k}\""))
                        .collect::<Vec<_>>()
                        .join(", "),
                    s
                ),
            )),
        }
    }

    fn nested(&self, name: &str) -> Result<Option<Fields<'a>>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => Fields::new(v, &self.path(name)).map(Some),
        }
    }

    /// Refuses fields the method does not know, so a typo is not silently ignored.
    fn only(&self, known: &[&str]) -> Result<()> {
        match self.map.keys().find(|k| !known.contains(&k.as_str())) {
            None => Ok(()),
            Some(k) => Err(ParamError::new(
                self.path(k),
                format!(
                    "is not a known parameter (expected one of: {})",
                    known.join(", ")
                ),
            )),
        }
    }
}

/// A short description of a JSON value for error messages: its type and, when small, itself.
fn describe(v: &Value) -> String {
    let kind = match v {
        Value::Null => return "null".into(),
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => return "an array".into(),
        Value::Object(_) => return "an object".into(),
    };
    let text = v.to_string();
    if text.len() <= 40 {
        format!("{kind} {text}")
    } else {
        kind.to_string()
    }
}

/// Parameters that can be read from a JSON object with field-naming errors.
pub trait FromParams: Sized {
    /// The parameter names in positional order (JSON-RPC allows `params` as an array).
    const NAMES: &'static [&'static str];

    /// # Errors
    /// A missing, mistyped or unknown field, named in the error.
    fn from_params(value: &Value) -> Result<Self>;
}

impl FromParams for SpawnAgentParams {
    const NAMES: &'static [&'static str] =
        &["agent_name", "system_prompt", "user_message", "options"];

    fn from_params(value: &Value) -> Result<Self> {
        let f = Fields::new(value, "")?;
        f.only(Self::NAMES)?;
        let agent_name = f.string("agent_name")?;
        if agent_name.trim().is_empty() {
            return Err(ParamError::new("agent_name", "must not be empty"));
        }
        let options = match f.nested("options")? {
            None => None,
            Some(o) => {
                o.only(&["model_hint", "timeout_seconds", "max_tokens"])?;
                Some(SpawnOptions {
                    model_hint: o.one_of(
                        "model_hint",
                        &[("fast", ModelHint::Fast), ("smart", ModelHint::Smart)],
                    )?,
                    timeout_seconds: o.opt_number("timeout_seconds")?,
                    max_tokens: o.opt_u64("max_tokens")?,
                })
            }
        };
        Ok(Self {
            agent_name,
            system_prompt: f.opt_string("system_prompt")?,
            user_message: f.string("user_message")?,
            options,
        })
    }
}

impl FromParams for UpdateStateParams {
    const NAMES: &'static [&'static str] = &["key", "value"];

    fn from_params(value: &Value) -> Result<Self> {
        let f = Fields::new(value, "")?;
        f.only(Self::NAMES)?;
        let key = f.string("key")?;
        if key.is_empty() {
            return Err(ParamError::new("key", "must not be empty"));
        }
        Ok(Self {
            key,
            value: f.any("value")?,
        })
    }
}

impl FromParams for GetStateParams {
    const NAMES: &'static [&'static str] = &["key"];

    fn from_params(value: &Value) -> Result<Self> {
        let f = Fields::new(value, "")?;
        f.only(Self::NAMES)?;
        Ok(Self {
            key: f.opt_string("key")?,
        })
    }
}

impl FromParams for LogProgressParams {
    const NAMES: &'static [&'static str] = &["message", "level"];

    fn from_params(value: &Value) -> Result<Self> {
        let f = Fields::new(value, "")?;
        f.only(Self::NAMES)?;
        Ok(Self {
            message: f.string("message")?,
            level: f.one_of(
                "level",
                &[
                    ("info", LogLevel::Info),
                    ("warn", LogLevel::Warn),
                    ("error", LogLevel::Error),
                ],
            )?,
        })
    }
}

impl FromParams for AnswerCheckpointParams {
    const NAMES: &'static [&'static str] = &["answer", "checkpoint_id"];

    fn from_params(value: &Value) -> Result<Self> {
        let f = Fields::new(value, "")?;
        f.only(Self::NAMES)?;
        Ok(Self {
            checkpoint_id: f.opt_string("checkpoint_id")?,
            answer: f.string("answer")?,
        })
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

/// MCP's SDK deserializes tool arguments with serde; route that through the same validation.
macro_rules! deserialize_via_from_params {
    ($($t:ty),*) => {$(
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
                let value = Value::deserialize(d)?;
                <$t>::from_params(&value).map_err(serde::de::Error::custom)
            }
        }
    )*};
}

deserialize_via_from_params!(
    SpawnAgentParams,
    UpdateStateParams,
    GetStateParams,
    LogProgressParams,
    AnswerCheckpointParams
);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn errors_name_the_field() {
        let e = SpawnAgentParams::from_params(&json!({"agent_name": 5, "user_message": "x"}))
            .unwrap_err();
        assert_eq!(e.to_string(), "`agent_name` must be a string, got number 5");
        let e = SpawnAgentParams::from_params(
            &json!({"agent_name": "a", "user_message": "x", "options": {"timeout_seconds": "ten"}}),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "`options.timeout_seconds` must be a number >= 0, got string \"ten\""
        );
        let e = SpawnAgentParams::from_params(
            &json!({"agent_name": "a", "user_message": "x", "options": {"model_hint": "big"}}),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "`options.model_hint` must be one of \"fast\", \"smart\", got \"big\""
        );
        let e = UpdateStateParams::from_params(&json!({"key": "status"})).unwrap_err();
        assert_eq!(e.to_string(), "`value` is required (any JSON value)");
        let e = GetStateParams::from_params(&json!({"kee": "status"})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`kee` is not a known parameter (expected one of: key)"
        );
    }

    #[test]
    fn positional_params_map_to_names() {
        let v = positional(UpdateStateParams::NAMES, &[json!("variables.n"), json!(3)]).unwrap();
        let p = UpdateStateParams::from_params(&v).unwrap();
        assert_eq!(p.key, "variables.n");
        assert_eq!(p.value, json!(3));
        assert!(positional(GetStateParams::NAMES, &[json!("a"), json!("b")]).is_err());
    }

    #[test]
    fn serde_goes_through_the_same_validation() {
        let e =
            serde_json::from_value::<LogProgressParams>(json!({"message": "m", "level": "loud"}))
                .unwrap_err();
        assert!(e.to_string().contains("`level` must be one of"), "{e}");
        let ok: SpawnAgentParams = serde_json::from_value(
            json!({"agent_name": "a", "user_message": "u", "options": {"max_tokens": 10, "model_hint": "fast"}}),
        )
        .unwrap();
        assert_eq!(ok.options.unwrap().max_tokens, Some(10));
    }
}
