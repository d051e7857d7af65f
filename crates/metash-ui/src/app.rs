//! What every handler shares ([`App`]) and the answers they all give ([`failure`],
//! [`csrf_refused`]). It sits below the handler modules ([`crate::server`], [`crate::review`],
//! [`crate::artifacts`]) so that they use it without importing one another.

use std::path::PathBuf;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use metash_policy::Redactor;
use metash_store::Store;

use crate::guard::Guard;
use crate::owners::Owners;
use crate::pages;

/// What every handler shares.
#[derive(Clone)]
pub struct App {
    pub root: PathBuf,
    pub store: Store,
    pub guard: Arc<Guard>,
    pub redactor: Arc<Redactor>,
    /// How long one live stream lasts.
    pub stream_lasts: std::time::Duration,
    /// Where this project's routes are: `""`, or `/p/NAME` when the server serves many.
    pub base: String,
    /// Who saved each artifact, indexed from the log as it grows.
    pub owners: Arc<std::sync::Mutex<Owners>>,
}

impl App {
    pub(crate) fn page(&self) -> pages::Page<'_> {
        pages::Page {
            base: &self.base,
            csrf: &self.guard.csrf,
        }
    }

    /// A redirect to `to` (relative to the project: `""` is its run view).
    pub(crate) fn redirect(&self, to: &str) -> Response {
        Redirect::to(&format!("{}/{to}", self.base)).into_response()
    }
}

/// A failure as a page with its status (the message names the file or the reason).
pub(crate) fn failure(status: StatusCode, e: impl std::fmt::Display) -> Response {
    (status, Html(pages::message("metash ui", &e.to_string()))).into_response()
}

/// The forms' CSRF field (checked here: the guard has not read the body).
pub(crate) fn csrf_refused(app: &App, csrf: &str) -> Option<Response> {
    (!app.guard.csrf_ok(csrf)).then(|| {
        failure(
            StatusCode::FORBIDDEN,
            "a form without this page's CSRF token",
        )
    })
}
