//! Many projects on one page (`metash ui --under DIR`): every metash project in DIR or one level
//! below it, each served under `/p/NAME` with all of its views, and an index at `/` that says
//! which ones wait on a person, so one tab watches all the agents a person has running.
//!
//! Projects are found when the server starts (a project made later needs a restart); a name is
//! the project's path under DIR with `/` kept and any character outside `[A-Za-z0-9._-]` made
//! `_`, so it is safe in a URL path as it is.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use axum::response::{Html, IntoResponse, Response};

use crate::html::esc;

/// Directories never looked into.
const SKIP: &[&str] = &["node_modules", "target", ".git", ".meta"];

fn is_project(dir: &Path) -> bool {
    dir.join(".meta").join("session.json").is_file()
}

fn url_name(rel: &Path) -> String {
    rel.components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .chars()
                .map(|ch| {
                    if ch.is_ascii_alphanumeric() || matches!(ch, '.' | '_' | '-') {
                        ch
                    } else {
                        '_'
                    }
                })
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The projects in `dir` (itself included) and one level below, by name; names made unique.
pub fn discover(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    if is_project(dir) {
        found.push(dir.to_path_buf());
    }
    let children = |d: &Path| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(d)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .is_some_and(|n| !n.starts_with('.') && !SKIP.contains(&n.as_str()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    for child in children(dir) {
        if is_project(&child) {
            found.push(child);
            continue;
        }
        found.extend(children(&child).into_iter().filter(|g| is_project(g)));
    }
    let mut named: Vec<(String, PathBuf)> = Vec::new();
    for p in found {
        let base = url_name(p.strip_prefix(dir).unwrap_or(&p));
        let base = if base.is_empty() { "root".into() } else { base };
        let mut name = base.clone();
        let mut n = 2;
        while named.iter().any(|(m, _)| *m == name) {
            name = format!("{base}-{n}");
            n += 1;
        }
        named.push((name, p));
    }
    named
}

/// The index: each project with its session, its plan's progress and what waits on a person.
pub fn index(projects: &[(String, PathBuf)]) -> Response {
    let mut b = String::from(
        "<h1>Projects</h1><table class=\"projects\"><tr><th>project</th><th>session</th>\
         <th>tasks done</th><th>waiting on you</th></tr>",
    );
    let mut waiting_total = 0;
    for (name, root) in projects {
        let row = metash_store::Store::open(root).and_then(|s| {
            let state = s.state()?;
            let asks = metash_host::asks::pending(&s).map_or(0, |a| a.len());
            Ok((state, asks))
        });
        match row {
            Ok((state, asks)) => {
                let tasks = state.tasks();
                let done = tasks
                    .iter()
                    .filter(|t| t.status == metash_protocol::TaskStatus::Complete)
                    .count();
                let waiting = asks + usize::from(state.pending_checkpoint.is_some());
                waiting_total += waiting;
                let _ = write!(
                    b,
                    "<tr class=\"{cls}\"><td><a href=\"/p/{n}/\">{n}</a><br><small>{root}</small></td>\
                     <td>{:?} · phase {}</td><td>{done} of {}</td><td>{w}</td></tr>",
                    state.status,
                    state.current_phase,
                    tasks.len(),
                    cls = if waiting > 0 { "needs-you" } else { "" },
                    n = esc(name),
                    root = esc(&root.display().to_string()),
                    w = if waiting > 0 {
                        format!("<b>{waiting}</b>")
                    } else {
                        "-".into()
                    },
                );
            }
            Err(e) => {
                let _ = write!(
                    b,
                    "<tr><td>{}</td><td colspan=\"3\">cannot be read: {}</td></tr>",
                    esc(name),
                    esc(&e.to_string())
                );
            }
        }
    }
    b.push_str("</table>");
    if projects.is_empty() {
        b.push_str(
            "<p>No metash project here (a project has <code>.meta/session.json</code>).</p>",
        );
    }
    let title = if waiting_total > 0 {
        "(needs you) metash: projects"
    } else {
        "metash: projects"
    };
    Html(format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\
         <meta http-equiv=\"refresh\" content=\"5\">\
         <link rel=\"stylesheet\" href=\"/assets/app.css\"></head><body>{b}</body></html>"
    ))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_safe_in_a_url() {
        assert_eq!(url_name(Path::new("team/api")), "team/api");
        assert_eq!(url_name(Path::new("my app/x?y")), "my_app/x_y");
    }
}
