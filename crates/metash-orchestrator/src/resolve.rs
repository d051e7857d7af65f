//! Conflicts in the merge queue go to the agent (issue 33): when bringing a task's branch up to
//! date with the project conflicts, the merge is left in progress in the task's worktree (markers
//! in the files, both sides in the index) and the task's executor gets a **resolution turn**
//! there, with a request naming the conflicting files and the tasks whose landed work it
//! conflicts with. metash then checks that no file holds a marker, commits the merge (the
//! executor never commits: its worktree's git metadata is read-only to it), records the commit
//! as the task's new tip and has the verifier check it (queue.rs, `re-verifying`).
//!
//! A resolution that fails (markers left, files still unmerged, an executor error or timeout, a
//! failed verification) resets the worktree to the task's tip and the update is made again for
//! another turn, with why the last one failed. After `max_resolve_attempts` failures the conflict
//! is left in progress in the worktree and a person is asked there (`waiting on a person`); the
//! project's checkout is never touched. `metash run --answer done` after the person committed the
//! merge lands it (its commit must be the merge of the task's tip and the `HEAD` it was brought
//! up to date with); `--answer abort` halts.

use std::path::Path;

use metash_protocol::{AgentResponse, AgentStatus, LogLevel, SessionState};
use serde_json::json;

use crate::book::{self, Book, Entry, Halt, HaltReason, QueueEntry, QueueState, ResumeFor};
use crate::engine::{branch_of, worktree_of, Orchestrator, RunOutcome, Step};
use crate::error::Result;
use crate::plan::TaskNode;
use crate::planning::{clip, status_word};
use crate::prompts::{Conflict, Focus, Role};
use crate::queue::{short, Next};

/// How a resolution turn ended.
pub(crate) enum Resolution {
    /// The merge commit of the resolution, the worktree's branch at it (not yet recorded);
    /// `on` names the worker that made it (`" on w1"`), else empty.
    Committed { sha: String, on: String },
    /// The executor asked a person.
    Asked(AgentResponse),
    /// It did not resolve, for this reason.
    Failed(String),
}

impl Orchestrator<'_> {
    /// The update of task `node` conflicts in `files`: a resolution turn for its executor, or,
    /// after `max_resolve_attempts` failed ones, a person.
    pub(crate) fn resolve_conflict(
        &self,
        node: &TaskNode,
        wt: &Path,
        entry: QueueEntry,
        files: Vec<String>,
    ) -> Result<Next> {
        let id = node.id.as_str();
        let state = self.store().state()?;
        let with = self.conflicting_tasks(&state, &entry, &files)?;
        let entry = QueueEntry {
            files,
            with,
            ..entry
        };
        if entry.attempts >= self.config.max_resolve_attempts {
            return self.ask_person(node, wt, entry);
        }
        let entry = QueueEntry {
            state: QueueState::Resolving,
            ..entry
        };
        self.update(vec![book::set_for(Entry::Queue, id, json!(entry))])?;
        self.progress(
            &format!(
                "task {id}: updating with {} conflicts in {} (with {}): the executor resolves it \
                 (attempt {} of {})",
                short(&entry.main),
                entry.files.join(", "),
                names(&entry.with),
                entry.attempts + 1,
                self.config.max_resolve_attempts
            ),
            LogLevel::Warn,
        );
        let conflict = Conflict {
            files: &entry.files,
            with: &entry.with,
            attempt: entry.attempts + 1,
            max_attempts: self.config.max_resolve_attempts,
            why: &entry.why,
        };
        let turn = if self.remote {
            self.resolve_on_worker(id, wt, &entry, &conflict)?
        } else {
            self.resolve_here(id, wt, &entry, &conflict)?
        };
        let why = match turn {
            Resolution::Committed { sha, on } => {
                self.record_resolution(id, &entry, &sha, &on)?;
                return Ok(Next::Again);
            }
            Resolution::Asked(response) => {
                // Asked a person: the answer reaches the next resolution turn (the entry stays
                // `resolving`, so the next run makes the update again and asks again).
                let p = self.on_checkpoint(
                    &self.config.executor,
                    &response,
                    ResumeFor {
                        role: "executor".into(),
                        task: Some(id.to_string()),
                        asked: None,
                    },
                )?;
                return Ok(Next::Stop(Step::Stop(RunOutcome::Checkpoint(p))));
            }
            Resolution::Failed(why) => why,
        };
        self.resolution_failed(id, wt, entry, vec![why])
    }

    /// The resolution turn on this machine, in the worktree `wt` where the update is in progress.
    fn resolve_here(
        &self,
        id: &str,
        wt: &Path,
        entry: &QueueEntry,
        conflict: &Conflict<'_>,
    ) -> Result<Resolution> {
        let response = self.spawn(
            Role::Executor,
            &Focus {
                task: Some(id),
                resolve: Some(conflict),
                attempt: conflict.attempt,
                ..Focus::default()
            },
            Some(wt.to_path_buf()),
        )?;
        Ok(match response.status {
            AgentStatus::Success => self.take_resolution(id, wt, entry, &response.data)?,
            AgentStatus::Checkpoint => Resolution::Asked(response),
            AgentStatus::Error | AgentStatus::Timeout => Resolution::Failed(format!(
                "the executor did not resolve the conflict ({}): {}",
                status_word(response.status),
                clip(&response.data)
            )),
        })
    }

    /// The executor says it resolved: its files applied (API executors), no marker left, and the
    /// merge committed (not yet recorded).
    fn take_resolution(
        &self,
        id: &str,
        wt: &Path,
        entry: &QueueEntry,
        data: &str,
    ) -> Result<Resolution> {
        if let Err(why) = crate::reply::apply_files(wt, data) {
            return Ok(Resolution::Failed(why));
        }
        let marked = self.git.with_markers(wt, &entry.files);
        if !marked.is_empty() {
            return Ok(Resolution::Failed(format!(
                "conflict markers are left in {}",
                marked.join(", ")
            )));
        }
        let msg = format!(
            "metash: update task {id} with {} (conflicts resolved by the executor)",
            short(&entry.main)
        );
        Ok(match self.git.commit_resolution(wt, &msg)? {
            Ok(sha) => Resolution::Committed {
                sha,
                on: String::new(),
            },
            Err(unmerged) => Resolution::Failed(format!("still unmerged: {}", unmerged.join(", "))),
        })
    }

    /// The resolution's merge commit `sha` (made `on` a worker, or here) becomes the task's
    /// recorded tip, to be re-verified.
    fn record_resolution(&self, id: &str, entry: &QueueEntry, sha: &str, on: &str) -> Result<()> {
        let book = Book::of(&self.store().state()?);
        let mut updates = self.tip_updates(id, &book, sha);
        let entry = QueueEntry {
            state: QueueState::Reverifying,
            ..entry.clone()
        };
        updates.push(book::set_for(Entry::Verified, id, json!(false)));
        updates.push(book::set_for(Entry::Queue, id, json!(entry)));
        self.update(updates)?;
        self.progress(
            &format!(
                "task {id}: the executor{on} resolved the conflict ({})",
                short(sha)
            ),
            LogLevel::Info,
        );
        Ok(())
    }

    /// A resolution failed for `why`: the worktree goes back to the task's tip (the merge
    /// aborted) and the update is made again for the next turn, or for a person.
    pub(crate) fn resolution_failed(
        &self,
        id: &str,
        wt: &Path,
        entry: QueueEntry,
        why: Vec<String>,
    ) -> Result<Next> {
        self.git.reset_to(wt, &entry.head)?;
        let attempts = entry.attempts + 1;
        self.progress(
            &format!(
                "task {id}: resolution {attempts} of {} failed: {}",
                self.config.max_resolve_attempts,
                clip(&why.join("; "))
            ),
            LogLevel::Warn,
        );
        let entry = QueueEntry {
            state: QueueState::Waiting,
            attempts,
            why,
            ..entry
        };
        self.update(vec![
            book::set_for(Entry::Queue, id, json!(entry)),
            book::set_for(Entry::Verified, id, json!(true)),
        ])?;
        Ok(Next::Again)
    }

    /// The executor could not resolve: the conflict stays in progress in the task's worktree and a
    /// person is asked there, with the report.
    fn ask_person(&self, node: &TaskNode, wt: &Path, entry: QueueEntry) -> Result<Next> {
        let id = node.id.as_str();
        let entry = QueueEntry {
            state: QueueState::WaitingOnPerson,
            ..entry
        };
        self.update(vec![book::set_for(Entry::Queue, id, json!(entry))])?;
        let message = format!(
            "Task {id} ({}) conflicts with {} in {}, and the executor's resolution failed {} \
             time(s) (max_resolve_attempts = {}); last: {}. The merge is in progress in the \
             task's worktree {} (the project's checkout is untouched): resolve the files there, \
             `git add` them and `git commit`, then run `metash run --answer done` (or `--answer \
             abort` to halt).",
            node.title,
            names(&entry.with),
            entry.files.join(", "),
            entry.attempts,
            self.config.max_resolve_attempts,
            clip(&entry.why.join("; ")),
            wt.display()
        );
        let step = self.raise_own(
            message,
            vec!["done".into(), "abort".into()],
            ResumeFor {
                role: "queue".into(),
                task: Some(id.to_string()),
                asked: None,
            },
        )?;
        Ok(Next::Stop(step))
    }

    /// A person was asked to resolve task `node`'s conflict in its worktree and answered: `abort`
    /// halts; otherwise their merge commit (of the task's tip and the `HEAD` it was brought up to
    /// date with) is recorded as the task's tip and lands. Still in progress: asked again.
    pub(crate) fn after_person(
        &self,
        node: &TaskNode,
        state: &SessionState,
        book: &Book,
        entry: QueueEntry,
    ) -> Result<Next> {
        let id = node.id.as_str();
        let wt = worktree_of(&self.workspace(), id);
        let answered = book.resume_for.as_ref().is_some_and(|r| r.role == "queue");
        let answer = state
            .variables
            .get(book::NS)
            .and_then(|m| m.get(Entry::LastAnswer.as_str()))
            .and_then(|v| v.as_str());
        if answered && answer == Some("abort") {
            self.git.reset_to(&wt, &entry.head)?;
            self.update(vec![
                book::set_for(
                    Entry::Queue,
                    id,
                    json!(crate::queue::entry(QueueState::Waiting)),
                ),
                book::set(Entry::ResumeFor, book::null()),
            ])?;
            let halt = Halt {
                reason: HaltReason::MergeAborted,
                phase: state.current_phase,
                failed: vec![],
                message: format!(
                    "phase {} halted: resolving task {id}'s conflict was abandoned; its worktree is \
                     back at its last recorded commit",
                    state.current_phase
                ),
            };
            return Ok(Next::Stop(self.halt(halt)?));
        }
        if self.git.worktree_merging(&wt) {
            return self.ask_person(node, &wt, entry);
        }
        let tip = self.branch_tip(&branch_of(id))?.unwrap_or_default();
        let parents = self.git.parents(&wt, &tip)?;
        let mut updates = vec![book::set(Entry::ResumeFor, book::null())];
        if parents == [entry.head.clone(), entry.main.clone()] {
            updates.extend(self.tip_updates(id, book, &tip));
            self.progress(
                &format!(
                    "task {id}: a person resolved the conflict ({})",
                    short(&tip)
                ),
                LogLevel::Info,
            );
        } else if tip != entry.head {
            return Ok(Next::Stop(self.halt(self.refusal(
                state,
                id,
                format!(
                    "after the person's answer, branch {} is at {tip}, which is not the merge of \
                     the task's tip {} and {} metash asked for; nothing of it was used",
                    branch_of(id),
                    entry.head,
                    entry.main
                ),
            ))?));
        }
        // Resolved: it holds `HEAD` and lands; merge undone by hand: the queue asks again.
        updates.push(book::set_for(
            Entry::Queue,
            id,
            json!(QueueEntry {
                state: QueueState::Waiting,
                ..entry
            }),
        ));
        self.update(updates)?;
        Ok(Next::Again)
    }

    /// The tasks whose landed commits (in `HEAD`, not in the task) touch `files`.
    fn conflicting_tasks(
        &self,
        state: &SessionState,
        entry: &QueueEntry,
        files: &[String],
    ) -> Result<Vec<String>> {
        let root = self.workspace();
        let commits = self
            .git
            .commits_touching(&root, &entry.head, &entry.main, files)?;
        Ok(state
            .tasks()
            .iter()
            .filter(|t| {
                t.commits
                    .as_ref()
                    .is_some_and(|c| c.iter().any(|c| commits.contains(c)))
            })
            .map(|t| t.id.clone())
            .collect())
    }
}

/// Task ids for a sentence: "task a", "tasks a, b", or "the project's other changes".
fn names(ids: &[String]) -> String {
    match ids {
        [] => "changes in the project".into(),
        [one] => format!("task {one}"),
        many => format!("tasks {}", many.join(", ")),
    }
}
