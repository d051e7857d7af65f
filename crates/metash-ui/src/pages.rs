//! Server-rendered HTML. Everything that comes from the project or an agent goes through [`esc`]:
//! an agent that outputs `<script>` shows it as text. The pages carry no inline script (the CSP
//! forbids it); `assets/app.js` adds the live parts.

use std::fmt::Write as _;

use metash_policy::ledger;
use metash_protocol::{LogRecord, TaskStatus};

pub use crate::html::esc;
use crate::model::{GrantRow, Run, TaskRow};

/// What every page of one project needs: where the project's routes are (`""`, or `/p/NAME`
/// when one server serves many projects; links are relative to it) and the CSRF token.
#[derive(Debug, Clone, Copy)]
pub struct Page<'a> {
    pub base: &'a str,
    pub csrf: &'a str,
}

/// The frame of every page: title (prefixed when a person is needed), navigation, the CSRF token
/// for the script's POSTs, the live cards' container.
pub fn frame(title: &str, page: &Page<'_>, after: u64, needs_you: bool, body: &str) -> String {
    let title = if needs_you {
        format!("(needs you) {title}")
    } else {
        title.to_string()
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <base href=\"{base}/\">\
         <meta name=\"csrf\" content=\"{csrf}\"><meta name=\"after\" content=\"{after}\">\
         <title>{t}</title>\
         <link rel=\"stylesheet\" href=\"assets/app.css\"></head><body>\
         <nav>{home}<a href=\"./\">run</a> <a href=\"ledger\">ledger</a> <a href=\"sessions\">sessions</a> \
         <span id=\"live\" class=\"live\">connecting…</span></nav>{body}\
         <script src=\"assets/render.js\"></script><script src=\"assets/app.js\"></script></body></html>",
        base = esc(page.base),
        csrf = esc(page.csrf),
        t = esc(&title),
        home = if page.base.is_empty() { "" } else { "<a href=\"/\">projects</a> " }
    )
}

fn status_class(s: TaskStatus) -> &'static str {
    match s {
        TaskStatus::Pending => "pending",
        TaskStatus::Complete => "complete",
        TaskStatus::Failed => "failed",
    }
}

/// The run view: session, budget, the checkpoint card, the plan (the server-rendered `main`, which
/// the script fetches again when the session changes), and the live cards, which stream from
/// `after` on.
pub fn run(run: &Run, page: &Page<'_>, after: u64) -> String {
    let csrf = page.csrf;
    let s = &run.state;
    let mut b = String::from("<main id=\"main\">");
    let _ = write!(
        b,
        "<h1>{}</h1><p class=\"session\">session <b id=\"status\">{:?}</b> · phase <b>{}</b> · \
         gapCount <b>{}</b> · revision {}</p>",
        esc(&run.root.display().to_string()),
        s.status,
        s.current_phase,
        s.gap_count,
        s.revision
    );
    b.push_str(&budget(run));
    for ask in &run.asks {
        b.push_str(&consent_card(ask, csrf));
    }
    if let Some(cp) = &run.checkpoint {
        if cp.id == metash_host::checkpoint::BUDGET_CHECKPOINT {
            b.push_str(&budget_card(run, cp, csrf));
        } else {
            b.push_str(&checkpoint_card(
                cp,
                csrf,
                "checkpoint",
                &format!("checkpoint <code>{}</code>", esc(&cp.id)),
            ));
        }
    }
    b.push_str("<h2>Plan</h2>");
    b.push_str(&crate::dag::svg(&run.tasks));
    b.push_str("<table class=\"plan\"><tr><th>task</th><th>title</th><th>status</th><th>agent</th><th>depends on</th><th>commits</th><th>worktree</th><th>change</th></tr>");
    for row in &run.tasks {
        b.push_str(&plan_row(row));
    }
    let queue = crate::queue::of(run);
    let _ = write!(
        b,
        "</table>{queue}</main><h2>Agents</h2>{}",
        agent_hints(run)
    );
    b.push_str("<div id=\"cards\" class=\"cards\"></div>");
    frame("metash: run", page, after, run.needs_you(), &b)
}

/// What each agent's manifest asks of its card (read by the script; never executed).
fn agent_hints(run: &Run) -> String {
    let mut b = String::from("<ul id=\"agents\" hidden>");
    for h in &run.hints {
        let _ = write!(
            b,
            "<li data-agent=\"{}\" data-hints=\"{}\"></li>",
            esc(&h.agent),
            esc(&h.hints.join(" "))
        );
    }
    b.push_str("</ul>");
    b
}

/// One task of the plan table: its status, agent, dependencies, commits, worktree, and a link to
/// its change (with the comments waiting for its agent).
fn plan_row(row: &TaskRow) -> String {
    let mut out = String::new();
    let t = &row.task;
    let commits: Vec<String> = t
        .commits
        .iter()
        .flatten()
        .map(|c| esc(&c[..c.len().min(10)]))
        .collect();
    let _ = write!(
        out,
        "<tr class=\"{cls}\" data-task=\"{id}\"><td>{id}</td><td>{title}</td><td>{st:?}</td><td>{agent}</td>\
         <td>{deps}</td><td><code>{commits}</code></td><td>{wt}</td><td><a class=\"difflink\" \
         href=\"diff?task={id}\">diff</a>{waiting}</td></tr>",
        cls = status_class(t.status),
        id = esc(&t.id),
        title = esc(&t.title),
        st = t.status,
        agent = esc(row.agent.as_deref().unwrap_or("")),
        deps = esc(&t.dependencies.join(", ")),
        commits = commits.join(" "),
        wt = row
            .worktree
            .as_ref()
            .map(|w| esc(&w.display().to_string()))
            .unwrap_or_default(),
        waiting = if row.comments_waiting > 0 {
            format!(" · {} comment(s) waiting", row.comments_waiting)
        } else {
            String::new()
        }
    );
    out
}

/// The budget: tokens and cost used, each of its allowance when one is set, and one bar for
/// whichever is nearer its limit.
fn budget(run: &Run) -> String {
    let (used, cost) = (run.used.tokens_used, run.used.cost_usd);
    let (max_tokens, max_cost) = (run.budget.max_tokens, run.budget.max_cost_usd);
    let tokens = match max_tokens {
        Some(m) => format!("tokens {used} of {m}"),
        None => format!("tokens used {used}"),
    };
    let money = match max_cost {
        Some(m) => format!("cost ${cost:.4} of ${m:.2}"),
        None => format!("cost ${cost:.4}"),
    };
    let token_pct = max_tokens.map(|m| {
        used.saturating_mul(100)
            .checked_div(m)
            .map_or(100, |p| p.min(100))
    });
    let cost_pct = max_cost
        .filter(|m| *m > 0.0)
        .map(|m| ((cost / m * 100.0).clamp(0.0, 100.0)) as u64);
    let Some(pct) = token_pct.into_iter().chain(cost_pct).max() else {
        return format!("<p class=\"budget\">{tokens} · {money} · no budget set</p>");
    };
    format!(
        "<p class=\"budget\">{tokens} · {money}</p>\
         <div class=\"bar\"><div class=\"fill p{}\"></div></div>",
        pct / 5 * 5
    )
}

/// A question waiting for any client: capability, reason, agent, the length asked for, the time
/// left; allow once, allow for N seconds, deny.
fn consent_card(ask: &metash_host::asks::Ask, csrf: &str) -> String {
    let suggested = ask.duration_s.unwrap_or(300).clamp(1, 86_400);
    format!(
        "<section class=\"card consent\" id=\"{id}\"><h2>Needs you: {agent} asks for \
         <code>{cap}</code></h2><p class=\"message\">{reason}</p><p class=\"from\">asked for \
         {asked} · denied unless answered in <span class=\"countdown\" data-deadline=\"{dl}\">\
         {dl}</span></p><form method=\"post\" action=\"consent\"><input type=\"hidden\" \
         name=\"csrf\" value=\"{csrf}\"><input type=\"hidden\" name=\"id\" value=\"{id}\">\
         <button type=\"submit\" name=\"answer\" value=\"once\">allow once</button> \
         <button type=\"submit\" name=\"answer\" value=\"for\">allow for</button> <input \
         name=\"seconds\" type=\"number\" min=\"1\" max=\"86400\" value=\"{suggested}\"> s \
         <button type=\"submit\" name=\"answer\" value=\"deny\">deny</button></form></section>",
        id = esc(&ask.id),
        agent = esc(&ask.agent),
        cap = esc(&ask.capability),
        reason = esc(&ask.reason),
        asked = ask
            .duration_s
            .map_or("one action".to_string(), |d| format!("{d} s")),
        dl = esc(&ask.deadline),
        csrf = esc(csrf),
    )
}

/// The budget bar turned into a checkpoint: the run stopped before a spawn that would pass the
/// budget; `continue` lets one spawn through.
fn budget_card(run: &Run, cp: &metash_protocol::PendingCheckpoint, csrf: &str) -> String {
    let (used, max) = (run.used.tokens_used, run.budget.max_tokens);
    let what = match max {
        Some(m) => format!("budget exhausted: {used} of {m} tokens"),
        None => format!("budget exhausted: ${:.4} spent", run.used.cost_usd),
    };
    checkpoint_card(cp, csrf, "checkpoint budget-out", &esc(&what))
}

fn checkpoint_card(
    cp: &metash_protocol::PendingCheckpoint,
    csrf: &str,
    class: &str,
    heading: &str,
) -> String {
    let sig = &cp.signal;
    let mut b = format!(
        "<section class=\"card {class}\" id=\"checkpoint\"><h2>Needs you: {heading}</h2>\
         <p class=\"from\">from {}</p><p class=\"message\">{}</p>\
         <form method=\"post\" action=\"checkpoint\"><input type=\"hidden\" name=\"csrf\" \
         value=\"{}\"><input type=\"hidden\" name=\"id\" value=\"{}\">",
        esc(&cp.agent),
        esc(&sig.message),
        esc(csrf),
        esc(&cp.id)
    );
    if sig.options.is_empty() {
        b.push_str(
            "<input name=\"answer\" required placeholder=\"your answer\"> \
             <button type=\"submit\">answer</button>",
        );
    } else {
        for o in &sig.options {
            let _ = write!(
                b,
                "<button type=\"submit\" name=\"answer\" value=\"{o}\">{o}</button> ",
                o = esc(o)
            );
        }
    }
    b.push_str("</form></section>");
    b
}

/// The ledger view: grants (revocable), then the records, with the chain's check.
pub fn ledger(grants: &[GrantRow], records: &[LogRecord], chain: &str, page: &Page<'_>) -> String {
    let csrf = page.csrf;
    let mut b = format!(
        "<h1>Ledger</h1><p class=\"chain\">hash chain: {}</p>\
         <p><a href=\"ledger/export\">export (redacted JSON lines)</a></p>\
         <form method=\"get\" action=\"ledger\" class=\"filter\">\
         <input name=\"agent\" placeholder=\"agent\"> <input name=\"capability\" \
         placeholder=\"capability\"> <button>filter</button></form>\
         <h2>Grants</h2><table class=\"grants\"><tr><th>agent</th><th>capability</th>\
         <th>expires</th><th>state</th><th></th></tr>",
        esc(chain)
    );
    for row in grants {
        let g = &row.grant;
        let state = match (&g.revoked_at, row.live) {
            (Some(at), _) => format!("revoked {}", esc(at)),
            (None, true) => "live".to_string(),
            (None, false) => "expired".to_string(),
        };
        let button = if row.live {
            format!(
                "<form method=\"post\" action=\"revoke\"><input type=\"hidden\" name=\"csrf\" \
                 value=\"{}\"><input type=\"hidden\" name=\"agent\" value=\"{}\"><input \
                 type=\"hidden\" name=\"capability\" value=\"{}\"><button>revoke</button></form>",
                esc(csrf),
                esc(&g.agent),
                esc(&g.capability.to_string())
            )
        } else {
            String::new()
        };
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{state}</td><td>{button}</td></tr>",
            esc(&g.agent),
            esc(&g.capability.to_string()),
            esc(&g.expires_at)
        );
    }
    b.push_str("</table><h2>Records</h2><table class=\"records\"><tr><th>seq</th><th>time</th><th>what</th></tr>");
    for r in records.iter().rev().take(500) {
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            r.seq,
            esc(&r.ts),
            esc(&ledger::summary(r))
        );
    }
    b.push_str("</table>");
    frame("metash: ledger", page, 0, false, &b)
}

/// A refusal or an error, as a page.
pub fn message(title: &str, text: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\
         <link rel=\"stylesheet\" href=\"/assets/app.css\"></head><body><h1>{t}</h1><p>{x}</p>\
         </body></html>",
        t = esc(title),
        x = esc(text)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_from_anywhere_is_text() {
        assert_eq!(
            esc("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
        let page = frame(
            "<b>",
            &Page {
                base: "",
                csrf: "c\"sr",
            },
            0,
            false,
            "",
        );
        assert!(page.contains("<title>&lt;b&gt;</title>"));
        assert!(page.contains("content=\"c&quot;sr\""));
        assert!(!page.contains("<script>") || page.contains("<script src="));
    }
}
