//! The sessions page (`/sessions`): the project's interactive CLI sessions, live and past, with
//! their status as it is (a session whose process is gone is recorded `exited` first, by
//! [`metash_host::session_liveness::reconcile`], never shown as running). A session's terminal
//! output is the terminal's: it is not shown here.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use metash_store::cp_sessions::CpSession;

use crate::app::{failure, App};
use crate::html::esc;
use crate::pages::{frame, Page};

pub async fn sessions_view(State(app): State<App>) -> Response {
    let store = app.store.clone();
    let listed =
        tokio::task::spawn_blocking(move || metash_host::session_liveness::reconcile(&store)).await;
    let after = app.store.log().tail().map(|t| t.seq).unwrap_or(0);
    match listed {
        Ok(Ok(sessions)) => Html(page(&sessions, &app.page(), after)).into_response(),
        Ok(Err(e)) => failure(StatusCode::INTERNAL_SERVER_ERROR, e),
        Err(e) => failure(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// The table, newest first; every value escaped (a role name or an error is text).
pub fn page(sessions: &[CpSession], page: &Page<'_>, after: u64) -> String {
    let mut body = String::from(
        "<main><h1>Interactive sessions</h1>\
         <p>Attach with <code>metash session attach ID</code>; resume an exited one with \
         <code>metash session resume ID</code>.</p>",
    );
    if sessions.is_empty() {
        body.push_str("<p>No sessions (<code>metash session start --role ROLE</code>).</p>");
    } else {
        body.push_str(
            "<table class=\"sessions\"><tr><th>id</th><th>status</th><th>role</th>\
             <th>frontend</th><th>provider</th><th>continuation key</th><th>tmux</th>\
             <th>runs</th><th>exit</th><th>updated</th></tr>",
        );
        for s in sessions.iter().rev() {
            let _ = write!(
                body,
                "<tr class=\"{status}\"><td>{id}</td><td>{status}{why}</td><td>{role}</td>\
                 <td>{frontend}</td><td>{provider}</td><td>{key}</td><td>{target}</td>\
                 <td>{runs}</td><td>{exit}</td><td>{updated}</td></tr>",
                status = s.status.as_str(),
                id = esc(&s.id),
                why = s
                    .error
                    .as_deref()
                    .map(|e| format!(" <small>({})</small>", esc(e)))
                    .unwrap_or_default(),
                role = esc(s.role.as_deref().unwrap_or("-")),
                frontend = s.frontend.as_str(),
                provider = s.provider.as_str(),
                key = esc(s.continuation_key.as_deref().unwrap_or("-")),
                target = esc(s.terminal.as_ref().map_or("-", |t| t.target.as_str())),
                runs = s.runs,
                exit = s.exit_status.map(|c| c.to_string()).unwrap_or_default(),
                updated = s.updated_at.format("%Y-%m-%d %H:%M:%S UTC"),
            );
        }
        body.push_str("</table>");
    }
    body.push_str("</main>");
    frame("sessions", page, after, false, &body)
}
