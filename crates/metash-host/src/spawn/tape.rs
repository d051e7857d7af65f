//! The turn's tape (issue 36, docs/replay.md): the credential proxy hands every exchange of a
//! CLI role's turn, already redacted, to this recorder on its recording thread (never the
//! thread serving the CLI), which writes the bodies at once as content-addressed blobs under
//! `.meta/tapes/blobs/`; when the turn ends the turn's index is written as
//! `.meta/tapes/<id>.json` with a `tape` record in the log naming the agent, task and attempt.
//! On unless `[record] enabled = false`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use metash_protocol::LogKind;
use metash_runtime::credential::{Cassette, Exchange, Recorded, Recorder, StreamEnd, Volatile};
use metash_store::tape::{Tape, TapeExchange, TapeSpawn, Tapes, TAPE_SCHEMA_VERSION};
use serde_json::json;

use crate::config::Role;
use crate::host::Host;
use crate::spawner::SpawnRequest;

/// The exchanges of one turn, as the proxy delivers them (on its recording thread, never the
/// one serving the CLI): each body is written as a blob at once, so memory holds only what the
/// tape's index needs and a turn's bodies are not all kept until it ends.
struct Reel {
    store: metash_store::Store,
    started: SystemTime,
    stored: Mutex<Stored>,
}

#[derive(Default)]
struct Stored {
    exchanges: Vec<(SystemTime, u64, TapeExchange)>,
    /// The first blob that could not be written; the tape is then not saved.
    error: Option<String>,
}

impl Recorder for Reel {
    fn exchange(&self, ex: Exchange) {
        let key = (ex.started, ex.exchange);
        let stored = to_tape(&Tapes::new(&self.store), self.started, ex);
        let mut s = self.stored.lock().unwrap_or_else(PoisonError::into_inner);
        match stored {
            Ok(e) => s.exchanges.push((key.0, key.1, e)),
            Err(e) => {
                s.error.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

/// Saves the turn's tape, if it was recorded. Called once the proxy is dropped: stopping it
/// ends every exchange and delivers its recording, so the tape is whole.
pub(crate) fn save(tape: Option<TurnTape>, host: &Host) {
    if let Some(tape) = tape {
        tape.save(host);
    }
}

/// One exchange as the tape holds it, its bodies written as blobs. `seq` is set when saved.
fn to_tape(
    tapes: &Tapes<'_>,
    tape_start: SystemTime,
    ex: Exchange,
) -> metash_store::Result<TapeExchange> {
    let at_ms = ex
        .started
        .duration_since(tape_start)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Ok(TapeExchange {
        seq: 0,
        route: ex.route,
        method: ex.method,
        target: ex.target,
        at_ms,
        request_headers: ex.request_headers,
        request_body: tapes.put_blob(&ex.request_body, ex.request_truncated)?,
        status: ex.status,
        response_headers: ex.response_headers,
        head_ms: ex.head_ms,
        chunks: ex
            .chunks
            .iter()
            .map(|c| (c.offset_ms, c.len as u64))
            .collect(),
        response_body: tapes.put_blob(&ex.response_body, ex.response_truncated)?,
        end: end_name(ex.end).to_string(),
        duration_ms: ex.duration_ms,
    })
}

/// A turn being recorded: who ran it, and the reel the proxy feeds.
pub(crate) struct TurnTape {
    reel: Arc<Reel>,
    agent: String,
    frontend: String,
    task: Option<String>,
    attempt: Option<u32>,
    session_id: Option<String>,
    /// `None` for an interactive session (`for_session`): nothing `metash replay` can run.
    spawn: Option<TapeSpawn>,
}

impl TurnTape {
    /// A recorder for this spawn's turn, or `None` when `[record]` turns recording off or the
    /// turn is itself a replay. (An API role's client is sent through the proxy when its turn
    /// is recorded: `model.rs`.)
    pub fn new(host: &Host, req: &SpawnRequest, role: &Role) -> Option<Self> {
        if !host.config().record.enabled() || host.replaying().is_some() {
            return None;
        }
        let state = host.store().state().ok();
        let attempt = req.task_id.as_deref().and_then(|task| {
            let running = state.as_ref()?.variables.get("metash")?.get("running")?;
            let a = running.get(task)?.get("attempt")?.as_u64()?;
            u32::try_from(a).ok()
        });
        // The prompts are the host's, not the proxy's: masked here as the proxy masks requests.
        let secrets = super::key_proxy::secrets(host);
        Some(Self {
            reel: Arc::new(Reel {
                store: host.store().clone(),
                started: SystemTime::now(),
                stored: Mutex::default(),
            }),
            agent: req.agent_name.clone(),
            frontend: role.frontend_name().to_string(),
            task: req.task_id.clone(),
            attempt,
            session_id: state.map(|s| s.session_id),
            spawn: Some(TapeSpawn {
                system_prompt: masked(&req.system_prompt, &secrets),
                user_message: masked(&req.user_message, &secrets),
                options: serde_json::to_value(&req.options).unwrap_or_default(),
                // As the CLI is given it (model.rs: resolved by `check_workdir`).
                workdir: req
                    .workdir
                    .clone()
                    .unwrap_or_else(|| host.workspace())
                    .canonicalize()
                    .ok()
                    .map(|p| p.to_string_lossy().into_owned()),
            }),
        })
    }

    /// A recorder for an interactive session's CLI (`metash session`, `interactive.rs`): no
    /// task, the session's id as the tape's `session_id`, no spawn to replay. `None` when
    /// `[record]` turns recording off.
    pub fn for_session(host: &Host, role: &str, frontend: &str, session: &str) -> Option<Self> {
        if !host.config().record.enabled() {
            return None;
        }
        Some(Self {
            reel: Arc::new(Reel {
                store: host.store().clone(),
                started: SystemTime::now(),
                stored: Mutex::default(),
            }),
            agent: role.to_string(),
            frontend: frontend.to_string(),
            task: None,
            attempt: None,
            session_id: Some(session.to_string()),
            spawn: None,
        })
    }

    /// What the proxy's config takes.
    pub fn recorder(&self) -> Arc<dyn Recorder> {
        Arc::clone(&self.reel) as Arc<dyn Recorder>
    }

    /// Writes the tape's index and its `tape` record (after the proxy stopped, so every
    /// exchange has been delivered). A turn that exchanged nothing stores nothing. A failure is
    /// logged as an `error` record and does not fail the turn: the turn's work is worth more
    /// than its recording.
    pub fn save(self, host: &Host) {
        self.save_in(host.store());
    }

    /// [`Self::save`], given the store (an interactive session's launcher holds no host).
    pub fn save_in(self, store: &metash_store::Store) {
        let stored = std::mem::take(
            &mut *self
                .reel
                .stored
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        if stored.exchanges.is_empty() && stored.error.is_none() {
            return;
        }
        let saved = match stored.error {
            Some(e) => Err(e),
            None => self
                .index(&Tapes::new(store), stored.exchanges)
                .map_err(|e| e.to_string()),
        };
        if let Err(e) = saved {
            let _ = store.append(
                LogKind::Error,
                Some(&self.agent),
                json!({"what": "tape", "error": e}),
            );
        }
    }

    fn index(
        &self,
        tapes: &Tapes<'_>,
        mut exchanges: Vec<(SystemTime, u64, TapeExchange)>,
    ) -> metash_store::Result<u64> {
        // In the order the requests came (the order a replay will see them).
        exchanges.sort_by_key(|(started, n, _)| (*started, *n));
        let exchanges = exchanges
            .into_iter()
            .enumerate()
            .map(|(i, (_, _, mut e))| {
                e.seq = u32::try_from(i + 1).unwrap_or(u32::MAX);
                e
            })
            .collect();
        let tape = Tape {
            schema_version: TAPE_SCHEMA_VERSION,
            id: Tapes::new_id(&self.agent),
            session_id: self.session_id.clone(),
            agent: self.agent.clone(),
            frontend: Some(self.frontend.clone()),
            task: self.task.clone(),
            attempt: self.attempt,
            started_at: rfc3339(self.reel.started),
            ended_at: rfc3339(SystemTime::now()),
            exchanges,
            spawn: self.spawn.clone(),
        };
        tapes.save(&tape)
    }
}

/// The tape `id` as a cassette the credential proxy answers from (`ProxyConfig::replay`): each
/// exchange's request and its response cut into the chunks it arrived in.
///
/// # Errors
/// No such tape, or a blob is missing or damaged.
pub fn cassette(store: &metash_store::Store, id: &str) -> metash_store::Result<Cassette> {
    cassette_with(store, id, &Pins::default())
}

/// What a replay puts in place of the recorded values that differ from run to run by design
/// (docs/replay.md, "What a replay pins"): every occurrence of `from` in the recorded requests
/// and responses becomes `to`, before they are compared with, or sent to, the agent.
#[derive(Debug, Clone, Default)]
pub struct Pins {
    pub rewrites: Vec<(Vec<u8>, Vec<u8>)>,
}

/// [`cassette`], its recorded bodies rewritten by `pins`. A rewritten response is sent as one
/// chunk, without its recorded `Content-Length`. Requests are compared with the run-varying
/// fields of the tape's CLI masked ([`Volatile::for_frontend`]).
///
/// # Errors
/// As [`cassette`].
pub fn cassette_with(
    store: &metash_store::Store,
    id: &str,
    pins: &Pins,
) -> metash_store::Result<Cassette> {
    let tapes = Tapes::new(store);
    let tape = tapes.get(id)?;
    let mut recorded = Vec::with_capacity(tape.exchanges.len());
    for e in tape.exchanges {
        let request = pins.apply(tapes.blob(&e.request_body.sha256)?);
        let original = tapes.blob(&e.response_body.sha256)?;
        let response = pins.apply(original.clone());
        let mut headers = e.response_headers;
        let lens: Vec<usize> = if response == original {
            e.chunks
                .iter()
                .map(|c| usize::try_from(c.1).unwrap_or(usize::MAX))
                .collect()
        } else {
            headers.retain(|(k, _)| !k.eq_ignore_ascii_case("content-length"));
            vec![response.len()]
        };
        recorded.push(Recorded::new(
            (e.method, e.target, request),
            e.status,
            headers,
            response,
            &lens,
        ));
    }
    let volatile = tape
        .frontend
        .as_deref()
        .map_or(Volatile::None, Volatile::for_frontend);
    Ok(Cassette::new(recorded).with_volatile(volatile))
}

impl Pins {
    fn apply(&self, mut bytes: Vec<u8>) -> Vec<u8> {
        for (from, to) in &self.rewrites {
            if from.is_empty() || from == to {
                continue;
            }
            bytes = replace_all(&bytes, from, to);
        }
        bytes
    }
}

fn replace_all(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

/// `text` with every occurrence of each secret overwritten with `*` of the same length (as the
/// proxy masks what it records, so a replay's requests still match the recorded ones).
fn masked(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    for s in secrets.iter().filter(|s| !s.is_empty()) {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), &"*".repeat(s.len()));
        }
    }
    out
}

fn end_name(end: StreamEnd) -> &'static str {
    match end {
        StreamEnd::Complete => "complete",
        StreamEnd::UpstreamError => "upstream_error",
        StreamEnd::ClientGone => "client_gone",
        StreamEnd::Withdrawn => "withdrawn",
    }
}

fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
