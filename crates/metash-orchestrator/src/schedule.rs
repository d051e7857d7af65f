//! Which task runs next: a ready queue over the phase's unfinished tasks, in plan order, releasing a
//! task when the last of its dependencies completes. A ready task whose `paths` overlap a running
//! task's waits until that one is done (fewer conflicts in the merge queue). Pure bookkeeping (no I/O), so it is unit-tested
//! and benchmarked on its own.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::plan::{paths_overlap, TaskNode};

#[derive(Debug, Default)]
pub struct Scheduler {
    order: Vec<String>,
    /// Unfinished dependencies left, per waiting task (index into `order`).
    waiting: HashMap<usize, usize>,
    dependents: Vec<Vec<usize>>,
    ready: BTreeSet<usize>,
    running: HashSet<usize>,
    finished: usize,
    index: HashMap<String, usize>,
    /// What each task said it touches (index into `order`).
    paths: Vec<Vec<String>>,
}

impl Scheduler {
    /// `to_run` are the tasks to execute (plan order); `done` the ids already complete. A
    /// dependency that is neither done nor in `to_run` keeps its dependents waiting forever: they
    /// show up in [`Scheduler::blocked`].
    pub fn new(to_run: &[&TaskNode], done: &HashSet<&str>) -> Self {
        let order: Vec<String> = to_run.iter().map(|t| t.id.clone()).collect();
        let index: HashMap<String, usize> = order
            .iter()
            .enumerate()
            .map(|(i, id)| (id.clone(), i))
            .collect();
        let mut dependents = vec![Vec::new(); order.len()];
        let mut waiting = HashMap::new();
        let mut ready = BTreeSet::new();
        for (i, t) in to_run.iter().enumerate() {
            let mut n = 0;
            for d in &t.dependencies {
                if done.contains(d.as_str()) {
                    continue;
                }
                n += 1;
                if let Some(&j) = index.get(d) {
                    dependents[j].push(i);
                }
            }
            if n == 0 {
                ready.insert(i);
            } else {
                waiting.insert(i, n);
            }
        }
        Self {
            order,
            waiting,
            dependents,
            ready,
            running: HashSet::new(),
            finished: 0,
            index,
            paths: to_run.iter().map(|t| t.paths.clone()).collect(),
        }
    }

    /// Moves `id` to the front of the ready queue if it is ready (a task that must run first, e.g.
    /// the one whose checkpoint was just answered).
    pub fn take_if_ready(&mut self, id: &str) -> Option<String> {
        let i = *self.index.get(id)?;
        if self.ready.remove(&i) {
            self.running.insert(i);
            return Some(self.order[i].clone());
        }
        None
    }

    /// The next ready task whose paths overlap no running task's, marked running.
    pub fn next_ready(&mut self) -> Option<String> {
        let clear = |i: &usize| {
            self.paths[*i].is_empty()
                || self
                    .running
                    .iter()
                    .all(|j| !paths_overlap(&self.paths[*i], &self.paths[*j]))
        };
        let i = *self.ready.iter().find(|i| clear(i))?;
        self.ready.remove(&i);
        self.running.insert(i);
        Some(self.order[i].clone())
    }

    /// `id` completed: its dependents may become ready.
    pub fn complete(&mut self, id: &str) {
        let Some(&i) = self.index.get(id) else { return };
        if !self.running.remove(&i) {
            return;
        }
        self.finished += 1;
        for &j in &self.dependents[i] {
            if let Some(n) = self.waiting.get_mut(&j) {
                *n -= 1;
                if *n == 0 {
                    self.waiting.remove(&j);
                    self.ready.insert(j);
                }
            }
        }
    }

    /// `id` failed and will be tried again.
    pub fn retry(&mut self, id: &str) {
        if let Some(&i) = self.index.get(id) {
            if self.running.remove(&i) {
                self.ready.insert(i);
            }
        }
    }

    /// `id` failed for good (or the run is stopping): it leaves the running set, its dependents
    /// stay waiting.
    pub fn abandon(&mut self, id: &str) {
        if let Some(&i) = self.index.get(id) {
            self.running.remove(&i);
        }
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    pub fn all_done(&self) -> bool {
        self.finished == self.order.len()
    }

    /// Tasks still waiting on a dependency that nothing will complete.
    pub fn blocked(&self) -> Vec<String> {
        let mut v: Vec<usize> = self.waiting.keys().copied().collect();
        v.sort_unstable();
        v.into_iter().map(|i| self.order[i].clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn node(id: &str, deps: &[&str]) -> TaskNode {
        TaskNode {
            id: id.into(),
            title: id.into(),
            dependencies: deps.iter().map(|d| d.to_string()).collect(),
            phase: 1,
            expects_change: true,
            labels: vec![],
            paths: vec![],
        }
    }

    #[test]
    fn diamond_runs_in_dependency_order_with_parallel_middle() {
        let tasks = [
            node("a", &[]),
            node("b", &["a"]),
            node("c", &["a"]),
            node("d", &["b", "c"]),
        ];
        let refs: Vec<&TaskNode> = tasks.iter().collect();
        let mut s = Scheduler::new(&refs, &HashSet::new());
        assert_eq!(s.next_ready().as_deref(), Some("a"));
        assert!(s.next_ready().is_none());
        s.complete("a");
        assert_eq!(s.next_ready().as_deref(), Some("b"));
        assert_eq!(s.next_ready().as_deref(), Some("c"));
        assert_eq!(s.running(), 2);
        s.complete("c");
        assert!(s.next_ready().is_none());
        s.retry("b");
        assert_eq!(s.next_ready().as_deref(), Some("b"));
        s.complete("b");
        assert_eq!(s.next_ready().as_deref(), Some("d"));
        s.complete("d");
        assert!(s.all_done());
    }

    #[test]
    fn overlapping_paths_never_run_at_once() {
        let mut tasks = [node("a", &[]), node("b", &[]), node("c", &[])];
        tasks[0].paths = vec!["src/".into()];
        tasks[1].paths = vec!["src/lib.rs".into()];
        tasks[2].paths = vec!["docs".into(), "srcx".into()];
        let refs: Vec<&TaskNode> = tasks.iter().collect();
        let mut s = Scheduler::new(&refs, &HashSet::new());
        assert_eq!(s.next_ready().as_deref(), Some("a"));
        // b touches a file under a's directory: it waits; c does not overlap.
        assert_eq!(s.next_ready().as_deref(), Some("c"));
        assert!(s.next_ready().is_none());
        assert!(s.has_ready());
        s.complete("a");
        assert_eq!(s.next_ready().as_deref(), Some("b"));
    }

    #[test]
    fn done_dependencies_do_not_wait_and_missing_ones_block() {
        let tasks = [node("b", &["a"]), node("c", &["x"])];
        let refs: Vec<&TaskNode> = tasks.iter().collect();
        let done: HashSet<&str> = ["a"].into_iter().collect();
        let mut s = Scheduler::new(&refs, &done);
        assert_eq!(s.next_ready().as_deref(), Some("b"));
        assert_eq!(s.blocked(), vec!["c".to_string()]);
    }
}
