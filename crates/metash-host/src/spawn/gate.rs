//! The host's answer to the runtime's live questions: consent per action. The runtime holds a
//! proxied connection or an `execve` and asks; this gate turns the action into a capability
//! request and runs it through the policy (declared? granted? revoked? sensitive, so ask?), using
//! the same prompter as the agent's own `consent_request`s, one question at a time.

use std::sync::{Arc, Mutex};

use metash_policy::{Authorization, CapabilityRequest, ConsentPrompter, DenyCode, Policy};
use metash_protocol::AgentEvent;
use metash_runtime::{ActionGate, GateVerdict, GatedAction};

/// One prompter shared by everything that may ask during a spawn (the proxy's threads, the exec
/// supervisor, the invocation's own `consent_request`s), so questions never interleave.
pub(crate) type SharedPrompter = Arc<Mutex<Box<dyn ConsentPrompter + Send>>>;

pub(crate) struct PolicyGate {
    pub policy: Arc<Policy>,
    pub prompter: SharedPrompter,
}

impl PolicyGate {
    /// [`Policy::authorize`] under the shared prompter; a poisoned prompter or a store error is a
    /// deny (fail closed).
    pub fn authorize(&self, agent: &str, req: &CapabilityRequest) -> Authorization {
        let denied = |message: String| Authorization::Denied {
            code: DenyCode::ConsentDenied,
            message: message.clone(),
            hint: None,
            event: AgentEvent::Error {
                code: "consent_denied".into(),
                message,
                hint: None,
            },
        };
        let mut guard = match self.prompter.lock() {
            Ok(g) => g,
            Err(_) => return denied("the consent prompter failed earlier".into()),
        };
        let result = self.policy.authorize(agent, req, guard.as_mut());
        drop(guard);
        // The store could not record the question: nobody was asked, so deny.
        result.unwrap_or_else(|e| denied(format!("consent could not be recorded: {e}")))
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
        match self.authorize(agent, &request_for(action)) {
            Authorization::Allowed { .. } => GateVerdict::Allow,
            Authorization::Denied {
                code,
                message,
                hint,
                ..
            } => GateVerdict::Deny {
                code: code.as_str().to_string(),
                message,
                hint,
            },
        }
    }
}
