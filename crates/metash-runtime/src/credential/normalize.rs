//! What a replay masks before it compares a request with the recorded one (issue 36 item 4,
//! docs/replay.md "What a replay masks"): the values Codex and Claude Code put in their requests
//! that differ from run to run by design and that neither CLI lets a caller pin (random ids
//! minted per process, a fresh home's install id, the clock). Each is named by its JSON path and
//! masked only when it has the shape that CLI gives it (a UUID, 64 hex digits, a number), so
//! anything else in a request (a prompt, a role, a model, a tool result) still has to match byte
//! for byte in meaning, and a masked field holding something unexpected still stops the replay.
//!
//! Both sides go through the same mask, then are compared as re-serialized JSON (object keys
//! sorted); a body that is not JSON is compared as it is.

use std::borrow::Cow;

use serde_json::Value;

/// The mask put in place of a run-varying value.
const MASK: &str = "<masked>";

/// Whose run-varying request fields a replay masks: a closed set, one per CLI that has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Volatile {
    /// Compared byte for byte (pi; anything unknown).
    #[default]
    None,
    /// Codex (`codex-cli`).
    Codex,
    /// Claude Code (`claude-code`, and `agent-sdk`, which runs Claude Code).
    ClaudeCode,
}

/// Codex's `client_metadata` keys holding a per-process id (a UUID, `:N` after a window id).
const CODEX_METADATA: &[&str] = &[
    "session_id",
    "thread_id",
    "turn_id",
    "root_turn_id",
    "x-codex-installation-id",
    "x-codex-window-id",
];

/// The keys of Codex's `client_metadata."x-codex-turn-metadata"` (a JSON document in a string)
/// holding a per-process id; `turn_started_at_unix_ms` (the clock) is masked too.
const CODEX_TURN_METADATA: &[&str] = &[
    "installation_id",
    "session_id",
    "thread_id",
    "turn_id",
    "root_turn_id",
    "window_id",
    "context_window_id",
];

impl Volatile {
    /// The mask for a role's frontend, by its wire name (`Role::frontend_name`).
    pub fn for_frontend(frontend: &str) -> Self {
        match frontend {
            "codex-cli" => Self::Codex,
            "claude-code" | "agent-sdk" => Self::ClaudeCode,
            _ => Self::None,
        }
    }

    /// `body` with this CLI's run-varying fields masked (unchanged for [`Volatile::None`] and for
    /// a body that is not JSON).
    pub fn normalize<'a>(&self, body: &'a [u8]) -> Cow<'a, [u8]> {
        if *self == Self::None {
            return Cow::Borrowed(body);
        }
        let Ok(mut v) = serde_json::from_slice::<Value>(body) else {
            return Cow::Borrowed(body);
        };
        match self {
            Self::Codex => codex(&mut v),
            Self::ClaudeCode => claude_code(&mut v),
            Self::None => {}
        }
        mask_spawn_dirs(&mut v);
        Cow::Owned(serde_json::to_vec(&v).unwrap_or_else(|_| body.to_vec()))
    }
}

/// Codex (`POST /responses`): `prompt_cache_key`, the ids of `client_metadata` and of its
/// `x-codex-turn-metadata`, the `id` of each input item Codex made itself (`msg_<uuid>`,
/// `fco_<uuid>`), and the head of each tool output (`Chunk ID`, `Wall time`).
fn codex(v: &mut Value) {
    mask_if(v.get_mut("prompt_cache_key"), is_uuid);
    if let Some(meta) = v.get_mut("client_metadata") {
        for key in CODEX_METADATA {
            mask_if(meta.get_mut(*key), is_id);
        }
        if let Some(turn) = meta.get_mut("x-codex-turn-metadata") {
            in_json_string(turn, |t| {
                for key in CODEX_TURN_METADATA {
                    mask_if(t.get_mut(*key), is_id);
                }
                mask_if(t.get_mut("turn_started_at_unix_ms"), Value::is_u64);
            });
        }
    }
    let items = v.get_mut("input").and_then(Value::as_array_mut);
    for item in items.into_iter().flatten() {
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let Some((_, prefix)) = CODEX_ITEM_IDS.iter().find(|(k, _)| *k == kind.as_str()) else {
            continue;
        };
        mask_if(item.get_mut("id"), |id| {
            id.as_str()
                .and_then(|s| s.strip_prefix(prefix))
                .is_some_and(uuid)
        });
        if kind == "function_call_output" {
            if let Some(Value::String(out)) = item.get_mut("output") {
                if let Some(masked) = codex_output_head(out) {
                    *out = masked;
                }
            }
        }
    }
}

/// The input items Codex makes itself, with the prefix of the fresh id (`<prefix><uuid>`) each
/// gets: a message it sends, the output of a tool call it ran.
const CODEX_ITEM_IDS: &[(&str, &str)] = &[("message", "msg_"), ("function_call_output", "fco_")];

/// A Codex tool output's first two lines, `Chunk ID: <6 hex>` (random) and `Wall time: <s>
/// seconds` (the clock), masked; the rest (exit code, output) is kept. `None`: not that shape.
fn codex_output_head(out: &str) -> Option<String> {
    let rest = out.strip_prefix("Chunk ID: ")?;
    let (chunk, rest) = rest.split_once('\n')?;
    let rest = rest.strip_prefix("Wall time: ")?;
    let (wall, rest) = rest.split_once('\n')?;
    let secs = wall.strip_suffix(" seconds")?;
    let hex = !chunk.is_empty() && chunk.bytes().all(|b| b.is_ascii_hexdigit());
    let number = !secs.is_empty() && secs.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    (hex && number).then(|| format!("Chunk ID: {MASK}\nWall time: {MASK} seconds\n{rest}"))
}

/// Claude Code (`POST /v1/messages`): `metadata.user_id`, a JSON document in a string whose
/// `device_id` (64 hex digits) is minted into each fresh home and cannot be pinned. Its
/// `session_id` is not masked: a replay pins it (`--session-id`, [`claude_session_id`]).
fn claude_code(v: &mut Value) {
    let user = v.get_mut("metadata").and_then(|m| m.get_mut("user_id"));
    if let Some(user) = user {
        in_json_string(user, |u| {
            mask_if(u.get_mut("device_id"), |d| {
                d.as_str()
                    .is_some_and(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))
            });
        });
    }
}

/// The session id a Claude Code request carries (`metadata.user_id`'s `session_id`, a UUID):
/// what a replay passes as `--session-id` so that the replayed requests carry the recorded one.
pub fn claude_session_id(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let user: Value = serde_json::from_str(v.get("metadata")?.get("user_id")?.as_str()?).ok()?;
    let id = user.get("session_id")?.as_str()?;
    uuid(id).then(|| id.to_string())
}

/// The spawn's own directory, `metash-spawn-` and six random characters (metash's, not the
/// CLI's: each spawn gets a fresh HOME), wherever it appears in a string (Codex names its skills
/// directory under it).
fn mask_spawn_dirs(v: &mut Value) {
    match v {
        Value::String(s) if s.contains(SPAWN_DIR) => *s = mask_spawn_dir(s),
        Value::Array(items) => items.iter_mut().for_each(mask_spawn_dirs),
        Value::Object(map) => map.values_mut().for_each(mask_spawn_dirs),
        _ => {}
    }
}

const SPAWN_DIR: &str = "metash-spawn-";

fn mask_spawn_dir(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find(SPAWN_DIR) {
        let after = at + SPAWN_DIR.len();
        out.push_str(&rest[..after]);
        rest = &rest[after..];
        let random = rest.get(..6).filter(|r| {
            r.bytes().all(|b| b.is_ascii_alphanumeric())
                && !rest[6..].starts_with(|c: char| c.is_ascii_alphanumeric())
        });
        if random.is_some() {
            out.push_str("******");
            rest = &rest[6..];
        }
    }
    out.push_str(rest);
    out
}

/// Runs `f` on the JSON document held in the string `v`, and puts it back serialized.
fn in_json_string(v: &mut Value, f: impl FnOnce(&mut Value)) {
    let Some(mut inner) = v
        .as_str()
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
    else {
        return;
    };
    f(&mut inner);
    if let Ok(s) = serde_json::to_string(&inner) {
        *v = Value::String(s);
    }
}

fn mask_if(v: Option<&mut Value>, shape: impl Fn(&Value) -> bool) {
    if let Some(v) = v {
        if shape(v) {
            *v = Value::String(MASK.into());
        }
    }
}

fn is_uuid(v: &Value) -> bool {
    v.as_str().is_some_and(uuid)
}

/// A UUID, or a UUID and `:N` (Codex's window ids).
fn is_id(v: &Value) -> bool {
    v.as_str().is_some_and(|s| match s.split_once(':') {
        Some((id, n)) => uuid(id) && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()),
        None => uuid(s),
    })
}

fn uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codex_body(id: &str, session: &str, prompt: &str) -> Vec<u8> {
        let turn = serde_json::json!({"session_id": session, "turn_started_at_unix_ms": 17,
                                      "window_id": format!("{session}:0"), "model": "m"});
        serde_json::to_vec(&serde_json::json!({
            "model": "gpt", "prompt_cache_key": session,
            "client_metadata": {"session_id": session, "x-codex-window-id": format!("{session}:0"),
                                "x-codex-turn-metadata": turn.to_string()},
            "input": [{"type": "message", "id": format!("msg_{id}"), "role": "user",
                       "content": [{"type": "input_text",
                                    "text": format!("{prompt} /tmp/metash-spawn-{}/codex", &id[..6])}]}]
        }))
        .expect("json")
    }

    const A: &str = "01a21c33-86af-79c1-a055-0911b5f4aa6c";
    const B: &str = "9cc0d30f-74f4-5a07-9a5c-ac3335440d65";

    #[test]
    fn codex_ids_and_clock_are_masked_but_not_the_prompt() {
        let v = Volatile::Codex;
        let one = codex_body(A, A, "Write a.txt");
        let two = codex_body(B, B, "Write a.txt");
        assert_ne!(one, two);
        assert_eq!(v.normalize(&one), v.normalize(&two));
        let other = codex_body(B, B, "Write b.txt");
        assert_ne!(v.normalize(&one), v.normalize(&other));
        // Not a UUID where one is expected: not masked, so it still differs.
        let odd = codex_body(A, "not-a-uuid", "Write a.txt");
        assert_ne!(v.normalize(&one), v.normalize(&odd));
        // pi's bodies are compared as they are.
        assert_ne!(
            Volatile::None.normalize(&one),
            Volatile::None.normalize(&two)
        );
    }

    #[test]
    fn a_codex_tool_outputs_chunk_id_and_wall_time_are_masked_but_not_its_output() {
        let head = |c: &str, w: &str, o: &str| {
            codex_output_head(&format!(
                "Chunk ID: {c}\nWall time: {w} seconds\nProcess exited with code 0\nOutput:\n{o}"
            ))
        };
        assert_eq!(head("28f53b", "0.0012", "x"), head("f9dc5e", "0.0000", "x"));
        assert_ne!(head("28f53b", "0.0012", "x"), head("28f53b", "0.0012", "y"));
        assert!(head("zz", "0.1", "x").is_none());
    }

    #[test]
    fn claude_code_user_id_is_masked_but_not_the_role() {
        let body = |device: &str, session: &str, role: &str| {
            let user = serde_json::json!({"device_id": device, "session_id": session});
            serde_json::to_vec(&serde_json::json!({"model": "claude",
                "metadata": {"user_id": user.to_string()},
                "messages": [{"role": role, "content": "hi"}]}))
            .expect("json")
        };
        let v = Volatile::for_frontend("agent-sdk");
        let (d1, d2) = ("a".repeat(64), "b".repeat(64));
        assert_eq!(
            v.normalize(&body(&d1, A, "user")),
            v.normalize(&body(&d2, A, "user"))
        );
        assert_ne!(
            v.normalize(&body(&d1, A, "user")),
            v.normalize(&body(&d1, A, "assistant"))
        );
        // The session is pinned, not masked: another one is a difference.
        assert_ne!(
            v.normalize(&body(&d1, A, "user")),
            v.normalize(&body(&d1, B, "user"))
        );
        assert_eq!(claude_session_id(&body(&d1, A, "user")).as_deref(), Some(A));
        assert_eq!(claude_session_id(&body(&d1, "not-a-uuid", "user")), None);
        assert_eq!(claude_session_id(b"{}"), None);
    }

    #[test]
    fn only_the_spawn_dirs_random_part_is_masked() {
        assert_eq!(
            mask_spawn_dir("/tmp/metash-spawn-KqIxMl/codex and metash-spawn-abc"),
            "/tmp/metash-spawn-******/codex and metash-spawn-abc"
        );
        assert_eq!(
            mask_spawn_dir("metash-spawn-abcdefg"),
            "metash-spawn-abcdefg"
        );
    }
}
