//! A person's review of a task's change (issue 15: the diff card's line comments). A comment is a
//! durable record in `.meta/review_comments.json`, written under the store's lock by whichever
//! client made it (`metash ui`), and it goes back to the agent as its next input: the loop hands
//! a task's waiting comments to its next executor attempt as findings, and a task that is
//! complete but not yet verified is sent back by them, as a verifier's findings would send it
//! (a person asking for changes is a gap, so it counts in `gapCount`). Each comment is handed
//! over once: taking marks it delivered in the same locked update.

use metash_protocol::LogKind;
use metash_store::{NewEvent, Store, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::Result;

/// The document that holds the comments.
pub const REVIEW_DOC: &str = "review_comments";

/// The longest comment kept (longer text is refused, not cut).
pub const MAX_TEXT: usize = 4_000;

/// One comment on one line of a task's diff.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Comment {
    pub id: String,
    pub task: String,
    /// The file's path in the repository.
    pub file: String,
    /// The line in the file's new version (0: the file as a whole).
    pub line: u32,
    pub text: String,
    /// The client that made it (`ui`).
    pub by: String,
    pub at: String,
    /// When it was handed to the agent, and to which step (`executor`, `verification`).
    #[serde(default)]
    pub delivered_at: Option<String>,
    #[serde(default)]
    pub delivered_to: Option<String>,
}

impl Comment {
    /// The comment as the agent reads it among its findings.
    pub fn as_finding(&self) -> String {
        let at = if self.line == 0 {
            self.file.clone()
        } else {
            format!("{}:{}", self.file, self.line)
        };
        format!("review comment on {at}: {}", self.text)
    }
}

fn comments_of(doc: &Value) -> Vec<Comment> {
    doc.get("comments")
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default()
}

fn write_comments(doc: &mut Value, comments: &[Comment]) -> std::result::Result<(), StoreError> {
    let v = serde_json::to_value(comments).map_err(|e| StoreError::Rejected(e.to_string()))?;
    *doc = json!({ "comments": v });
    Ok(())
}

/// Every comment on `task`, oldest first (delivered ones too).
///
/// # Errors
/// The document cannot be read.
pub fn of_task(store: &Store, task: &str) -> Result<Vec<Comment>> {
    Ok(comments_of(&store.read_doc(REVIEW_DOC)?)
        .into_iter()
        .filter(|c| c.task == task)
        .collect())
}

/// The comments on `task` not yet handed to its agent.
///
/// # Errors
/// The document cannot be read.
pub fn waiting(store: &Store, task: &str) -> Result<Vec<Comment>> {
    Ok(of_task(store, task)?
        .into_iter()
        .filter(|c| c.delivered_at.is_none())
        .collect())
}

/// How many comments wait for each task's agent, from one read of the document.
///
/// # Errors
/// The document cannot be read.
pub fn waiting_by_task(store: &Store) -> Result<std::collections::BTreeMap<String, usize>> {
    let mut counts = std::collections::BTreeMap::new();
    for c in comments_of(&store.read_doc(REVIEW_DOC)?) {
        if c.delivered_at.is_none() {
            *counts.entry(c.task).or_insert(0) += 1;
        }
    }
    Ok(counts)
}

/// What a client writes: where, and what.
#[derive(Debug, Clone)]
pub struct NewComment<'a> {
    pub task: &'a str,
    pub file: &'a str,
    pub line: u32,
    pub text: &'a str,
    pub by: &'a str,
}

/// Records a comment on a task of the plan; its id.
///
/// # Errors
/// No such task, an empty or too long text, a file path that is not a plain relative path, or
/// the store failed.
pub fn comment(store: &Store, new: &NewComment<'_>) -> Result<String> {
    let text = new.text.trim();
    if text.is_empty() || text.len() > MAX_TEXT {
        return Err(StoreError::Rejected(format!(
            "a review comment has 1 to {MAX_TEXT} bytes of text"
        ))
        .into());
    }
    let file = new.file.trim();
    if file.is_empty()
        || file.starts_with('/')
        || file.split('/').any(|p| p == ".." || p.is_empty())
        || file.chars().any(char::is_control)
    {
        return Err(
            StoreError::Rejected(format!("`{file}` is not a path inside the repository")).into(),
        );
    }
    if store.state()?.task(new.task).is_none() {
        return Err(StoreError::Rejected(format!("no task `{}` in the plan", new.task)).into());
    }
    let c = Comment {
        id: format!("rc-{}", uuid::Uuid::new_v4().simple()),
        task: new.task.to_string(),
        file: file.to_string(),
        line: new.line,
        text: text.to_string(),
        by: new.by.to_string(),
        at: metash_store::log::now(),
        delivered_at: None,
        delivered_to: None,
    };
    let id = c.id.clone();
    store.update_doc(REVIEW_DOC, |doc| {
        let mut all = comments_of(doc);
        all.push(c.clone());
        write_comments(doc, &all)?;
        Ok(NewEvent::new(
            LogKind::ReviewComment,
            None,
            json!({"id": c.id, "task": c.task, "file": c.file, "line": c.line, "text": c.text,
                   "by": c.by}),
        ))
    })?;
    Ok(id)
}

/// Takes the comments on `task` waiting for its agent, marking them delivered to `to` in the same
/// locked update: two steps taking at once never both get one.
///
/// # Errors
/// The store failed (then nothing is marked).
pub fn take(store: &Store, task: &str, to: &str) -> Result<Vec<Comment>> {
    if waiting(store, task)?.is_empty() {
        return Ok(Vec::new());
    }
    let mut taken = Vec::new();
    store.update_doc(REVIEW_DOC, |doc| {
        let now = metash_store::log::now();
        let mut all = comments_of(doc);
        for c in all
            .iter_mut()
            .filter(|c| c.task == task && c.delivered_at.is_none())
        {
            c.delivered_at = Some(now.clone());
            c.delivered_to = Some(to.to_string());
            taken.push(c.clone());
        }
        write_comments(doc, &all)?;
        let ids: Vec<&str> = taken.iter().map(|c| c.id.as_str()).collect();
        Ok(NewEvent::new(
            LogKind::ReviewDelivered,
            None,
            json!({"task": task, "ids": ids, "to": to}),
        ))
    })?;
    Ok(taken)
}
