//! The planner's reply and the rules a plan must follow before it becomes state.
//!
//! A reply is `{"tasks": [{"id", "title", "dependencies", "phase"?, "expects_change"?,
//! "labels"?, "paths"?}], "done"?: bool}` (a bare array of tasks is accepted too). `labels` name what a
//! worker must offer to run the task (`metash worker --labels`), kept in
//! `variables.metash.labels.<id>`. `paths` (optional) name the files or directories the task
//! expects to touch, kept in `variables.metash.paths.<id>`: tasks whose paths overlap are not run
//! at the same time (the scheduler holds the later one back), so fewer of them conflict in the
//! merge queue. **Phases** live beside the plan: `phase` defaults to the phase being
//! planned and may name a later one (planning ahead); the session's `Task` type has no phase field,
//! so the orchestrator keeps each task's phase in `variables.metash.phases.<id>`. A task may depend
//! on tasks of its own or an earlier phase, never on a later one.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Deserialize;
use serde_json::Value;

use crate::reply::extract_json;

/// Task ids end up in key paths (`plan.tasks.<id>.status`), branch names and directory names.
pub const MAX_ID_LEN: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannedTask {
    pub id: String,
    pub title: String,
    #[serde(default)]
    pub dependencies: Vec<String>,
    #[serde(default)]
    pub phase: Option<u32>,
    /// `false` for a task whose right outcome may be no change at all (a check, an
    /// investigation). Absent: the task must change something, or it fails verification.
    #[serde(default)]
    pub expects_change: Option<bool>,
    /// What a worker must offer to run it (`metash worker --labels`), e.g. `gpu`.
    #[serde(default)]
    pub labels: Vec<String>,
    /// The files or directories the task expects to touch (relative to the project): tasks
    /// whose paths overlap never run at the same time, so they conflict less.
    #[serde(default)]
    pub paths: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PlannerReply {
    pub tasks: Vec<PlannedTask>,
    /// The planner says the project needs nothing more.
    pub done: bool,
}

/// A task as the scheduler sees it: the plan's task plus its phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskNode {
    pub id: String,
    pub title: String,
    pub dependencies: Vec<String>,
    pub phase: u32,
    pub expects_change: bool,
    /// What a worker must offer to run it.
    pub labels: Vec<String>,
    /// What it expects to touch (empty: it did not say): see [`paths_overlap`].
    pub paths: Vec<String>,
}

/// Whether two tasks' `paths` overlap: one names a path the other names, or a directory holding
/// it. A task that named no path overlaps nothing.
pub fn paths_overlap(a: &[String], b: &[String]) -> bool {
    let within =
        |x: &str, y: &str| x == y || (x.starts_with(y) && x.as_bytes().get(y.len()) == Some(&b'/'));
    a.iter().any(|x| {
        let x = x.trim_end_matches('/');
        b.iter().any(|y| {
            let y = y.trim_end_matches('/');
            within(x, y) || within(y, x)
        })
    })
}

/// A task's `paths` are relative paths inside the project, without `..`.
fn check_paths(t: &PlannedTask) -> Result<(), String> {
    match t.paths.iter().find(|p| {
        p.trim().is_empty()
            || p.starts_with('/')
            || p.len() > 4096
            || p.split('/').any(|c| c == "..")
    }) {
        Some(bad) => Err(format!(
            "task `{}` has path `{bad}`: paths are relative to the project, without `..`",
            t.id
        )),
        None => Ok(()),
    }
}

/// Parses the planner's `data`.
///
/// # Errors
/// A reason fit to send back to the planner.
pub fn parse_reply(data: &str) -> Result<PlannerReply, String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Obj {
        #[serde(default)]
        tasks: Vec<PlannedTask>,
        #[serde(default)]
        done: bool,
        /// Free text the planner may add; ignored.
        #[serde(default, rename = "notes")]
        _notes: Option<Value>,
    }
    let value = extract_json(data)?;
    match value {
        Value::Array(_) => serde_json::from_value(value)
            .map(|tasks| PlannerReply { tasks, done: false })
            .map_err(|e| format!("the task list does not match the expected shape: {e}")),
        Value::Object(_) => serde_json::from_value::<Obj>(value)
            .map(|o| PlannerReply {
                tasks: o.tasks,
                done: o.done,
            })
            .map_err(|e| format!("the reply does not match the expected shape: {e}")),
        _ => Err("the reply must be a JSON object {\"tasks\": [...]}".into()),
    }
}

/// Checks `new` against itself and the tasks already planned, for phase `phase`; returns every
/// task (existing first, then new, in the planner's order).
///
/// # Errors
/// The first rule broken, worded for the planner: duplicate id, bad id, unknown dependency,
/// dependency on a later phase, a phase already past, or a cycle (named by its path).
pub fn validate(
    existing: &[TaskNode],
    new: &[PlannedTask],
    phase: u32,
) -> Result<Vec<TaskNode>, String> {
    let mut all: Vec<TaskNode> = existing.to_vec();
    let mut ids: HashSet<&str> = existing.iter().map(|t| t.id.as_str()).collect();
    for t in new {
        check_id(&t.id)?;
        if t.title.trim().is_empty() {
            return Err(format!("task `{}` has an empty title", t.id));
        }
        if let Some(bad) = t.labels.iter().find(|l| {
            l.is_empty()
                || l.len() > MAX_ID_LEN
                || !l
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        }) {
            return Err(format!(
                "task `{}` has label `{bad}`: a label is 1 to {MAX_ID_LEN} letters, digits, - _ .",
                t.id
            ));
        }
        check_paths(t)?;
        if !ids.insert(t.id.as_str()) {
            return Err(format!("duplicate task id `{}`", t.id));
        }
        let p = t.phase.unwrap_or(phase);
        if p < phase {
            return Err(format!(
                "task `{}` is for phase {p}, which is already past (planning phase {phase})",
                t.id
            ));
        }
        all.push(TaskNode {
            id: t.id.clone(),
            title: t.title.trim().to_string(),
            dependencies: t.dependencies.clone(),
            phase: p,
            expects_change: t.expects_change.unwrap_or(true),
            labels: t.labels.clone(),
            paths: t
                .paths
                .iter()
                .map(|p| p.trim_start_matches("./").to_string())
                .collect(),
        });
    }
    let by_id: HashMap<&str, &TaskNode> = all.iter().map(|t| (t.id.as_str(), t)).collect();
    for t in &all[existing.len()..] {
        let mut seen = HashSet::new();
        for d in &t.dependencies {
            if d == &t.id {
                return Err(format!("task `{}` depends on itself", t.id));
            }
            if !seen.insert(d.as_str()) {
                return Err(format!("task `{}` lists dependency `{d}` twice", t.id));
            }
            let Some(dep) = by_id.get(d.as_str()) else {
                return Err(format!("task `{}` depends on unknown task `{d}`", t.id));
            };
            if dep.phase > t.phase {
                return Err(format!(
                    "task `{}` (phase {}) depends on `{d}` of a later phase ({})",
                    t.id, t.phase, dep.phase
                ));
            }
        }
    }
    if let Some(cycle) = find_cycle(&all) {
        return Err(format!("dependency cycle: {}", cycle.join(" -> ")));
    }
    Ok(all)
}

fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(format!(
            "task id `{id}` must be 1 to {MAX_ID_LEN} characters"
        ));
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!(
            "task id `{id}` may hold only letters, digits, `-` and `_` (no `.`: ids are key-path segments and branch names)"
        ));
    }
    if id.starts_with('-') {
        return Err(format!("task id `{id}` may not start with `-`"));
    }
    Ok(())
}

/// A cycle as a path of ids (first id repeated at the end), if there is one. Iterative DFS with
/// colours so a 1,000-task chain cannot overflow the stack.
pub fn find_cycle(tasks: &[TaskNode]) -> Option<Vec<String>> {
    let index: HashMap<&str, usize> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (t.id.as_str(), i))
        .collect();
    let deps: Vec<Vec<usize>> = tasks
        .iter()
        .map(|t| {
            t.dependencies
                .iter()
                .filter_map(|d| index.get(d.as_str()).copied())
                .collect()
        })
        .collect();
    // 0 = white, 1 = on the stack, 2 = done
    let mut colour = vec![0u8; tasks.len()];
    let mut parent = vec![usize::MAX; tasks.len()];
    for root in 0..tasks.len() {
        if colour[root] != 0 {
            continue;
        }
        let mut stack = vec![(root, 0usize)];
        colour[root] = 1;
        while let Some((node, next)) = stack.last_mut() {
            let node = *node;
            if let Some(&d) = deps[node].get(*next) {
                *next += 1;
                match colour[d] {
                    0 => {
                        colour[d] = 1;
                        parent[d] = node;
                        stack.push((d, 0));
                    }
                    1 => {
                        // node -> ... -> d is on the stack: walk back from node to d.
                        let mut path = vec![tasks[d].id.clone()];
                        let mut cur = node;
                        let mut back = vec![];
                        while cur != d && cur != usize::MAX {
                            back.push(tasks[cur].id.clone());
                            cur = parent[cur];
                        }
                        back.reverse();
                        path.extend(back);
                        path.push(tasks[d].id.clone());
                        return Some(path);
                    }
                    _ => {}
                }
            } else {
                colour[node] = 2;
                stack.pop();
            }
        }
    }
    None
}

/// Dependencies first; ties keep plan order. Assumes no cycle (validated plans have none).
pub fn topo_order(tasks: &[TaskNode]) -> Vec<String> {
    let mut remaining: BTreeMap<usize, usize> = BTreeMap::new();
    let index: HashMap<&str, usize> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (t.id.as_str(), i))
        .collect();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); tasks.len()];
    for (i, t) in tasks.iter().enumerate() {
        let known: Vec<usize> = t
            .dependencies
            .iter()
            .filter_map(|d| index.get(d.as_str()).copied())
            .collect();
        remaining.insert(i, known.len());
        for d in known {
            dependents[d].push(i);
        }
    }
    let mut ready: std::collections::BTreeSet<usize> = remaining
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(i, _)| *i)
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    while let Some(i) = ready.pop_first() {
        out.push(tasks[i].id.clone());
        for &j in &dependents[i] {
            if let Some(n) = remaining.get_mut(&j) {
                *n -= 1;
                if *n == 0 {
                    ready.insert(j);
                }
            }
        }
    }
    out
}

/// Every task that depends on `id`, directly or not.
pub fn dependents_of(tasks: &[TaskNode], id: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut frontier = vec![id.to_string()];
    while let Some(cur) = frontier.pop() {
        for t in tasks {
            if t.dependencies.contains(&cur) && !out.contains(&t.id) && t.id != id {
                out.push(t.id.clone());
                frontier.push(t.id.clone());
            }
        }
    }
    out
}
