//! The diff card (issue 15): a task's change, unified or side by side, with a person's line
//! comments under the lines they are about. A comment is a plain form POST (`/comment`), made
//! durable by `metash_orchestrator::review` and handed to the task's agent as its next input;
//! the card says whether each one is still waiting or was delivered, and to which step.

use std::fmt::Write as _;

use metash_orchestrator::git::diff::{
    DiffEnd, FileChange, FileDiff, Hunk, Line, LineKind, TaskDiff,
};
use metash_orchestrator::review::Comment;

use crate::html::esc;
use crate::pages::frame;

/// How the lines are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Unified,
    Split,
}

/// The page for task `task`: its diff (or why there is none) and its comments.
pub fn page(
    task: &str,
    title: &str,
    diff: Option<&TaskDiff>,
    comments: &[Comment],
    layout: Layout,
    page: &crate::pages::Page<'_>,
) -> String {
    let csrf = page.csrf;
    let t = esc(task);
    let mut b = format!(
        "<section class=\"card diff\" id=\"diff\" data-task=\"{t}\"><h1>Task {t}: {}</h1>",
        esc(title)
    );
    let (unified, split) = match layout {
        Layout::Unified => (
            "<b>unified</b>".to_string(),
            format!("<a href=\"diff?task={t}&amp;view=split\">side by side</a>"),
        ),
        Layout::Split => (
            format!("<a href=\"diff?task={t}\">unified</a>"),
            "<b>side by side</b>".to_string(),
        ),
    };
    let _ = write!(b, "<p class=\"layout\">{unified} · {split}</p>");
    let Some(diff) = diff else {
        b.push_str("<p class=\"empty\">No change to show yet: the task has no commits, branch or worktree.</p></section>");
        return frame(&format!("metash: diff {task}"), page, 0, false, &b);
    };
    let end = match &diff.end {
        DiffEnd::Worktree(p) => format!(
            "its worktree <code>{}</code> (uncommitted work included)",
            esc(&p.display().to_string())
        ),
        DiffEnd::Commit(c) => format!("commit <code>{}</code>", esc(short(c))),
    };
    let _ = write!(
        b,
        "<p class=\"from\">from <code>{}</code> to {end} · {} file(s){}</p>",
        esc(short(&diff.base)),
        diff.files.len(),
        if diff.truncated {
            " · <b>cut at 5,000 lines</b>"
        } else {
            ""
        }
    );
    b.push_str(&comment_list(comments));
    for f in &diff.files {
        b.push_str(&file(task, f, comments, layout, csrf));
    }
    // The form the script clones under a line; outside any file, so a page without script still
    // lets a person comment on a file as a whole.
    let _ = write!(
        b,
        "<template id=\"comment-form\"><tr class=\"new-comment\"><td colspan=\"4\"><form \
         method=\"post\" action=\"comment\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <input type=\"hidden\" name=\"task\" value=\"{t}\"><input type=\"hidden\" name=\"file\">\
         <input type=\"hidden\" name=\"line\"><textarea name=\"text\" required maxlength=\"4000\" \
         placeholder=\"comment for the agent\"></textarea> <button type=\"submit\">comment</button>\
         </form></td></tr></template></section>",
        esc(csrf)
    );
    frame(&format!("metash: diff {task}"), page, 0, false, &b)
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(10)]
}

fn comment_list(comments: &[Comment]) -> String {
    if comments.is_empty() {
        return "<p class=\"comments none\">No comments yet: click a line number to comment; the \
                agent gets your comments as its next input.</p>"
            .into();
    }
    let mut b = String::from("<ul class=\"comments\">");
    for c in comments {
        let at = if c.line == 0 {
            c.file.clone()
        } else {
            format!("{}:{}", c.file, c.line)
        };
        let _ = write!(
            b,
            "<li id=\"{}\"><code>{}</code> {} <span class=\"state\">{}</span></li>",
            esc(&c.id),
            esc(&at),
            esc(&c.text),
            state(c)
        );
    }
    b.push_str("</ul>");
    b
}

fn state(c: &Comment) -> String {
    match (&c.delivered_at, &c.delivered_to) {
        (Some(at), to) => format!(
            "delivered to the {} at {}",
            esc(to.as_deref().unwrap_or("agent")),
            esc(at)
        ),
        (None, _) => "waiting for the task's next step".into(),
    }
}

fn change_word(c: FileChange) -> &'static str {
    match c {
        FileChange::Added => "added",
        FileChange::Deleted => "deleted",
        FileChange::Modified => "modified",
        FileChange::Renamed => "renamed",
        FileChange::Other => "changed",
    }
}

fn file(task: &str, f: &FileDiff, comments: &[Comment], layout: Layout, csrf: &str) -> String {
    let mut b = format!(
        "<div class=\"file\" data-file=\"{p}\"><h3><code>{p}</code> {}{}</h3>",
        change_word(f.change),
        f.old_path
            .as_ref()
            .map(|o| format!(" from <code>{}</code>", esc(o)))
            .unwrap_or_default(),
        p = esc(&f.path)
    );
    if f.binary {
        b.push_str("<p class=\"binary\">binary file: not shown</p></div>");
        return b;
    }
    let cols = match layout {
        Layout::Unified => "<col class=\"n\"><col class=\"n\"><col class=\"s\"><col>",
        Layout::Split => {
            "<col class=\"n\"><col class=\"half\"><col class=\"n\"><col class=\"half\">"
        }
    };
    let _ = write!(
        b,
        "<table class=\"lines {}\">{cols}",
        if layout == Layout::Split {
            "split"
        } else {
            "unified"
        }
    );
    for h in &f.hunks {
        let _ = write!(
            b,
            "<tr class=\"hunk\"><td colspan=\"4\">{}</td></tr>",
            esc(&h.header)
        );
        match layout {
            Layout::Unified => unified(&mut b, h, f, comments),
            Layout::Split => split(&mut b, h, f, comments),
        }
    }
    b.push_str("</table>");
    let _ = write!(
        b,
        "<form method=\"post\" action=\"comment\" class=\"file-comment\"><input type=\"hidden\" \
         name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"task\" value=\"{}\"><input \
         type=\"hidden\" name=\"file\" value=\"{}\"><input type=\"hidden\" name=\"line\" \
         value=\"0\"><input name=\"text\" required maxlength=\"4000\" placeholder=\"comment on \
         this file\"> <button type=\"submit\">comment</button></form></div>",
        esc(csrf),
        esc(task),
        esc(&f.path)
    );
    b
}

fn num(n: Option<u32>) -> String {
    n.map(|n| n.to_string()).unwrap_or_default()
}

fn class(k: LineKind) -> &'static str {
    match k {
        LineKind::Added => "add",
        LineKind::Removed => "del",
        LineKind::Context => "ctx",
    }
}

/// The line-number cell a person clicks to comment (lines of the new version only).
fn new_cell(l: Option<&Line>) -> String {
    match l.and_then(|l| (l.kind != LineKind::Removed).then_some(l.new).flatten()) {
        Some(n) => {
            format!("<td class=\"n c\" data-line=\"{n}\" title=\"comment on this line\">{n}</td>")
        }
        None => format!("<td class=\"n\">{}</td>", num(l.and_then(|l| l.old))),
    }
}

fn comments_under(b: &mut String, f: &FileDiff, l: &Line, comments: &[Comment]) {
    if l.kind == LineKind::Removed {
        return;
    }
    for c in comments
        .iter()
        .filter(|c| c.file == f.path && Some(c.line) == l.new)
    {
        let _ = write!(
            b,
            "<tr class=\"comment\"><td colspan=\"4\"><b>comment</b> {} <span class=\"state\">{}</span></td></tr>",
            esc(&c.text),
            state(c)
        );
    }
}

fn unified(b: &mut String, h: &Hunk, f: &FileDiff, comments: &[Comment]) {
    for l in &h.lines {
        let sign = match l.kind {
            LineKind::Added => '+',
            LineKind::Removed => '-',
            LineKind::Context => ' ',
        };
        let _ = write!(
            b,
            "<tr class=\"{c}\"><td class=\"n\">{}</td>{}<td class=\"s\">{sign}</td><td class=\"{c}\"><code>{}</code></td></tr>",
            num(l.old),
            new_cell(Some(l)),
            esc(&l.text),
            c = class(l.kind),
        );
        comments_under(b, f, l, comments);
    }
}

/// Side by side: context on both sides; a run of removed lines beside the added lines that
/// follow it.
fn split(b: &mut String, h: &Hunk, f: &FileDiff, comments: &[Comment]) {
    let mut i = 0;
    while i < h.lines.len() {
        if h.lines[i].kind == LineKind::Context {
            let l = &h.lines[i];
            row(b, Some(l), Some(l));
            comments_under(b, f, l, comments);
            i += 1;
            continue;
        }
        let dels: Vec<&Line> = h.lines[i..]
            .iter()
            .take_while(|l| l.kind == LineKind::Removed)
            .collect();
        let adds: Vec<&Line> = h.lines[i + dels.len()..]
            .iter()
            .take_while(|l| l.kind == LineKind::Added)
            .collect();
        for k in 0..dels.len().max(adds.len()) {
            row(b, dels.get(k).copied(), adds.get(k).copied());
            if let Some(a) = adds.get(k) {
                comments_under(b, f, a, comments);
            }
        }
        i += dels.len() + adds.len();
    }
}

fn row(b: &mut String, left: Option<&Line>, right: Option<&Line>) {
    let side = |l: Option<&Line>| {
        l.map(|l| (class(l.kind), esc(&l.text)))
            .unwrap_or(("none", String::new()))
    };
    let (lc, lt) = side(left);
    let (rc, rt) = side(right);
    let _ = write!(
        b,
        "<tr><td class=\"n\">{}</td><td class=\"{lc}\"><code>{lt}</code></td>{}<td class=\"{rc}\"><code>{rt}</code></td></tr>",
        num(left.and_then(|l| l.old)),
        new_cell(right)
    );
}
