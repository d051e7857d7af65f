//! The diff card's routes: `GET /diff?task=ID[&view=split]` shows a task's change with its
//! comments; `POST /comment` records a line comment for the task's agent (through
//! `metash_orchestrator::review`, the one writer of those records).

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::Form;
use metash_orchestrator::git::diff;
use metash_orchestrator::review;
use serde::Deserialize;

use crate::app::{csrf_refused, failure, App};
use crate::diffview::{self, Layout};

#[derive(Deserialize)]
pub(crate) struct DiffQuery {
    task: String,
    view: Option<String>,
}

pub(crate) async fn diff_view(State(app): State<App>, Query(q): Query<DiffQuery>) -> Response {
    let layout = match q.view.as_deref() {
        Some("split") => Layout::Split,
        _ => Layout::Unified,
    };
    let read = move || -> crate::Result<Option<String>> {
        let state = app.store.state()?;
        let Some(task) = state.task(&q.task) else {
            return Ok(None);
        };
        let d = diff::task_diff(&app.root, &state, &q.task)
            .map_err(|e| crate::UiError::Refused(e.to_string()))?;
        let comments = review::of_task(&app.store, &q.task)
            .map_err(|e| crate::UiError::Refused(e.to_string()))?;
        Ok(Some(diffview::page(
            &q.task,
            &task.title,
            d.as_ref(),
            &comments,
            layout,
            &app.page(),
        )))
    };
    match tokio::task::spawn_blocking(read).await {
        Ok(Ok(Some(html))) => Html(html).into_response(),
        Ok(Ok(None)) => failure(StatusCode::NOT_FOUND, "no such task in the plan"),
        Ok(Err(e)) => failure(StatusCode::INTERNAL_SERVER_ERROR, e),
        Err(e) => failure(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

#[derive(Deserialize)]
pub(crate) struct CommentForm {
    csrf: String,
    task: String,
    file: String,
    line: String,
    text: String,
}

pub(crate) async fn comment(State(app): State<App>, Form(f): Form<CommentForm>) -> Response {
    if let Some(r) = csrf_refused(&app, &f.csrf) {
        return r;
    }
    let Ok(line) = f.line.trim().parse::<u32>() else {
        return failure(
            StatusCode::BAD_REQUEST,
            "the line is a whole number (0: the file)",
        );
    };
    let new = review::NewComment {
        task: &f.task,
        file: &f.file,
        line,
        text: &f.text,
        by: "ui",
    };
    match review::comment(&app.store, &new) {
        Ok(id) => app.redirect(&format!("diff?task={}#{id}", urlencode(&f.task))),
        Err(e) => failure(StatusCode::BAD_REQUEST, e),
    }
}

/// Percent-encodes a query value (task ids are names, but nothing from a form is trusted).
fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
