//! Git trust at the entry points that run git (`metash run`, `metash rollback`, `metash worker`
//! and each worker task): the configuration is checked in full before anything else, a project
//! without a record gets one (said in the log), and every refusal, at the start or mid-run, is a
//! `git_trust` event in the log besides the error that stops the command. The check itself is
//! `git::trust`; this is what the log says of it.

use metash_protocol::{LogKind, LogLevel};
use metash_store::Store;

use crate::engine::{Orchestrator, ORCHESTRATOR_AGENT};
use crate::error::{OrchestratorError, Result};
use crate::git::trust::{self, Checked};
use crate::git::Git;

/// Checks `git`'s repository in full and records the outcome in `store`'s log (a refusal, or a
/// first record). Also what the line for people says, when something happened.
///
/// # Errors
/// As [`Git::check_trust`].
// Used by the worker, which is Linux-only (PR_SET_PDEATHSIG).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) fn check(store: &Store, git: &Git) -> Result<Option<(String, LogLevel)>> {
    let outcome = first_record(store, git);
    if let Err(e) = &outcome {
        log_refusal(store, e);
    }
    outcome
}

/// The full check; a first record is logged.
fn first_record(store: &Store, git: &Git) -> Result<Option<(String, LogLevel)>> {
    if git.check_trust()? == Checked::Unchanged {
        return Ok(None);
    }
    let recorded = trust::load(git.root())?.unwrap_or_default();
    let listed = trust::Snapshot::default().changes_to(&recorded);
    let _ = store.append(
        LogKind::GitTrust,
        Some(ORCHESTRATOR_AGENT),
        trust::event("recorded", &listed, ORCHESTRATOR_AGENT),
    );
    Ok(Some((
        format!(
            "recorded the repository's executable git configuration ({} item(s): config keys, \
             hooks, attributes files) as trusted in .meta/{}: this project had no record yet; \
             `metash git trust` shows it",
            listed.len(),
            trust::TRUST_FILE
        ),
        LogLevel::Info,
    )))
}

/// Records a refusal (an error that is one) as a `git_trust` event.
pub(crate) fn log_refusal(store: &Store, e: &OrchestratorError) {
    if let OrchestratorError::GitConfigChanged { changes } = e {
        let _ = store.append(
            LogKind::GitTrust,
            Some(ORCHESTRATOR_AGENT),
            trust::event("refused", changes, ORCHESTRATOR_AGENT),
        );
    }
}

impl Orchestrator<'_> {
    /// Before the first git command of a run or rollback (a refusal is logged by
    /// [`Orchestrator::trust_logged`] around the whole command).
    ///
    /// # Errors
    /// As [`Git::check_trust`].
    pub(crate) fn check_git_trust(&self) -> Result<()> {
        if let Some((line, level)) = first_record(self.store(), &self.git)? {
            self.progress(&line, level);
        }
        Ok(())
    }

    /// `outcome`, a refusal (at the start or mid-run) logged as an event and a line for people.
    pub(crate) fn trust_logged<T>(&self, outcome: Result<T>) -> Result<T> {
        if let Err(e @ OrchestratorError::GitConfigChanged { changes }) = &outcome {
            log_refusal(self.store(), e);
            self.progress(
                &format!(
                    "stopped: the repository's executable git configuration changed ({} \
                     change(s)); no git command runs until a person accepts it with `metash git \
                     trust`",
                    changes.len()
                ),
                LogLevel::Error,
            );
        }
        outcome
    }
}
