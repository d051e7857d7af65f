//! The `[orchestrator]` section of `.meta/config.toml`. The rest of the file belongs to the host
//! (`[host]`, `[budget]`, `[roles.*]`), so the file is read as a table and only this section is
//! typed here: an unknown key in *our* section is an error (a typo must not silently fall back to a
//! default), anything elsewhere is not our business.
//!
//! ```toml
//! [orchestrator]
//! planner = "planner"        # agent or model-backed role spawned for each role
//! executor = "executor"
//! verifier = "verifier"
//! max_gap_retries = 3        # failed verifications per phase before the phase halts
//! max_plan_attempts = 3      # rejected plans before the run halts
//! max_task_attempts = 3      # executor errors/timeouts per task before the run halts
//! jobs = 1                   # parallel tasks (`metash run --jobs` overrides)
//! timeout_seconds = 600      # per spawn; absent: the host's default
//! model_hint = "smart"       # for model-backed roles
//! update = "merge"           # merge queue: bring a task's branch up to date by "merge" or "rebase"
//! reverify_after_update = true  # the verifier checks a task again when the update changed it
//! max_resolve_attempts = 2   # executor resolutions of one conflict before a person is asked
//! ```

use std::path::Path;

use metash_protocol::ModelHint;
use serde::Deserialize;

use crate::error::{OrchestratorError, Result};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrchestratorConfig {
    pub planner: String,
    pub executor: String,
    pub verifier: String,
    pub max_gap_retries: u32,
    pub max_plan_attempts: u32,
    pub max_task_attempts: u32,
    pub jobs: usize,
    pub timeout_seconds: Option<f64>,
    pub model_hint: Option<ModelHint>,
    pub max_tokens: Option<u64>,
    /// How the merge queue brings a verified task's branch up to date with the project.
    pub update: UpdateMode,
    /// The verifier checks a task again when bringing it up to date changed its tree.
    pub reverify_after_update: bool,
    /// Failed executor resolutions of one conflict before a person is asked.
    pub max_resolve_attempts: u32,
}

/// How the merge queue brings a task's branch up to date with the project's `HEAD`, in the
/// task's worktree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpdateMode {
    /// A merge commit of `HEAD` into the task's branch (its commits keep their ids).
    #[default]
    Merge,
    /// The task's own commits replayed on `HEAD` (a conflict falls back to a merge, which the
    /// executor resolves).
    Rebase,
}

impl Default for OrchestratorConfig {
    fn default() -> Self {
        Self {
            planner: "planner".into(),
            executor: "executor".into(),
            verifier: "verifier".into(),
            max_gap_retries: 3,
            max_plan_attempts: 3,
            max_task_attempts: 3,
            jobs: 1,
            timeout_seconds: None,
            model_hint: None,
            max_tokens: None,
            update: UpdateMode::Merge,
            reverify_after_update: true,
            max_resolve_attempts: 2,
        }
    }
}

impl OrchestratorConfig {
    /// Reads `[orchestrator]` from `<workspace>/.meta/config.toml`; defaults when the file or the
    /// section is absent.
    ///
    /// # Errors
    /// [`OrchestratorError::Config`] naming the file, line and problem.
    pub fn load(workspace: &Path) -> Result<Self> {
        let path = workspace.join(".meta").join("config.toml");
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::parse(&text, &path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(OrchestratorError::io(path.display().to_string(), e)),
        }
    }

    /// Parses the whole file's text and returns its `[orchestrator]` section.
    ///
    /// # Errors
    /// As [`OrchestratorConfig::load`].
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let bad = |message: String| OrchestratorError::Config {
            path: path.to_path_buf(),
            message,
        };
        let table: toml::Table = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
                .unwrap_or(1);
            bad(format!("line {line}: {}", e.message()))
        })?;
        let version = match table.get("schema_version") {
            None => None,
            Some(toml::Value::Integer(v)) => Some(*v),
            Some(other) => {
                return Err(bad(format!(
                    "schema_version must be an integer, not {}",
                    other.type_str()
                )))
            }
        };
        if let Some((line, why)) = metash_host::config::version_problem(version, text) {
            return Err(bad(format!("line {line}: {why}")));
        }
        let Some(section) = table.get("orchestrator") else {
            return Ok(Self::default());
        };
        let config: Self = section
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| bad(format!("[orchestrator]: {}", e.message())))?;
        if config.jobs == 0 {
            return Err(bad("[orchestrator]: jobs must be at least 1".into()));
        }
        if config.max_gap_retries == 0
            || config.max_plan_attempts == 0
            || config.max_task_attempts == 0
            || config.max_resolve_attempts == 0
        {
            return Err(bad(
                "[orchestrator]: the max_* limits must be at least 1".into()
            ));
        }
        for (key, name) in [
            ("planner", &config.planner),
            ("executor", &config.executor),
            ("verifier", &config.verifier),
        ] {
            if name.trim().is_empty() {
                return Err(bad(format!("[orchestrator]: `{key}` names no agent")));
            }
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_only_its_section() {
        let text = "[host]\ndefault_timeout_seconds = 3\n[roles.x]\nfrontend = \"openai-chat\"\n\
                    [orchestrator]\nplanner = \"p\"\njobs = 4\n";
        let c = OrchestratorConfig::parse(text, Path::new("c.toml")).unwrap();
        assert_eq!(c.planner, "p");
        assert_eq!(c.jobs, 4);
        assert_eq!(c.executor, "executor");
    }

    #[test]
    fn typo_in_our_section_is_an_error() {
        let err =
            OrchestratorConfig::parse("[orchestrator]\nmax_gap_retry = 2\n", Path::new("c.toml"))
                .unwrap_err()
                .to_string();
        assert!(err.contains("max_gap_retry"), "{err}");
    }

    #[test]
    fn absent_section_is_default() {
        let c = OrchestratorConfig::parse("[host]\n", Path::new("c.toml")).unwrap();
        assert_eq!(c, OrchestratorConfig::default());
    }
}
