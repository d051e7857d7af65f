//! One request: admit it (a path under a route, addressed to us), or refuse it with 403 and a
//! `sandbox_denied` event; then swap the agent's auth for the real credential and stream the
//! upstream's answer back through the usage tap.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use metash_protocol::LogKind;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use reqwest::Url;
use serde_json::json;

use super::headers::{add_credential, add_grant_headers, request_headers, response_headers};
use super::record::{Delivery, Pending};
use super::replay::Cassette;
use super::route::{has_dot_segment, is_loopback, route_for, Resolved};
use super::secret::CredentialSource;
use super::tap::{OutBody, TappedBody, UsageTap};
use crate::sink::EventSink;

/// Longest request target quoted in an event.
const TARGET_IN_EVENT: usize = 200;

/// What every connection task shares.
pub(crate) struct Shared {
    pub routes: Vec<Resolved>,
    pub source: Arc<dyn CredentialSource>,
    pub sink: Arc<dyn EventSink>,
    pub agent: Option<String>,
    pub client: reqwest::Client,
    pub tap: Option<Arc<dyn UsageTap>>,
    /// Where each exchange goes when it ends, to be masked and recorded (`record.rs`).
    pub recorder: Option<Delivery>,
    /// Strings masked in recordings besides the grant's (the agent's placeholder).
    pub redact: Vec<String>,
    /// Answer from this recording instead of the upstream (`replay.rs`).
    pub replay: Option<Arc<Cassette>>,
    /// The proxy's own port: an absolute-form request must name it.
    pub port: u16,
    pub exchanges: AtomicU64,
}

/// The hyper service: never fails (every problem becomes a response).
pub(crate) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<OutBody>, Infallible> {
    let (route, url) = match admit(&shared, &req) {
        Ok(v) => v,
        Err(reason) => return Ok(shared.refuse(&req, StatusCode::FORBIDDEN, &reason)),
    };
    if let Some(cassette) = &shared.replay {
        let answer = super::replay::answer(cassette, &shared.redact, req).await;
        return Ok(answer.unwrap_or_else(|(status, why)| error_response(status, &why)));
    }
    let grant = match shared.source.grant(&route.id).await {
        Ok(g) => g,
        Err(e) => return Ok(shared.refuse(&req, StatusCode::SERVICE_UNAVAILABLE, &e.to_string())),
    };
    let (parts, body) = req.into_parts();
    let mut headers = request_headers(parts.headers, route);
    let mut record = shared.record(route, &grant, (&parts.method, &parts.uri), &headers);
    let added = add_credential(&mut headers, route, &grant.secret)
        .and_then(|()| add_grant_headers(&mut headers, &grant.headers));
    drop(grant);
    if added.is_none() {
        let reason = format!(
            "credential for route `{}` is not a valid header value",
            route.id
        );
        shared.record_denied(&parts.method, &parts.uri.to_string(), &reason);
        return Ok(error_response(StatusCode::SERVICE_UNAVAILABLE, &reason));
    }
    let mut cut = shared.source.withdrawn(&route.id).map(super::tap::cut_when);
    let send = shared
        .client
        .request(parts.method, url)
        .headers(headers)
        .body(Pending::body(record.as_ref(), body))
        .send();
    // A withdrawal while waiting for the upstream's head cuts the exchange too.
    let sent = match &mut cut {
        Some(c) => tokio::select! {
            r = send => r,
            () = c.as_mut() => {
                let why = format!("the credential for route `{}` was withdrawn", route.id);
                return Ok(error_response(StatusCode::SERVICE_UNAVAILABLE, &why));
            }
        },
        None => send.await,
    };
    let upstream = match sent {
        Ok(r) => http::Response::<reqwest::Body>::from(r),
        Err(e) => {
            let msg = format!("upstream for route `{}`: {}", route.id, e.without_url());
            return Ok(error_response(StatusCode::BAD_GATEWAY, &msg));
        }
    };
    let (head, body) = upstream.into_parts();
    if head.status == StatusCode::UNAUTHORIZED {
        shared.source.rejected(&route.id);
    }
    let exchange = shared.exchanges.fetch_add(1, Ordering::Relaxed);
    let headers = response_headers(head.headers);
    if let Some(r) = &mut record {
        r.head(exchange, head.status.as_u16(), &headers);
    }
    let tapped = TappedBody::new(
        body,
        shared.tap.clone(),
        exchange,
        Arc::from(route.id.as_str()),
        head.status.as_u16(),
        cut,
        record,
    );
    let mut out = Response::new(OutBody::Stream(tapped));
    *out.status_mut() = head.status;
    *out.headers_mut() = headers;
    Ok(out)
}

/// The route and upstream URL for a request, or why it is refused.
fn admit<'s>(shared: &'s Shared, req: &Request<Incoming>) -> Result<(&'s Resolved, Url), String> {
    if req.method() == Method::CONNECT {
        return Err("CONNECT is not served (no tunnels through the credential proxy)".into());
    }
    let uri = req.uri();
    if let Some(auth) = uri.authority() {
        if !is_loopback(auth.host()) || auth.port_u16() != Some(shared.port) {
            return Err(format!("absolute-form request for another host `{auth}`"));
        }
    }
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse::<http::uri::Authority>().ok());
    match host {
        None => return Err("missing or malformed Host header".into()),
        // A page in a browser could reach a loopback port under a rebound name: only requests
        // addressed to a loopback name are served.
        Some(h) if !is_loopback(h.host()) => {
            return Err(format!("Host header names another host `{h}`"))
        }
        Some(_) => {}
    }
    let path = uri.path();
    if !path.starts_with('/') || has_dot_segment(path) {
        return Err("request target is not a plain path".into());
    }
    let (route, rest) = route_for(&shared.routes, path).ok_or("no route for this path")?;
    let url = route
        .target(rest, uri.query())
        .ok_or("path does not map onto the route's upstream")?;
    Ok((route, url))
}

impl Shared {
    /// A recording of this exchange, when the host records (`record.rs`).
    fn record(
        &self,
        route: &Resolved,
        grant: &super::secret::Grant,
        request: (&Method, &http::Uri),
        headers: &http::HeaderMap,
    ) -> Option<Pending> {
        Pending::begin(
            self.recorder.as_ref(),
            &self.redact,
            (&route.id, &route.header),
            grant,
            request,
            headers,
        )
    }

    /// Logs the refusal (never a header: the request's own auth is the agent's placeholder,
    /// and the real credential was never added) and answers with a short JSON error.
    fn refuse(
        &self,
        req: &Request<Incoming>,
        status: StatusCode,
        reason: &str,
    ) -> Response<OutBody> {
        self.record_denied(req.method(), &req.uri().to_string(), reason);
        error_response(status, reason)
    }

    fn record_denied(&self, method: &Method, target: &str, reason: &str) {
        let target: String = target.chars().take(TARGET_IN_EVENT).collect();
        self.sink.record(
            LogKind::SandboxDenied,
            self.agent.as_deref(),
            json!({
                "what": "credential_proxy",
                "reason": reason,
                "method": method.as_str(),
                "target": target,
            }),
        );
    }
}

/// An error body both Anthropic- and OpenAI-style clients show (`error.message`).
pub(crate) fn error_response(status: StatusCode, reason: &str) -> Response<OutBody> {
    let body = json!({
        "type": "error",
        "error": {"type": "credential_proxy", "message": format!("metash credential proxy: {reason}")},
    });
    let mut out = Response::new(OutBody::Full(Some(Bytes::from(body.to_string()))));
    *out.status_mut() = status;
    out.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    out
}
