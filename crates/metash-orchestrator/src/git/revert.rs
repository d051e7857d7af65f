//! Undoing a task's landing (rollback.rs): its landing merge reverted against the checkout's side.

use std::path::Path;

use super::{Git, Merge};
use crate::error::Result;

impl Git {
    /// Reverts the merge commit `sha` in `dir` against its first parent (`git revert -m 1`): what
    /// merging its second parent brought is undone with a new commit. A conflict leaves the
    /// revert in progress.
    ///
    /// # Errors
    /// git fails for another reason.
    pub fn revert_merge(&self, dir: &Path, sha: &str) -> Result<Merge> {
        let out = self.run_committing(dir, &["revert", "--no-edit", "-m", "1", sha])?;
        if out.status.success() {
            return Ok(Merge::Clean);
        }
        let files = self.conflicted(dir)?;
        if files.is_empty() {
            return Err(self.failed(dir, &format!("revert -m 1 {sha}"), &out));
        }
        Ok(Merge::Conflict { files })
    }
}
