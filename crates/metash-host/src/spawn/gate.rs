//! The host's answer to the runtime's live questions: consent per action. The runtime holds a
//! proxied connection or an `execve` and asks; this gate turns the action into a capability
//! request and runs it through the policy (declared? granted? revoked? sensitive, so ask?), using
//! the same prompter as the agent's own `consent_request`s, one question at a time.
//!
//! What an agent brings while it runs (its `consent_request`s, its connections and process
//! starts, a CLI's tool uses) is bounded per agent before anyone is asked (issue 31): at most
//! `[host] consent_max_pending` different questions waiting at once and `consent_per_minute`
//! asked in any minute; past either the request is refused at once with a reason
//! (`consent_too_many_pending`, `consent_rate_limited`). The same question (agent, capability,
//! reason) brought again while it waits is not asked twice: every caller gets its one answer.
//! Questions a rule answers at once (the policy file, `--yes-to`, nobody to ask) are not counted.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use metash_policy::{
    Authorization, CapabilityRequest, ConsentPrompter, ConsentQuestion, Decision, DenyCode, Policy,
};
use metash_protocol::{AgentEvent, LogKind};
use metash_runtime::{ActionGate, EventSink, GateVerdict, GatedAction};
use serde_json::json;

use crate::asks::{QuestionLimits, Questions, Refusal, Turn};

/// One prompter shared by everything that may ask during a spawn (the proxy's threads, the exec
/// supervisor, the invocation's own `consent_request`s), so questions never interleave.
pub(crate) type SharedPrompter = Arc<Mutex<Box<dyn ConsentPrompter + Send>>>;

pub(crate) struct PolicyGate {
    pub policy: Arc<Policy>,
    pub prompter: SharedPrompter,
    /// The same kind of prompter, never asked: what its rules answer at once (not counted).
    rules: Mutex<Box<dyn ConsentPrompter + Send>>,
    questions: Arc<Questions<Authorization>>,
    limits: QuestionLimits,
    sink: Arc<dyn EventSink>,
}

/// Every project's questions in this process, shared by all its spawns (so the cap and rate
/// hold per agent across spawns, not per spawn), without threading them through the host.
pub(super) fn questions_of(meta: PathBuf) -> Arc<Questions<Authorization>> {
    static ALL: OnceLock<Mutex<HashMap<PathBuf, Arc<Questions<Authorization>>>>> = OnceLock::new();
    let mut all = ALL
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    Arc::clone(all.entry(meta).or_default())
}

/// A denial the agent is told about with `code` (the policy's own codes, or the limits').
fn denied(code: &str, message: String, hint: Option<String>) -> Authorization {
    Authorization::Denied {
        code: DenyCode::ConsentDenied,
        message: message.clone(),
        hint: hint.clone(),
        event: AgentEvent::Error {
            code: code.into(),
            message,
            hint,
        },
    }
}

impl PolicyGate {
    /// A gate for one spawn of the host's project, under `policy`, with the host's prompter.
    pub fn new(host: &crate::host::Host, policy: Policy) -> Self {
        Self {
            policy: Arc::new(policy),
            prompter: Arc::new(Mutex::new(host.prompter())),
            rules: Mutex::new(host.prompter()),
            questions: questions_of(host.store().meta_dir().to_path_buf()),
            limits: host.config().host.consent_limits(),
            sink: host.event_sink(),
        }
    }

    /// [`Policy::authorize`] under the shared prompter; a poisoned prompter or a store error is a
    /// deny (fail closed). Not bounded: the host's own questions (a spawn's grants at its start).
    pub fn authorize(&self, agent: &str, req: &CapabilityRequest) -> Authorization {
        let mut guard = match self.prompter.lock() {
            Ok(g) => g,
            Err(_) => {
                return denied(
                    "consent_denied",
                    "the consent prompter failed earlier".into(),
                    None,
                )
            }
        };
        let result = self.policy.authorize(agent, req, guard.as_mut());
        drop(guard);
        // The store could not record the question: nobody was asked, so deny.
        result.unwrap_or_else(|e| {
            denied(
                "consent_denied",
                format!("consent could not be recorded: {e}"),
                None,
            )
        })
    }

    /// [`Self::authorize`] for what an agent brings while it runs: within its cap and rate, the
    /// same waiting question asked once (see the module doc).
    pub fn authorize_asked(&self, agent: &str, req: &CapabilityRequest) -> Authorization {
        let mut q =
            ConsentQuestion::new(agent, req.capability.clone(), &req.reason, req.duration_s);
        q.sensitive = req.sensitive;
        // Answered at once by a rule, or by a grant (or refused) without asking: nothing to bound.
        let by_rule = self
            .rules
            .lock()
            .map(|r| r.by_rule(&q).is_some())
            .unwrap_or(false);
        if by_rule || !matches!(self.policy.check(agent, req), Ok(Decision::Ask)) {
            return self.authorize(agent, req);
        }
        let capability = req.capability.to_string();
        match self
            .questions
            .enter(agent, &capability, &req.reason, self.limits)
        {
            Turn::Ask(lead) => {
                let answer = self.authorize(agent, req);
                lead.finish(answer.clone());
                answer
            }
            Turn::Join(slot) => slot.wait().unwrap_or_else(|| {
                denied(
                    "consent_denied",
                    "the same question, asked first elsewhere, got no answer".into(),
                    None,
                )
            }),
            Turn::Refused(why) => self.refuse(agent, &capability, why),
        }
    }

    /// A question refused by the limits: on record (`limit_exceeded`), and the agent told why.
    fn refuse(&self, agent: &str, capability: &str, why: Refusal) -> Authorization {
        let message = why.message(agent);
        self.sink.record(
            LogKind::LimitExceeded,
            Some(agent),
            json!({"limit": why.code(), "capability": capability, "message": message,
                   "max_pending": self.limits.max_pending, "per_minute": self.limits.per_minute}),
        );
        denied(why.code(), message, Some(why.hint().into()))
    }
}

/// The request the policy sees for a gated action.
pub(crate) fn request_for(action: &GatedAction<'_>) -> CapabilityRequest {
    match action {
        GatedAction::Connect {
            host,
            port,
            method,
            write,
        } => CapabilityRequest::network(
            host,
            *write,
            if *method == "CONNECT" {
                format!("open a tunnel to {host}:{port} (it may send data)")
            } else {
                format!("{method} http://{host}:{port}")
            },
        ),
        GatedAction::Exec { program, argv } => {
            CapabilityRequest::process_spawn(program, format!("run `{}`", argv.join(" ")))
        }
    }
}

impl ActionGate for PolicyGate {
    fn decide(&self, agent: &str, action: &GatedAction<'_>) -> GateVerdict {
        match self.authorize_asked(agent, &request_for(action)) {
            Authorization::Allowed { .. } => GateVerdict::Allow,
            Authorization::Denied {
                code,
                message,
                hint,
                event,
            } => GateVerdict::Deny {
                code: match event {
                    AgentEvent::Error { code, .. } => code,
                    _ => code.as_str().to_string(),
                },
                message,
                hint,
            },
        }
    }
}
