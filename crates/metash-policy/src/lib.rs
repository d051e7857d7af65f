//! The policy layer (seed 002 sections 1, 2, 3 and 9): agents as data.
//!
//! - [`manifest`]: `manifest.toml` schema v0.1, with located diagnostics;
//! - [`registry`]: discovery in `.meta/agents/` and the user's config dir, registration events;
//! - [`migrate`]: upgrading unversioned manifests without touching their comments;
//! - [`capability`]: the capability grammar and scope coverage;
//! - [`policy`]: default-deny decisions ([`Policy::check`]) and the consent flow
//!   ([`Policy::authorize`]), grants and revocations persisted through the store ([`consent`]);
//! - [`prompt`], [`policy_file`]: who answers consent requests (a terminal, a policy file, nobody);
//! - [`ledger`], [`redact`]: the audit trail, viewed and exported with secrets redacted.
//!
//! The host's per-action call is [`Policy::authorize`] (or [`Policy::check`] when it only needs
//! the decision); both read the persisted grants each time, so another process's revocation
//! applies at once. An `Err` from either must be treated as deny.
//!
//! ```no_run
//! use metash_policy::{AgentDirs, Authorization, CapabilityRequest, NonInteractive, Policy, Registry};
//! # fn demo(workspace: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
//! let store = metash_store::Store::open(workspace)?;
//! let registry = Registry::discover(&AgentDirs::from_env(workspace, |k| std::env::var_os(k)));
//! registry.record(&store)?; // `agent_registered` for new or changed manifests
//! let policy = Policy::new(store, registry);
//! // Whoever is attached answers; with nobody and no policy file, the answer is deny.
//! let mut prompter = NonInteractive::new(None, vec!["files.read".parse()?]);
//! let req = CapabilityRequest::network("api.github.com", /* write */ false, "fetch issues");
//! match policy.authorize("claude", &req, &mut prompter)? {
//!     Authorization::Allowed { .. } => {
//!         // ... perform the request, then:
//!         policy.record_action("claude", &req.capability, serde_json::json!({"status": 200}))?;
//!     }
//!     Authorization::Denied { event, .. } => {
//!         // Send `event` (an `AgentEvent::Error` with code and hint) to the agent.
//!         let _ = event;
//!     }
//! }
//! # Ok(())
//! # }
//! ```

pub mod capability;
pub mod clock;
pub mod consent;
mod error;
pub mod ledger;
pub mod manifest;
pub mod migrate;
pub mod policy;
pub mod policy_file;
pub mod prompt;
pub mod quantity;
pub mod question;
pub mod redact;
pub mod registry;
mod suggest;

pub use capability::{Capability, Category};
pub use clock::{Clock, ManualClock, SystemClock};
pub use consent::Grant;
pub use error::{PolicyError, Result};
pub use manifest::{Diagnostic, Diagnostics};
pub use policy::{
    in_state_dir, Authorization, CapabilityRequest, Decision, DenyCode, Policy, Sensitive,
};
pub use policy_file::PolicyFile;
pub use prompt::{
    describe_question, parse_answer, Answer, ConsentPrompter, ConsentQuestion, DenyAll,
    NonInteractive, TerminalPrompter,
};
pub use redact::Redactor;
pub use registry::{Agent, AgentDirs, Registry, Source};
