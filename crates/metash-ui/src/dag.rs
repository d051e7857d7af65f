//! The plan drawn as a graph (seed 001's DAG): each task a box in the column of its depth (the
//! longest chain of dependencies before it), an arrow from each dependency, coloured by status.
//! Server-rendered SVG with no script; every label is escaped like the rest of the page.

use std::collections::HashMap;
use std::fmt::Write as _;

use metash_protocol::TaskStatus;

use crate::html::esc;
use crate::model::TaskRow;

const COL: usize = 190;
const ROW: usize = 48;
const BOX_W: usize = 170;
const BOX_H: usize = 36;
const PAD: usize = 8;

/// Each task's depth: 0 without dependencies, else one more than its deepest dependency.
/// Dependencies the plan does not hold are ignored; a cycle (which plan validation refuses
/// anyway) cannot loop: a task being computed counts as depth 0.
fn depths(tasks: &[TaskRow]) -> HashMap<&str, usize> {
    let index: HashMap<&str, &TaskRow> = tasks.iter().map(|t| (t.task.id.as_str(), t)).collect();
    let mut depth: HashMap<&str, usize> = HashMap::new();
    fn visit<'a>(
        id: &'a str,
        index: &HashMap<&'a str, &'a TaskRow>,
        depth: &mut HashMap<&'a str, usize>,
        on_path: &mut Vec<&'a str>,
    ) -> usize {
        if let Some(d) = depth.get(id) {
            return *d;
        }
        if on_path.contains(&id) {
            return 0;
        }
        on_path.push(id);
        let d = index.get(id).map_or(0, |t| {
            t.task
                .dependencies
                .iter()
                .filter(|dep| index.contains_key(dep.as_str()))
                .map(|dep| visit(dep.as_str(), index, depth, on_path) + 1)
                .max()
                .unwrap_or(0)
        });
        on_path.pop();
        depth.insert(id, d);
        d
    }
    for t in tasks {
        visit(t.task.id.as_str(), &index, &mut depth, &mut Vec::new());
    }
    depth
}

fn status_class(s: TaskStatus) -> &'static str {
    match s {
        TaskStatus::Pending => "pending",
        TaskStatus::Complete => "complete",
        TaskStatus::Failed => "failed",
    }
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_string();
    }
    let mut c: String = s.chars().take(n.saturating_sub(1)).collect();
    c.push('…');
    c
}

/// The plan as an SVG element (empty for a plan without tasks).
pub fn svg(tasks: &[TaskRow]) -> String {
    if tasks.is_empty() {
        return String::new();
    }
    let depth = depths(tasks);
    let mut rows_in: HashMap<usize, usize> = HashMap::new();
    let mut at: HashMap<&str, (usize, usize)> = HashMap::new();
    for t in tasks {
        let d = depth.get(t.task.id.as_str()).copied().unwrap_or(0);
        let row = rows_in.entry(d).or_insert(0);
        at.insert(t.task.id.as_str(), (PAD + d * COL, PAD + *row * ROW));
        *row += 1;
    }
    let cols = depth.values().max().copied().unwrap_or(0) + 1;
    let rows = rows_in.values().max().copied().unwrap_or(1);
    let (w, h) = (cols * COL + PAD, rows * ROW + PAD);
    let mut out = format!(
        "<svg class=\"dag\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"the plan as a graph\">"
    );
    for t in tasks {
        let Some(&(x, y)) = at.get(t.task.id.as_str()) else {
            continue;
        };
        for dep in &t.task.dependencies {
            if let Some(&(dx, dy)) = at.get(dep.as_str()) {
                let (x1, y1, x2, y2) = (dx + BOX_W, dy + BOX_H / 2, x, y + BOX_H / 2);
                let mid = (x1 + x2) / 2;
                let _ = write!(
                    out,
                    "<path class=\"edge\" d=\"M{x1} {y1} C{mid} {y1} {mid} {y2} {x2} {y2}\"/>"
                );
            }
        }
    }
    for t in tasks {
        let Some(&(x, y)) = at.get(t.task.id.as_str()) else {
            continue;
        };
        let _ = write!(
            out,
            "<g class=\"node {cls}\" data-task=\"{id}\"><title>{id}: {title} ({status:?})</title>\
             <rect x=\"{x}\" y=\"{y}\" width=\"{BOX_W}\" height=\"{BOX_H}\" rx=\"5\"/>\
             <text x=\"{tx}\" y=\"{ty}\"><tspan class=\"id\">{id}</tspan> {short}</text></g>",
            cls = status_class(t.task.status),
            id = esc(&t.task.id),
            title = esc(&t.task.title),
            status = t.task.status,
            tx = x + 8,
            ty = y + BOX_H / 2 + 5,
            // About 22 characters fit a box (the id in bold): the id's, then the title's.
            short = esc(&clip(
                &t.task.title,
                20usize.saturating_sub(t.task.id.chars().count()).max(4)
            )),
        );
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use metash_protocol::Task;

    fn row(id: &str, title: &str, deps: &[&str], status: TaskStatus) -> TaskRow {
        TaskRow {
            task: Task {
                id: id.into(),
                title: title.into(),
                status,
                dependencies: deps.iter().map(|d| d.to_string()).collect(),
                commits: None,
            },
            worktree: None,
            comments_waiting: 0,
            agent: None,
        }
    }

    #[test]
    fn tasks_sit_in_the_column_of_their_depth_with_an_arrow_per_dependency() {
        let tasks = vec![
            row("a", "first", &[], TaskStatus::Complete),
            row("b", "<b>second</b>", &["a"], TaskStatus::Pending),
            row("c", "third", &["a", "b", "ghost"], TaskStatus::Failed),
        ];
        let d = depths(&tasks);
        assert_eq!((d["a"], d["b"], d["c"]), (0, 1, 2));
        let drawn = svg(&tasks);
        assert_eq!(
            drawn.matches("class=\"edge\"").count(),
            3,
            "a->b, a->c, b->c; no ghost"
        );
        assert!(drawn.contains("&lt;b&gt;second&lt;/b&gt;"));
        assert!(!drawn.contains("<b>"));
        assert!(drawn.contains("node complete") && drawn.contains("node failed"));
        assert_eq!(svg(&[]), "");
    }

    #[test]
    fn a_cycle_does_not_loop() {
        let tasks = vec![
            row("x", "x", &["y"], TaskStatus::Pending),
            row("y", "y", &["x"], TaskStatus::Pending),
        ];
        let d = depths(&tasks);
        assert!(d["x"] <= 2 && d["y"] <= 2);
    }
}
