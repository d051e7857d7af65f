//! The executor's resolution mode: a request with `"resolve": {"files": [...]}` (the merge queue's
//! conflict, docs/orchestrator.md) is answered by rewriting each conflicting file in the worktree
//! with both sides kept: every conflict block becomes the task's lines followed by the project's
//! lines that the task's side does not already hold. Deterministic, so tests can say what the
//! merged file must hold.

use std::path::Path;

use serde_json::{json, Value};

use crate::Reply;

/// The files a resolution request names, if the request is one.
pub fn resolve_request(req: &Value) -> Option<Vec<String>> {
    let files = req.get("resolve")?.get("files")?.as_array()?;
    Some(
        files
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
    )
}

/// Resolves the conflicts in `files` (relative to `workspace`) by keeping both sides.
pub fn resolve_conflicts(workspace: &Path, files: &[String]) -> Reply {
    for file in files {
        let path = workspace.join(file);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => return Reply::Error(format!("{file}: {e}")),
        };
        if let Err(e) = std::fs::write(&path, keep_both(&text)) {
            return Reply::Error(format!("{file}: {e}"));
        }
    }
    Reply::Output(
        json!({"summary": format!("resolved {} by keeping both sides", files.join(", "))})
            .to_string(),
    )
}

/// `text` with every conflict block replaced by its first side, then the second side's lines the
/// first does not hold (git's `diff3` base section, `|||||||`, is dropped).
pub fn keep_both(text: &str) -> String {
    #[derive(PartialEq)]
    enum Part {
        Outside,
        Ours,
        Base,
        Theirs,
    }
    let mut out = String::new();
    let (mut ours, mut theirs): (Vec<&str>, Vec<&str>) = (vec![], vec![]);
    let mut part = Part::Outside;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        match part {
            _ if bare.starts_with("<<<<<<< ") || bare == "<<<<<<<" => part = Part::Ours,
            Part::Ours | Part::Base if bare.starts_with("|||||||") => part = Part::Base,
            Part::Ours | Part::Base if bare == "=======" => part = Part::Theirs,
            Part::Theirs if bare.starts_with(">>>>>>> ") || bare == ">>>>>>>" => {
                for l in &ours {
                    out.push_str(l);
                }
                for l in theirs.iter().filter(|l| !ours.contains(l)) {
                    out.push_str(l);
                }
                ours.clear();
                theirs.clear();
                part = Part::Outside;
            }
            Part::Ours => ours.push(line),
            Part::Base => {}
            Part::Theirs => theirs.push(line),
            Part::Outside => out.push_str(line),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_are_kept_once() {
        let text = "top\n<<<<<<< HEAD\ny\nshared\n=======\nx\nshared\n>>>>>>> abc\nend\n";
        assert_eq!(keep_both(text), "top\ny\nshared\nx\nend\n");
    }
}
