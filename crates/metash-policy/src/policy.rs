//! The decision the host makes before every mediated action: default deny, allowed only when the
//! manifest declares the capability AND an unexpired grant covers it; sensitive actions ask every
//! time (unless a grant explicitly covers sensitive use). Undeclared capabilities are refused
//! without asking anyone: the manifest is the agent's contract, consent cannot widen it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use metash_protocol::LogKind;

use metash_protocol::AgentEvent;
use metash_store::{NewEvent, Store};
use serde::Serialize;
use serde_json::{json, Value};

use crate::capability::{Capability, Category};
use crate::clock::Clock;
use crate::consent::{self, Grant};
use crate::error::{PolicyError, Result};
use crate::prompt::{Answer, ConsentPrompter, ConsentQuestion};
use crate::registry::Registry;

pub use crate::question::Sensitive;

/// What an agent wants to do, as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityRequest {
    pub capability: Capability,
    pub sensitive: Option<Sensitive>,
    /// Shown to the person asked, and logged.
    pub reason: String,
    /// The grant length to suggest when asking.
    pub duration_s: Option<u64>,
}

impl CapabilityRequest {
    pub fn new(capability: Capability, reason: impl Into<String>) -> Self {
        Self {
            capability,
            sensitive: None,
            reason: reason.into(),
            duration_s: None,
        }
    }

    /// Parses `capability` (`network:api.github.com`, ...).
    ///
    /// # Errors
    /// [`PolicyError::InvalidCapability`].
    pub fn parse(capability: &str, reason: impl Into<String>) -> Result<Self> {
        let cap = capability
            .parse()
            .map_err(|reason| PolicyError::InvalidCapability {
                capability: capability.to_string(),
                reason,
            })?;
        Ok(Self::new(cap, reason))
    }

    /// An outbound request to `host`; `write` (POST, PUT, DELETE, ...) makes it sensitive.
    pub fn network(host: &str, write: bool, reason: impl Into<String>) -> Self {
        let mut r = Self::new(
            Capability::new(Category::Network, Some(&host.to_ascii_lowercase())),
            reason,
        );
        if write {
            r.sensitive = Some(Sensitive::NetworkWrite);
        }
        r
    }

    /// Reading `path` (absolute, or relative to `workspace`). Paths are taken as already
    /// normalised by the caller (no `..`), as the runtime's path resolution does.
    pub fn files_read(workspace: &Path, path: &Path, reason: impl Into<String>) -> Self {
        let (scope, _) = file_scope(workspace, path);
        Self::new(
            Capability::new(Category::FilesRead, scope.as_deref()),
            reason,
        )
    }

    /// Writing `path` (absolute, or relative to `workspace`); a path outside the workspace makes
    /// it sensitive.
    pub fn files_write(workspace: &Path, path: &Path, reason: impl Into<String>) -> Self {
        let (scope, outside) = file_scope(workspace, path);
        let mut r = Self::new(
            Capability::new(Category::FilesWrite, scope.as_deref()),
            reason,
        );
        if outside {
            r.sensitive = Some(Sensitive::WriteOutsideWorkspace);
        }
        r
    }

    /// Starting the external program `program`: always sensitive.
    pub fn process_spawn(program: &str, reason: impl Into<String>) -> Self {
        let mut r = Self::new(
            Capability::new(Category::ProcessSpawn, Some(program)),
            reason,
        );
        r.sensitive = Some(Sensitive::ProcessSpawn);
        r
    }

    /// Running the agent natively (outside the WASM sandbox): always sensitive.
    pub fn native_exec(reason: impl Into<String>) -> Self {
        let mut r = Self::new(Capability::new(Category::Native, None), reason);
        r.sensitive = Some(Sensitive::NativeExec);
        r
    }

    /// The request an agent made with a `consent_request` event (`None` for any other event).
    ///
    /// # Errors
    /// [`PolicyError::InvalidCapability`] when the agent named no valid capability.
    pub fn from_agent_event(event: &AgentEvent) -> Option<Result<Self>> {
        let AgentEvent::ConsentRequest {
            capability,
            reason,
            duration_s,
        } = event
        else {
            return None;
        };
        Some(Self::parse(capability, reason.clone()).map(|mut r| {
            r.duration_s = *duration_s;
            r
        }))
    }

    pub fn sensitive(mut self, s: Sensitive) -> Self {
        self.sensitive = Some(s);
        self
    }
}

/// The scope of a file request: workspace-relative inside the workspace (`None` for the
/// workspace itself, i.e. all of it), the absolute path outside it; and whether it is outside.
fn file_scope(workspace: &Path, path: &Path) -> (Option<String>, bool) {
    let (scope, outside) = if path.is_absolute() {
        match path.strip_prefix(workspace) {
            Ok(rel) => (rel.to_string_lossy().into_owned(), false),
            Err(_) => (path.to_string_lossy().into_owned(), true),
        }
    } else {
        (path.to_string_lossy().into_owned(), false)
    };
    let trimmed = if outside {
        scope.as_str()
    } else {
        scope.trim_end_matches('/')
    };
    let trimmed = trimmed.strip_prefix("./").unwrap_or(trimmed);
    if trimmed.is_empty() || trimmed == "." {
        (None, outside)
    } else {
        (Some(trimmed.to_string()), outside)
    }
}

/// Stable refusal codes, as they appear in `error` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DenyCode {
    UnknownAgent,
    CapabilityUndeclared,
    ConsentRevoked,
    ConsentDenied,
}

impl DenyCode {
    pub fn as_str(self) -> &'static str {
        match self {
            DenyCode::UnknownAgent => "unknown_agent",
            DenyCode::CapabilityUndeclared => "capability_undeclared",
            DenyCode::ConsentRevoked => "consent_revoked",
            DenyCode::ConsentDenied => "consent_denied",
        }
    }
}

/// The outcome of [`Policy::check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A live grant covers the request.
    Allow { grant: Box<Grant> },
    /// Refused; never ask about it.
    Deny {
        code: DenyCode,
        message: String,
        hint: String,
    },
    /// Declared but not (or no longer) granted, or sensitive: ask someone.
    Ask,
}

impl Decision {
    pub fn is_allow(&self) -> bool {
        matches!(self, Decision::Allow { .. })
    }
}

/// The outcome of [`Policy::authorize`].
#[derive(Debug, Clone, PartialEq)]
pub enum Authorization {
    /// Go ahead. `expires_at` is the grant's expiry, `None` for a one-action answer.
    Allowed { expires_at: Option<String> },
    /// The `error` event to send the agent (it is already in the ledger).
    Denied {
        code: DenyCode,
        message: String,
        hint: Option<String>,
        event: AgentEvent,
    },
}

impl Authorization {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Authorization::Allowed { .. })
    }

    /// The event to send the agent: `consent_grant {capability, expires_at}` or the `error`.
    pub fn to_event(&self, capability: &Capability) -> AgentEvent {
        match self {
            Authorization::Allowed { expires_at } => AgentEvent::ConsentGrant {
                capability: capability.to_string(),
                expires_at: expires_at.clone(),
            },
            Authorization::Denied { event, .. } => event.clone(),
        }
    }
}

/// The policy of one project: its registry, its store (for grants and the ledger) and a clock.
#[derive(Debug)]
pub struct Policy {
    store: Store,
    registry: Registry,
    clock: Arc<dyn Clock>,
    /// Agents declared by the user's `.meta/config.toml` rather than a manifest (model roles that
    /// run a CLI): what each declares. The user wrote them, so a declaration here is as good as a
    /// manifest's; consent is still asked and recorded like any other agent's.
    roles: std::collections::BTreeMap<String, Vec<Capability>>,
}

impl Policy {
    pub fn new(store: Store, registry: Registry) -> Self {
        Self {
            clock: crate::clock::for_store(&store),
            store,
            registry,
            roles: std::collections::BTreeMap::new(),
        }
    }

    /// What `agent` declared, and where (for hints): its manifest, else its config role.
    fn declared(&self, agent: &str) -> Option<(&[Capability], String)> {
        match (self.registry.get(agent), self.roles.get(agent)) {
            (Some(a), _) => Some((
                a.declared.as_slice(),
                format!("`capabilities` in {}", a.manifest_path.display()),
            )),
            (None, Some(caps)) => Some((
                caps.as_slice(),
                format!(
                    "a manifest (`{agent}` is a role of .meta/config.toml, which runs a CLI and \
                     can only be granted `native`)"
                ),
            )),
            (None, None) => None,
        }
    }

    /// Declares a config role as an agent with `declared` capabilities (see [`Policy`]'s `roles`).
    /// A registered agent of the same name keeps its manifest's declarations.
    pub fn with_role(mut self, name: &str, declared: Vec<Capability>) -> Self {
        self.roles.insert(name.to_string(), declared);
        self
    }

    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The decision for `req` now, reading the persisted grants (so another process's grant or
    /// revocation counts at once). Pure: writes nothing; [`Policy::authorize`] logs and asks.
    ///
    /// # Errors
    /// Store I/O or an unreadable consent document (callers must treat an error as deny).
    pub fn check(&self, agent: &str, req: &CapabilityRequest) -> Result<Decision> {
        let Some((declared, declared_in)) = self.declared(agent) else {
            return Ok(Decision::Deny {
                code: DenyCode::UnknownAgent,
                message: format!("no agent `{agent}` is registered"),
                hint: "see `metash agents list`".into(),
            });
        };
        if !declared.iter().any(|d| d.covers(&req.capability)) {
            return Ok(Decision::Deny {
                code: DenyCode::CapabilityUndeclared,
                message: format!("agent `{agent}` did not declare `{}`", req.capability),
                hint: format!(
                    "add \"{}\" to {declared_in} (undeclared capabilities are refused without asking)",
                    req.capability,
                ),
            });
        }
        let grants = consent::load_for(&self.store, agent)?;
        let now = self.clock.now();
        let relevant: Vec<&Grant> = grants
            .iter()
            .filter(|g| g.capability.covers(&req.capability))
            .collect();
        // The latest revocation covering the request: a grant only counts if made after it, so
        // revoking `network:x.com` holds even while an older, broader `network` grant is live.
        let revoked = relevant
            .iter()
            .filter(|g| g.revoked_at.is_some())
            .max_by_key(|g| g.seq)
            .copied();
        let live = relevant.iter().find(|g| {
            g.active_at(now)
                && (req.sensitive.is_none() || g.sensitive)
                && revoked.is_none_or(|r| g.seq > r.seq)
        });
        if let Some(g) = live {
            return Ok(Decision::Allow {
                grant: Box::new((*g).clone()),
            });
        }
        if let Some(g) = revoked {
            return Ok(Decision::Deny {
                code: DenyCode::ConsentRevoked,
                message: format!(
                    "consent for `{}` was revoked at {}",
                    g.capability,
                    g.revoked_at.as_deref().unwrap_or("?")
                ),
                hint: format!(
                    "continue without it, or ask the user to run `metash consent grant {agent} {}`",
                    req.capability
                ),
            });
        }
        Ok(Decision::Ask)
    }

    /// [`Policy::check`], then, if someone must be asked, a `consent_request` event, the
    /// prompter's answer (`consent_answer`, and `consent_grant` for "allow for N seconds"), and for
    /// every refusal an `error` event, all in the ledger. Never blocks beyond the prompter.
    ///
    /// # Errors
    /// Store I/O (callers must treat an error as deny).
    pub fn authorize(
        &self,
        agent: &str,
        req: &CapabilityRequest,
        prompter: &mut dyn ConsentPrompter,
    ) -> Result<Authorization> {
        match self.check(agent, req)? {
            Decision::Allow { grant } => Ok(Authorization::Allowed {
                expires_at: Some(grant.expires_at),
            }),
            Decision::Deny {
                code,
                message,
                hint,
            } => self.deny(agent, req, code, message, hint),
            Decision::Ask => self.ask(agent, req, prompter),
        }
    }

    /// Asks `prompter`, with the request and the answer in the ledger; a time-bounded answer
    /// becomes a grant, a denial a refusal the agent can act on.
    fn ask(
        &self,
        agent: &str,
        req: &CapabilityRequest,
        prompter: &mut dyn ConsentPrompter,
    ) -> Result<Authorization> {
        let request_id = uuid::Uuid::new_v4().to_string();
        self.store.append(
            LogKind::ConsentRequest,
            Some(agent),
            json!({
                "request_id": request_id,
                "capability": req.capability,
                "reason": req.reason,
                "duration_s": req.duration_s,
                "sensitive": req.sensitive,
                "prompter": prompter.name(),
            }),
        )?;
        let question = ConsentQuestion {
            agent: agent.to_string(),
            agent_name: self
                .registry
                .get(agent)
                .map(|a| a.manifest.name.clone())
                .unwrap_or_default(),
            capability: req.capability.clone(),
            reason: req.reason.clone(),
            sensitive: req.sensitive,
            duration_s: req.duration_s,
        };
        let answer = prompter.ask(&question);
        let answer_event = |a: &str, d: Option<u64>| {
            NewEvent::new(
                LogKind::ConsentAnswer,
                Some(agent),
                json!({"request_id": request_id, "capability": req.capability, "answer": a, "duration_s": d, "by": prompter.name()}),
            )
        };
        match answer {
            Answer::AllowOnce => {
                self.store
                    .append_batch(&[answer_event("allow_once", None)])?;
                Ok(Authorization::Allowed { expires_at: None })
            }
            Answer::AllowFor(secs) => {
                self.store
                    .append_batch(&[answer_event("allow_for", Some(secs))])?;
                let g = consent::grant(
                    &self.store,
                    self.clock.now(),
                    agent,
                    &req.capability,
                    consent::Terms {
                        duration_s: secs,
                        sensitive: req.sensitive.is_some(),
                        source: prompter.name(),
                    },
                )?;
                Ok(Authorization::Allowed {
                    expires_at: Some(g.expires_at),
                })
            }
            Answer::Deny => {
                self.store.append_batch(&[answer_event("deny", None)])?;
                self.deny(
                    agent,
                    req,
                    DenyCode::ConsentDenied,
                    format!("consent for `{}` was denied", req.capability),
                    "continue without it; the user can grant it with `metash consent grant`".into(),
                )
            }
        }
    }

    fn deny(
        &self,
        agent: &str,
        req: &CapabilityRequest,
        code: DenyCode,
        message: String,
        hint: String,
    ) -> Result<Authorization> {
        self.store.append(
            LogKind::Error,
            Some(agent),
            json!({"code": code.as_str(), "message": message, "hint": hint, "capability": req.capability, "sensitive": req.sensitive}),
        )?;
        Ok(Authorization::Denied {
            code,
            event: AgentEvent::Error {
                code: code.as_str().to_string(),
                message: message.clone(),
                hint: Some(hint.clone()),
            },
            message,
            hint: Some(hint),
        })
    }

    /// Grants `capability` to `agent` for `duration_s` seconds (the CLI's `consent grant`).
    ///
    /// # Errors
    /// [`PolicyError::UnknownAgent`], [`PolicyError::Undeclared`] (consent cannot widen a
    /// manifest), store errors.
    pub fn grant(
        &self,
        agent: &str,
        capability: &Capability,
        duration_s: u64,
        sensitive: bool,
        source: &str,
    ) -> Result<Grant> {
        let (declared, declared_in) = self
            .declared(agent)
            .ok_or_else(|| PolicyError::UnknownAgent(agent.to_string()))?;
        if !declared.iter().any(|d| d.covers(capability)) {
            return Err(PolicyError::Undeclared {
                agent: agent.to_string(),
                capability: capability.to_string(),
                declared_in,
            });
        }
        if let (Category::FilesRead | Category::FilesWrite, Some(scope)) =
            (&capability.category, &capability.scope)
        {
            let path = self.store.workspace().join(scope);
            if in_state_dir(&self.store, &path) {
                return Err(PolicyError::Invalid(format!(
                    "`{capability}` names a path inside {}, metash's own state: no agent is ever \
                     granted it (context reaches agents through their prompt)",
                    self.store.meta_dir().display()
                )));
            }
        }
        consent::grant(
            &self.store,
            self.clock.now(),
            agent,
            capability,
            consent::Terms {
                duration_s,
                sensitive,
                source,
            },
        )
    }

    /// Revokes `capability` (and every narrower grant it covers) for `agent`, effective at every
    /// process's next check. Works for agents no longer registered too.
    ///
    /// # Errors
    /// Store errors.
    pub fn revoke(&self, agent: &str, capability: &Capability, source: &str) -> Result<Vec<Grant>> {
        consent::revoke(&self.store, self.clock.now(), agent, capability, source)
    }

    /// Every grant as persisted (including expired ones not yet pruned and revocation tombstones),
    /// with whether it is live now.
    pub fn grants(&self) -> Result<Vec<(Grant, bool)>> {
        let now = self.clock.now();
        Ok(consent::load(&self.store)?
            .grants
            .into_iter()
            .map(|g| {
                let live = g.active_at(now);
                (g, live)
            })
            .collect())
    }

    /// Records an action the host mediated for `agent` (`agent_action` in the ledger).
    ///
    /// # Errors
    /// Store errors.
    pub fn record_action(
        &self,
        agent: &str,
        capability: &Capability,
        detail: Value,
    ) -> Result<u64> {
        Ok(self.store.append(
            LogKind::AgentAction,
            Some(agent),
            json!({"capability": capability, "detail": detail}),
        )?)
    }
}

/// Whether `path` is inside the project's state directory (`.meta/`), with `..` and symlinks
/// resolved for the part of it that exists (a grant may name a path not created yet).
pub fn in_state_dir(store: &Store, path: &Path) -> bool {
    let meta = store.meta_dir();
    let meta = std::fs::canonicalize(meta).unwrap_or_else(|_| meta.to_path_buf());
    resolve_existing(path).starts_with(meta)
}

fn resolve_existing(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut normal = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::ParentDir => {
                normal.pop();
            }
            std::path::Component::CurDir => {}
            other => normal.push(other),
        }
    }
    let mut base = normal.clone();
    let mut rest = Vec::new();
    while !base.exists() {
        match (base.file_name().map(|n| n.to_owned()), base.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                base = parent.to_path_buf();
            }
            _ => return normal,
        }
    }
    let mut out = std::fs::canonicalize(&base).unwrap_or(base);
    out.extend(rest.iter().rev());
    out
}
