//! The HTTP side: routes, the guard in front of all of them, and the handlers. Reads come from
//! the store at request time ([`crate::model`]); every change goes through the function the CLI
//! calls for it (`checkpoint::answer`, `consent::revoke`), so the UI is one more client with the
//! same rules: a checkpoint is answered once, by whichever client answers first.

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use metash_policy::ledger;
use serde::Deserialize;

use crate::app::{csrf_refused, failure, App};
use crate::guard::{harden, Guard};
use crate::{live, model, pages};

/// One project's routes (the guard is put in front by [`single`] or [`many`]).
pub fn project_routes(app: App) -> Router {
    Router::new()
        .route("/", get(run_view))
        .route("/ledger", get(ledger_view))
        .route("/sessions", get(crate::sessions::sessions_view))
        .route("/ledger/export", get(ledger_export))
        .route("/events", get(events))
        .route("/checkpoint", post(answer_checkpoint))
        .route("/revoke", post(revoke))
        .route("/consent", post(answer_consent))
        .route("/diff", get(crate::review::diff_view))
        .route("/comment", post(crate::review::comment))
        .route("/preview/{id}", get(crate::artifacts::preview_info))
        .route("/artifact/{id}", get(crate::artifacts::artifact))
        .merge(assets())
        .with_state(app)
}

fn assets<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/assets/app.js", get(app_js))
        .route("/assets/app.css", get(app_css))
        .route("/assets/render.js", get(render_js))
}

/// The server of one project, behind the guard.
pub fn single(app: App) -> Router {
    let guard = Arc::clone(&app.guard);
    project_routes(app)
        .route("/login", get(login).with_state(Arc::clone(&guard)))
        .layer(middleware::from_fn_with_state(guard, guarded))
}

/// The server of many projects: an index at `/`, each project under `/p/NAME`, one guard.
pub fn many(guard: Arc<Guard>, projects: Vec<(String, App)>) -> Router {
    let names: Vec<(String, PathBuf)> = projects
        .iter()
        .map(|(n, a)| (n.clone(), a.root.clone()))
        .collect();
    let mut r = Router::new()
        .route(
            "/",
            get(move || {
                let names = names.clone();
                async move { crate::projects::index(&names) }
            }),
        )
        .route("/login", get(login))
        .merge(assets())
        .with_state(Arc::clone(&guard));
    for (name, app) in projects {
        // A nested `/` answers the bare prefix only; the run view also lives at `/p/NAME/`,
        // where the page's `<base>` points.
        let view = get(run_view).with_state(app.clone());
        r = r
            .route(&format!("/p/{name}/"), view)
            .nest(&format!("/p/{name}"), project_routes(app));
    }
    r.layer(middleware::from_fn_with_state(guard, guarded))
}

async fn guarded(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let mut res = match guard.check(&req) {
        Ok(()) => next.run(req).await,
        Err(refusal) => (
            refusal.status,
            Html(pages::message("refused", refusal.message)),
        )
            .into_response(),
    };
    harden(&mut res);
    res
}

/// How much of the log's recent past a fresh run page streams into its cards.
const RECENT: u64 = 200;

async fn run_view(State(app): State<App>) -> Response {
    let after = app
        .store
        .log()
        .tail()
        .map(|t| t.seq.saturating_sub(RECENT))
        .unwrap_or(0);
    match model::Run::read(&app.store, &app.root) {
        Ok(run) => Html(pages::run(&run, &app.page(), after)).into_response(),
        Err(e) => failure(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

#[derive(Deserialize)]
struct Login {
    token: String,
}

async fn login(State(guard): State<Arc<Guard>>, Query(q): Query<Login>) -> Response {
    if !guard.token_ok(&q.token) {
        return failure(
            StatusCode::UNAUTHORIZED,
            "that token is not this server's: open the URL `metash ui` printed",
        );
    }
    let mut res = Redirect::to("/").into_response();
    if let Ok(v) = HeaderValue::from_str(&guard.session_cookie()) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    res
}

#[derive(Deserialize, Default)]
struct LedgerQuery {
    agent: Option<String>,
    capability: Option<String>,
}

fn ledger_filter(q: &LedgerQuery) -> ledger::Filter {
    let nonempty = |s: &Option<String>| {
        s.as_deref()
            .filter(|s| !s.trim().is_empty())
            .map(str::to_string)
    };
    ledger::Filter {
        agent: nonempty(&q.agent),
        capability: nonempty(&q.capability).and_then(|c| c.parse().ok()),
        ..ledger::Filter::default()
    }
}

async fn ledger_view(State(app): State<App>, Query(q): Query<LedgerQuery>) -> Response {
    let read = || -> crate::Result<String> {
        let grants = model::grants(&app.store)?;
        let records: Vec<_> = ledger::records(&app.store, &ledger_filter(&q))?
            .iter()
            .map(|r| app.redactor.redact_record(r))
            .collect();
        let chain = match app.store.log().verify() {
            Ok(n) => format!("verified, {n} records"),
            Err(e) => format!("BROKEN: {e}"),
        };
        Ok(pages::ledger(&grants, &records, &chain, &app.page()))
    };
    match read() {
        Ok(html) => Html(html).into_response(),
        Err(e) => failure(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

async fn ledger_export(State(app): State<App>, Query(q): Query<LedgerQuery>) -> Response {
    let mut out = Vec::new();
    match ledger::export(
        &app.store,
        &ledger_filter(&q),
        ledger::Format::Jsonl,
        &app.redactor,
        &mut out,
    ) {
        Ok(_) => (
            [(header::CONTENT_TYPE, "application/x-ndjson; charset=utf-8")],
            Body::from(out),
        )
            .into_response(),
        Err(e) => failure(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

#[derive(Deserialize)]
struct After {
    after: Option<u64>,
}

async fn events(State(app): State<App>, headers: HeaderMap, Query(q): Query<After>) -> Response {
    // The browser's Last-Event-ID (a reconnect) wins over where the page asked to start.
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let after = last.or(q.after).unwrap_or(0);
    live::stream(
        app.store.clone(),
        Arc::clone(&app.redactor),
        after,
        app.stream_lasts,
    )
    .into_response()
}

#[derive(Deserialize)]
struct Answer {
    csrf: String,
    id: String,
    answer: String,
}

async fn answer_checkpoint(State(app): State<App>, Form(f): Form<Answer>) -> Response {
    if let Some(r) = csrf_refused(&app, &f.csrf) {
        return r;
    }
    match metash_host::checkpoint::answer(&app.store, Some(&f.id), &f.answer) {
        Ok(_) => app.redirect(""),
        // Answered by someone else first, or not one of the options: say so.
        Err(e) => failure(StatusCode::CONFLICT, e),
    }
}

#[derive(Deserialize)]
struct ConsentForm {
    csrf: String,
    id: String,
    answer: String,
    seconds: Option<String>,
}

async fn answer_consent(State(app): State<App>, Form(f): Form<ConsentForm>) -> Response {
    if let Some(r) = csrf_refused(&app, &f.csrf) {
        return r;
    }
    let answer = match f.answer.as_str() {
        "once" => metash_policy::Answer::AllowOnce,
        "deny" => metash_policy::Answer::Deny,
        "for" => match f.seconds.as_deref().map(str::trim).map(str::parse::<u64>) {
            Some(Ok(s)) if (1..=86_400).contains(&s) => metash_policy::Answer::AllowFor(s),
            _ => {
                return failure(
                    StatusCode::BAD_REQUEST,
                    "allow for how long? a whole number of seconds from 1 to 86400",
                )
            }
        },
        other => return failure(StatusCode::BAD_REQUEST, format!("no answer `{other}`")),
    };
    match metash_host::asks::reply(&app.store, &f.id, answer, "ui") {
        Ok(()) => app.redirect(""),
        // Answered elsewhere first, or too late: say so.
        Err(e) => failure(StatusCode::CONFLICT, e),
    }
}

#[derive(Deserialize)]
struct Revoke {
    csrf: String,
    agent: String,
    capability: String,
}

async fn revoke(State(app): State<App>, Form(f): Form<Revoke>) -> Response {
    if let Some(r) = csrf_refused(&app, &f.csrf) {
        return r;
    }
    let cap = match f.capability.parse() {
        Ok(c) => c,
        Err(e) => return failure(StatusCode::BAD_REQUEST, e),
    };
    let registry =
        metash_policy::Registry::discover(&metash_policy::AgentDirs::new(&app.root, None));
    let policy = metash_policy::Policy::new(app.store.clone(), registry);
    match policy.revoke(&f.agent, &cap, "ui") {
        Ok(_) => app.redirect("ledger"),
        Err(e) => failure(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

async fn app_js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../assets/app.js"),
    )
        .into_response()
}

async fn render_js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../assets/render.js"),
    )
        .into_response()
}

async fn app_css() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("../assets/app.css"),
    )
        .into_response()
}
