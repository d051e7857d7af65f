//! The planner is told when the project's owner changed the context since it last planned
//! (`metash context edit|set`, issue 32): the change is in the log as `context_changed` with its
//! diff, and the planner's next request carries that diff, so a moved "Current Phase Focus" or a
//! new constraint is read as a change, not rediscovered.

use std::fmt::Write;

use metash_protocol::LogKind;

use crate::book::Book;
use crate::engine::Orchestrator;
use crate::error::Result;

/// The longest diff put into a prompt; past it the planner reads the whole context anyway.
const MAX_DIFF_CHARS: usize = 8_000;

impl Orchestrator<'_> {
    /// The note for the planner's request (empty when the context is the one it last planned
    /// with, or it never planned) and the context's sha256 to record once it has planned.
    pub(crate) fn context_note(&self, book: &Book, context: &str) -> Result<(String, String)> {
        let sha = metash_store::context_sha256(context.as_bytes());
        let Some(seen) = book.context_seen.as_deref().filter(|s| *s != sha) else {
            return Ok((String::new(), sha));
        };
        let diff = self
            .store()
            .log()
            .read_all()?
            .into_iter()
            .rev()
            .find(|r| r.kind == LogKind::ContextChanged && r.data["new_sha256"] == sha.as_str())
            .and_then(|r| r.data["diff"].as_str().map(str::to_string));
        let mut note = String::new();
        let _ = writeln!(
            note,
            "## The context changed since your last plan\n\nThe project's owner changed \
             .meta/context.md (sha256 {} -> {}).",
            short(seen),
            short(&sha)
        );
        match diff {
            Some(d) if d.chars().count() <= MAX_DIFF_CHARS => {
                let _ = writeln!(
                    note,
                    "What changed (`-` removed, `+` added):\n\n```diff\n{d}```"
                );
            }
            _ => {
                let _ = writeln!(note, "The whole context is above.");
            }
        }
        let _ = writeln!(note, "\nPlan for the context as it is now.\n");
        Ok((note, sha))
    }
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}
