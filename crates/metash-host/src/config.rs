//! `.meta/config.toml`, the host's part: model-backed roles, the run budget, spawn defaults.
//! Other layers own other sections (`[orchestrator]`); each reads only its own, so the file is read
//! as a table first.
//!
//! ```toml
//! schema_version = 1     # the file's format; absent in files written before it was versioned
//!
//! [host]
//! default_timeout_seconds = 600
//! wasm_fuel = 2000000000   # optional: deterministic work bound per WASM invocation
//! kv_max_keys = 1000       # per agent KV namespace and the scratchpad (the defaults)
//! kv_max_bytes = 1048576
//! agent_disk = "2g"        # native and WASM agents, per spawn: bytes and files added under what they
//! agent_files = 100000     #   may write (the defaults); past either the spawn is stopped
//! max_log_bytes_per_agent = "256m"   # per agent and run: past it, its chatter is not logged
//! consent_max_pending = 3  # per agent: questions waiting for an answer at once
//! consent_per_minute = 10  # per agent: questions asked per minute; past either, refused at once
//!
//! [budget]                 # across all spawns of the session
//! max_tokens = 200000
//! max_cost_usd = 5.0
//!
//! [roles.writer]           # spawn_agent("writer", ...) runs a model turn
//! frontend = "anthropic-api"   # agent-sdk | pi-sdk | anthropic-api | openai-responses | openai-chat
//! model_fast = "claude-haiku-4-5"
//! model_smart = "claude-sonnet-4-5"
//! base_url = "http://127.0.0.1:8080"   # optional; the provider's default otherwise
//! api_key_env = "ANTHROPIC_API_KEY"    # optional; the frontend's usual variable otherwise
//! max_tokens = 4096                    # used when the spawn gives none
//! mem = "4g"                           # CLI frontends: quotas of the sandboxed process tree
//! cpu = "2"
//! max_pids = 512                      # (mem defaults to 4g, max_pids to 512, no cpu limit)
//! disk = "2g"                          # CLI frontends: bytes and files the spawn may add under
//! files = 100000                       #   its worktree, HOME and TMPDIR (the defaults)
//! timeout_seconds = 900                # when the spawn gives none
//! permissions = "bypass"               # or "ask": Claude Code's tool uses go to metash's consent
//! auth = "subscription"                # Claude Code, Codex: "key", or the user's sign-in (`claude
//!                                      # login`, CLAUDE_CODE_OAUTH_TOKEN, `codex login`); absent:
//!                                      # the key when its variable is set, else a sign-in found
//! network = ["github.com", "*.npmjs.org"]   # CLI frontends: reachable besides the model
//!
//! [roles.acp-coder]        # any ACP agent, run in the sandbox like a CLI (docs/acp.md)
//! frontend = "acp"
//! command = ["claude-code-acp"]        # its argv
//! provider = "anthropic"               # whose key and base URL it gets (or "openai")
//! env = { MAX_THINKING_TOKENS = "0" }  # added to its cleared environment
//!
//! [record]               # model turns recorded at the credential proxy (docs/replay.md)
//! enabled = true
//! keep_days = 30
//! max_bytes = "1g"
//!
//! [prices."my-finetune"]   # USD per million tokens; overrides the built-in table (pricing.rs)
//! input_per_mtok = 3.0
//! output_per_mtok = 15.0
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use metash_protocol::{show_seconds, timeout_from_secs, HarnessFrontend, ModelHint};
use serde::Deserialize;

use crate::error::{HostError, Result};

mod access;
pub mod acp;
mod record;
pub use access::{no_sign_in, Access};
pub use record::RecordSection;

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSection {
    #[serde(default)]
    pub default_timeout_seconds: Option<f64>,
    /// Deterministic work bound for every WASM agent invocation (wasmtime fuel units); running out
    /// ends the spawn as an error naming the `fuel` limit. Absent: only the timeout applies.
    #[serde(default)]
    pub wasm_fuel: Option<u64>,
    /// Per KV namespace (each agent's own, and the shared scratchpad): at most this many keys
    /// (default 1,000) and this many bytes of JSON (default 1 MiB). A write past either is
    /// refused and the agent told why.
    #[serde(default)]
    pub kv_max_keys: Option<usize>,
    #[serde(default)]
    pub kv_max_bytes: Option<usize>,
    /// How long an agent's question that no rule answers (not `--yes-to`, not the policy file)
    /// waits for an answer from any client (`metash ui`, JSON-RPC) before it is denied, when
    /// nobody is at a terminal. 0 or absent: denied at once, never waited for.
    #[serde(default)]
    pub consent_wait_seconds: Option<f64>,
    /// Native agents' write quotas per spawn: bytes (`"2g"`, `"500Mi"`) and files they may add
    /// under what they may write; past either the spawn is stopped and says why. Absent: 2 GiB
    /// and 100,000 files. (CLI roles have `[roles.X] disk` and `files`.)
    #[serde(default)]
    pub agent_disk: Option<String>,
    #[serde(default)]
    pub agent_files: Option<u64>,
    /// Bytes of log one agent may add in a run (`"256m"`, the default): past it, what it says
    /// (its output, its model's turn events) is no longer logged, which an `events_lost` record
    /// says; what the host decides about it (start, limits, consent, end) still is.
    #[serde(default)]
    pub max_log_bytes_per_agent: Option<String>,
    /// Consent questions one agent may have waiting at once (default 3) and may have asked in
    /// any minute (default 10); past either, its request is refused at once
    /// (`consent_too_many_pending`, `consent_rate_limited`). Identical questions waiting at once
    /// are asked once.
    #[serde(default)]
    pub consent_max_pending: Option<usize>,
    #[serde(default)]
    pub consent_per_minute: Option<usize>,
}

/// Bytes of log one agent may add in a run unless `[host] max_log_bytes_per_agent` says.
pub const DEFAULT_MAX_LOG_BYTES_PER_AGENT: u64 = 256 << 20;

/// The longest a question may wait for a client: a day.
pub const MAX_CONSENT_WAIT_S: f64 = 86_400.0;

impl HostSection {
    /// How long an unanswered question waits for a client (zero: not at all).
    pub fn consent_wait(&self) -> std::time::Duration {
        self.consent_wait_seconds
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(|s| std::time::Duration::from_secs_f64(s.min(MAX_CONSENT_WAIT_S)))
            .unwrap_or_default()
    }

    /// The write quota per spawn of native and WASM agents (`agent_disk`, `agent_files`).
    pub fn agent_write_quota(&self) -> metash_runtime::limits::WriteQuota {
        metash_runtime::limits::WriteQuota::new(self.agent_disk.clone(), self.agent_files)
    }

    /// Bytes of log per agent and run (`max_log_bytes_per_agent`, default 256 MiB; a value that
    /// does not parse, which [`HostConfig::parse`] refuses, reads as the default).
    pub fn max_log_bytes_per_agent(&self) -> u64 {
        self.max_log_bytes_per_agent
            .as_deref()
            .and_then(|v| metash_runtime::limits::parse_bytes("max_log_bytes_per_agent", v).ok())
            .unwrap_or(DEFAULT_MAX_LOG_BYTES_PER_AGENT)
    }

    /// The cap and rate of one agent's consent questions.
    pub fn consent_limits(&self) -> crate::asks::QuestionLimits {
        crate::asks::QuestionLimits {
            max_pending: self.consent_max_pending.unwrap_or(3),
            per_minute: self.consent_per_minute.unwrap_or(10),
        }
    }

    /// The KV quota of every agent namespace and of the scratchpad.
    pub fn kv_quota(&self) -> metash_store::KvQuota {
        metash_store::KvQuota {
            max_keys: self.kv_max_keys.unwrap_or(1_000),
            max_bytes: self.kv_max_bytes.unwrap_or(1 << 20),
        }
    }
}

/// `[artifacts]`: how long artifacts agents announce are kept, and how much of them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactsSection {
    /// Older ones are removed after each new artifact (default 30; `inf` keeps them).
    #[serde(default)]
    pub max_age_days: Option<f64>,
    /// Then the oldest are removed until the rest fit (default 1024).
    #[serde(default)]
    pub max_total_mib: Option<u64>,
}

impl ArtifactsSection {
    /// The store's retention policy from this section (defaults where unset; a bad age, which
    /// [`HostConfig::parse`] refuses, would read as the default).
    pub fn retention(&self) -> metash_store::Retention {
        let days = self.max_age_days.filter(|d| *d >= 0.0).unwrap_or(30.0);
        metash_store::Retention {
            max_age: std::time::Duration::try_from_secs_f64(days * 86_400.0)
                .unwrap_or(std::time::Duration::MAX),
            max_total_bytes: self.max_total_mib.unwrap_or(1024).saturating_mul(1 << 20),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Role {
    /// A harness frontend's wire name, or `acp` (then the wire frontend of `provider`, see
    /// [`acp`]).
    #[serde(deserialize_with = "acp::frontend")]
    pub frontend: HarnessFrontend,
    #[serde(default)]
    pub model_fast: Option<String>,
    #[serde(default)]
    pub model_smart: Option<String>,
    #[serde(default)]
    pub base_url: Option<String>,
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// CLI frontends: give the harness its own HOME under the spawn's directory (default true:
    /// a sub-agent must not see the orchestrator's or the user's history).
    #[serde(default = "yes")]
    pub isolated_home: bool,
    /// CLI frontends: quotas for the CLI's whole process tree (its shells and test runs too), as
    /// in a manifest: `mem = "4g"`, `cpu = "2"`, `max_pids = 512`.
    #[serde(default)]
    pub mem: Option<String>,
    #[serde(default)]
    pub cpu: Option<String>,
    #[serde(default)]
    pub max_pids: Option<u64>,
    /// CLI frontends: bytes (`"2g"`) and files the spawn may add under its worktree, HOME and
    /// TMPDIR while it runs (default 2 GiB and 100,000); past either the turn is stopped and
    /// says why.
    #[serde(default)]
    pub disk: Option<String>,
    #[serde(default)]
    pub files: Option<u64>,
    /// A spawn's deadline when the spawn gives none (before `[host] default_timeout_seconds`).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// CLI frontends: domains the CLI may reach besides its model (through metash's allowlist
    /// proxy; `*.example.com` covers subdomains). Nothing else is reachable.
    #[serde(default)]
    pub network: Vec<String>,
    /// CLI frontends: who answers the CLI's own permission prompts (see [`Permissions`]).
    #[serde(default)]
    pub permissions: Permissions,
    /// Claude Code and Codex: what reaches the model (see [`RoleAuth`]). Absent: the key when
    /// its variable is set, else the user's subscription sign-in when one is found.
    #[serde(default)]
    pub auth: Option<RoleAuth>,
    /// `frontend = "acp"`: the ACP agent's command line, run in the sandbox (docs/acp.md).
    #[serde(default)]
    pub command: Vec<String>,
    /// `frontend = "acp"`: variables added to the agent's (cleared) environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `frontend = "acp"`: whose model API the agent calls (default `anthropic`): the key, the
    /// base-URL variable and the credential proxy it gets.
    #[serde(default)]
    pub provider: Option<metash_protocol::ProviderDomain>,
    /// The role was written `frontend = "acp"` (set by [`HostConfig::parse`]).
    #[serde(skip)]
    pub acp: bool,
}

/// How a CLI role reaches its model. Either way the CLI holds only a placeholder and metash's
/// credential proxy adds the real credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoleAuth {
    /// The model key in the role's variable (`api_key_env`, else the frontend's own).
    Key,
    /// The user's subscription: Claude Code's `claude login` or `CLAUDE_CODE_OAUTH_TOKEN`
    /// (`claude setup-token`), Codex's `codex login` (ChatGPT).
    Subscription,
}

/// Who answers a CLI's permission prompts. Either way metash's sandbox is the boundary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permissions {
    /// The CLI's own prompts and sandbox are off (it runs headless, nobody could answer them).
    #[default]
    Bypass,
    /// Claude Code only: each tool use is a consent request to metash (a grant, the policy
    /// file, `--yes-to`, or the user, once or for a time), recorded in the ledger.
    Ask,
}

fn yes() -> bool {
    true
}

impl Role {
    /// Whether this role runs a coding CLI (a program, so a native agent under seed 002: it runs
    /// in metash's native sandbox, with the user's consent, and never holds the model key).
    pub fn runs_cli(&self) -> bool {
        metash_harness::frontend::info(self.frontend).runs_process()
    }
    /// The model for a hint: `smart` falls back to `fast` and back, then to the frontend default.
    pub fn model(&self, hint: Option<ModelHint>) -> Option<String> {
        let (first, second) = match hint.unwrap_or(ModelHint::Smart) {
            ModelHint::Fast => (&self.model_fast, &self.model_smart),
            ModelHint::Smart => (&self.model_smart, &self.model_fast),
        };
        first.clone().or_else(|| second.clone())
    }

    /// The variable holding the key, for frontends that need one.
    pub fn key_env(&self) -> Option<String> {
        if let Some(v) = &self.api_key_env {
            return Some(v.clone());
        }
        metash_harness::frontend::info(self.frontend)
            .role_key_env
            .map(str::to_string)
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostConfig {
    pub host: HostSection,
    pub budget: Budget,
    pub roles: BTreeMap<String, Role>,
    /// `[prices."MODEL"]`: what usage costs, on top of the built-in table.
    pub prices: crate::pricing::PriceTable,
    pub artifacts: ArtifactsSection,
    /// `[record]`: model turns recorded at the credential proxy, and their retention.
    pub record: RecordSection,
}

/// The config.toml format this build reads (`schema_version`; a file without one is read as 1,
/// and `metash migrate` writes the key).
pub const CONFIG_SCHEMA_VERSION: i64 = 1;

/// What is wrong with a `schema_version` other than this build's: its line and why. Shared with
/// every other reader of the file (the orchestrator's section), so all of them refuse it alike.
pub fn version_problem(found: Option<i64>, text: &str) -> Option<(usize, String)> {
    let v = found.filter(|v| *v != CONFIG_SCHEMA_VERSION)?;
    let line = text
        .lines()
        .position(|l| l.trim_start().starts_with("schema_version"))
        .map_or(1, |i| i + 1);
    let why = if v > CONFIG_SCHEMA_VERSION {
        "a newer metash wrote it; upgrade metash to read it"
    } else {
        "versions start at 1"
    };
    Some((
        line,
        format!(
            "schema_version {v} is not supported (this build reads {CONFIG_SCHEMA_VERSION}): {why}"
        ),
    ))
}

fn check_version(found: Option<i64>, text: &str, path: &Path) -> Result<()> {
    match version_problem(found, text) {
        Some((line, why)) => Err(HostError::Config(format!(
            "{}:{line}: {why}",
            path.display()
        ))),
        None => Ok(()),
    }
}

impl HostConfig {
    /// Declares every CLI role to `policy` as an agent that may ask for `native` (the consent
    /// to run it is still asked and recorded like any agent's).
    /// A role with `permissions = "ask"` also declares what a coding CLI's tools do (start
    /// programs, read and write files, fetch), each asked per use.
    pub fn declare_roles(&self, mut policy: metash_policy::Policy) -> metash_policy::Policy {
        use metash_policy::{Capability, Category};
        for (name, role) in &self.roles {
            if !role.runs_cli() {
                continue;
            }
            let mut declared = vec![Capability::new(Category::Native, None)];
            if role.permissions == Permissions::Ask {
                declared.extend(
                    [
                        Category::ProcessSpawn,
                        Category::FilesRead,
                        Category::FilesWrite,
                        Category::Network,
                    ]
                    .map(|c| Capability::new(c, None)),
                );
            }
            policy = policy.with_role(name, declared);
        }
        policy
    }

    /// Reads `.meta/config.toml` under `workspace`; absent means defaults.
    ///
    /// # Errors
    /// [`HostError::Config`] naming the file, the line and what is wrong.
    pub fn load(workspace: &Path) -> Result<Self> {
        let path = workspace.join(".meta").join("config.toml");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(HostError::Config(format!("{}: {e}", path.display()))),
        };
        Self::parse(&text, &path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let mut parsed: HostFile = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
                .unwrap_or(1);
            HostError::Config(format!("{}:{line}: {}", path.display(), e.message()))
        })?;
        check_version(parsed.schema_version, text, path)?;
        acp::mark(text, &mut parsed.roles)
            .map_err(|m| HostError::Config(format!("{}: {m}", path.display())))?;
        parsed.check(path)?;
        Ok(Self {
            host: parsed.host,
            budget: parsed.budget,
            roles: parsed.roles,
            prices: crate::pricing::PriceTable::new(parsed.prices),
            artifacts: parsed.artifacts,
            record: parsed.record,
        })
    }
}

/// The whole file, typed where it is the host's; other sections pass through unread.
#[derive(Deserialize)]
struct HostFile {
    schema_version: Option<i64>,
    #[serde(default)]
    host: HostSection,
    #[serde(default)]
    budget: Budget,
    #[serde(default)]
    roles: BTreeMap<String, Role>,
    #[serde(default)]
    prices: BTreeMap<String, crate::pricing::Price>,
    #[serde(default)]
    artifacts: ArtifactsSection,
    #[serde(default)]
    record: RecordSection,
    #[serde(flatten)]
    _others: toml::Table,
}

impl HostFile {
    /// What TOML's types cannot say: numbers in range, and role settings that fit their
    /// frontend. The first problem, naming the file and the section.
    fn check(&self, path: &Path) -> Result<()> {
        let bad = |m: String| Err(HostError::Config(format!("{}: {m}", path.display())));
        for (model, price) in &self.prices {
            if let Err(why) = price.check() {
                return bad(format!("[prices.\"{model}\"]: {why}"));
            }
        }
        if let Err(why) = self.record.check() {
            return bad(why);
        }
        if let Some(d) = self
            .artifacts
            .max_age_days
            .filter(|d| d.is_nan() || *d < 0.0)
        {
            return bad(format!(
                "[artifacts] max_age_days must be a number of days >= 0, not {d}"
            ));
        }
        if let Some(w) = self
            .host
            .consent_wait_seconds
            .filter(|w| !(0.0..=MAX_CONSENT_WAIT_S).contains(w))
        {
            return bad(format!(
                "[host] consent_wait_seconds must be between 0 and {MAX_CONSENT_WAIT_S} seconds, \
                 not {w}"
            ));
        }
        let bad_timeout = |t: &Option<f64>| t.filter(|t| timeout_from_secs(*t).is_none());
        let timeout_text = |t: f64| {
            format!(
                "must be a positive number, at most {} (30 days), not {}",
                metash_protocol::MAX_TIMEOUT_SECONDS,
                show_seconds(t)
            )
        };
        if let Some(t) = bad_timeout(&self.host.default_timeout_seconds) {
            return bad(format!(
                "[host] default_timeout_seconds {}",
                timeout_text(t)
            ));
        }
        for (name, role) in &self.roles {
            if let Some(t) = bad_timeout(&role.timeout_seconds) {
                return bad(format!(
                    "[roles.{name}] timeout_seconds {}",
                    timeout_text(t)
                ));
            }
            if role.auth == Some(RoleAuth::Subscription) && role.sign_in_cli().is_none() {
                return bad(format!(
                    "[roles.{name}] auth = \"subscription\" needs Claude Code (agent-sdk, \
                     claude-code) or Codex (codex-cli); {} takes a key",
                    role.frontend.as_str()
                ));
            }
            if role.permissions == Permissions::Ask && !role.can_ask() {
                return bad(format!(
                    "[roles.{name}] permissions = \"ask\" needs a Claude Code frontend \
                     (agent-sdk or claude-code); {} has no permission-prompt hook, use \
                     \"bypass\" (metash's sandbox is the boundary either way)",
                    role.frontend.as_str()
                ));
            }
        }
        if let Err(why) = self.check_quotas() {
            return bad(why);
        }
        if let Some(max) = self.budget.max_cost_usd {
            if !(max.is_finite() && max >= 0.0) {
                return bad(format!(
                    "[budget] max_cost_usd must be a number >= 0, not {max}"
                ));
            }
        }
        Ok(())
    }
}

impl HostFile {
    /// The write, log and consent quotas: sizes that parse, counts of at least 1.
    fn check_quotas(&self) -> std::result::Result<(), String> {
        let size = |key: &str, v: &Option<String>| match v {
            Some(v) => metash_runtime::limits::parse_bytes("size", v)
                .map(drop)
                .map_err(|_| {
                    format!("{key} must be a size such as \"2g\" or \"500Mi\", not {v:?}")
                }),
            None => Ok(()),
        };
        let count = |key: &str, v: Option<u64>| match v {
            Some(0) => Err(format!("{key} must be at least 1")),
            _ => Ok(()),
        };
        let h = &self.host;
        size("[host] agent_disk", &h.agent_disk)?;
        size("[host] max_log_bytes_per_agent", &h.max_log_bytes_per_agent)?;
        count("[host] agent_files", h.agent_files)?;
        count(
            "[host] consent_max_pending",
            h.consent_max_pending.map(|n| n as u64),
        )?;
        count(
            "[host] consent_per_minute",
            h.consent_per_minute.map(|n| n as u64),
        )?;
        for (name, role) in &self.roles {
            size(&format!("[roles.{name}] disk"), &role.disk)?;
            size(&format!("[roles.{name}] mem"), &role.mem)?;
            count(&format!("[roles.{name}] files"), role.files)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn permissions_parse_and_ask_needs_claude_code() {
        let p = Path::new(".meta/config.toml");
        let c = HostConfig::parse(
            "[roles.a]\nfrontend = \"agent-sdk\"\npermissions = \"ask\"\nmem = \"2g\"\nmax_pids = 64\n\
             [roles.b]\nfrontend = \"pi-sdk\"\n",
            p,
        )
        .unwrap();
        assert_eq!(c.roles["a"].permissions, Permissions::Ask);
        assert_eq!(c.roles["a"].max_pids, Some(64));
        assert_eq!(c.roles["b"].permissions, Permissions::Bypass);
        let err = HostConfig::parse(
            "[roles.x]\nfrontend = \"codex-cli\"\npermissions = \"ask\"\n",
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("[roles.x]") && err.contains("Claude Code"),
            "{err}"
        );
        let err = HostConfig::parse(
            "[roles.x]\nfrontend = \"pi-sdk\"\npermissions = \"maybe\"\n",
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("config.toml:3"), "{err}");
        let err = HostConfig::parse(
            "[roles.x]\nfrontend = \"pi-sdk\"\ntimeout_seconds = -1\n",
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("timeout_seconds must be a positive"), "{err}");
        for bad in ["0", "-5", "1e300", "nan", "inf"] {
            let err = HostConfig::parse(&format!("[host]\ndefault_timeout_seconds = {bad}\n"), p)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("default_timeout_seconds must be a positive number"),
                "{bad}: {err}"
            );
        }
        assert!(HostConfig::parse(
            "[roles.x]\nfrontend = \"pi-sdk\"\ntimeout_seconds = 1e300\n",
            p
        )
        .is_err());
        for bad in ["-1", "nan", "inf", "86401", "1e300"] {
            let err = HostConfig::parse(&format!("[host]\nconsent_wait_seconds = {bad}\n"), p)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("consent_wait_seconds must be between 0"),
                "{bad}: {err}"
            );
        }
        for (good, secs) in [("0", 0.0), ("0.5", 0.5), ("86400", 86_400.0)] {
            let c =
                HostConfig::parse(&format!("[host]\nconsent_wait_seconds = {good}\n"), p).unwrap();
            assert_eq!(c.host.consent_wait().as_secs_f64(), secs);
        }
        assert!(HostConfig::default().host.consent_wait().is_zero());
    }

    #[test]
    fn quotas_parse_with_defaults_and_bad_ones_name_their_key() {
        let p = Path::new(".meta/config.toml");
        let d = HostConfig::default();
        assert_eq!(d.host.max_log_bytes_per_agent(), 256 << 20);
        assert_eq!(
            d.host.agent_write_quota().resolve().unwrap(),
            (2 << 30, 100_000)
        );
        let limits = d.host.consent_limits();
        assert_eq!((limits.max_pending, limits.per_minute), (3, 10));
        let c = HostConfig::parse(
            "[host]\nagent_disk = \"50m\"\nagent_files = 7\nmax_log_bytes_per_agent = \"1Mi\"\n\
             consent_max_pending = 1\nconsent_per_minute = 2\n\
             [roles.a]\nfrontend = \"pi-sdk\"\ndisk = \"1g\"\nfiles = 9\nmem = \"4g\"\n",
            p,
        )
        .unwrap();
        assert_eq!(c.host.agent_write_quota().resolve().unwrap(), (50 << 20, 7));
        assert_eq!(c.host.max_log_bytes_per_agent(), 1 << 20);
        assert_eq!(c.host.consent_limits().per_minute, 2);
        assert_eq!(c.roles["a"].disk.as_deref(), Some("1g"));
        for (bad, key) in [
            ("[host]\nagent_disk = \"lots\"\n", "[host] agent_disk"),
            (
                "[host]\nconsent_per_minute = 0\n",
                "[host] consent_per_minute",
            ),
            (
                "[host]\nmax_log_bytes_per_agent = \"-1\"\n",
                "max_log_bytes_per_agent",
            ),
            (
                "[roles.a]\nfrontend = \"pi-sdk\"\nfiles = 0\n",
                "[roles.a] files",
            ),
            (
                "[roles.a]\nfrontend = \"pi-sdk\"\nmem = \"4gb\"\n",
                "[roles.a] mem",
            ),
        ] {
            let err = HostConfig::parse(bad, p).unwrap_err().to_string();
            assert!(err.contains(key), "{bad}: {err}");
        }
    }

    /// The module doc's example, as a user would write it.
    const EXAMPLE: &str = "[host]\ndefault_timeout_seconds = 600\n[budget]\nmax_tokens = 200000\n\
        max_cost_usd = 5.0\n[roles.writer]\nfrontend = \"anthropic-api\"\nmodel_smart = \"m\"\n\
        base_url = \"http://127.0.0.1:8080\"\nmax_tokens = 4096\nmem = \"4g\"\ncpu = \"2\"\n\
        max_pids = 512\ntimeout_seconds = 900\nnetwork = [\"github.com\"]\n\
        [prices.\"my-finetune\"]\ninput_per_mtok = 3.0\noutput_per_mtok = 15.0\n";

    #[test]
    fn the_example_parses() {
        let c = HostConfig::parse(EXAMPLE, Path::new("config.toml")).unwrap();
        assert_eq!(c.roles["writer"].timeout_seconds, Some(900.0));
        let versioned = format!("schema_version = 1\n{EXAMPLE}");
        assert_eq!(
            HostConfig::parse(&versioned, Path::new("config.toml")).unwrap(),
            c
        );
    }

    #[test]
    fn a_version_this_build_does_not_read_names_file_and_line() {
        let p = Path::new("/w/.meta/config.toml");
        for (text, words) in [
            ("# c\nschema_version = 2\n", "newer metash"),
            ("# c\nschema_version = 0\n", "start at 1"),
            ("# c\nschema_version = \"1\"\n", "expected i64"),
        ] {
            let err = HostConfig::parse(text, p).unwrap_err().to_string();
            assert!(err.contains("config.toml:2"), "{text:?}: {err}");
            assert!(err.contains(words), "{text:?}: {err}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 512,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// Any text, and any few-byte edit of the example: read, or refused naming the file;
        /// never a panic (numbers such as `1e300`, `nan` and `-0` included).
        #[test]
        fn the_config_parser_never_panics(
            text in ".{0,200}",
            edits in proptest::collection::vec(
                (0usize..400, 0u8..3, proptest::sample::select(
                    "\"=[]{}.,#\n :0-9eE+-naif".chars().collect::<Vec<_>>()
                )),
                1..6,
            ),
        ) {
            let p = Path::new("/w/.meta/config.toml");
            if let Err(e) = HostConfig::parse(&text, p) {
                proptest::prop_assert!(e.to_string().contains("config.toml"), "{e}");
            }
            let mut chars: Vec<char> = EXAMPLE.chars().collect();
            for (pos, op, c) in edits {
                let i = pos % chars.len().max(1);
                match op {
                    0 if !chars.is_empty() => chars[i] = c,
                    1 => chars.insert(i.min(chars.len()), c),
                    _ if !chars.is_empty() => {
                        chars.remove(i);
                    }
                    _ => {}
                }
            }
            let edited: String = chars.into_iter().collect();
            if let Err(e) = HostConfig::parse(&edited, p) {
                proptest::prop_assert!(e.to_string().contains("config.toml"), "{e}");
            }
        }
    }
}
