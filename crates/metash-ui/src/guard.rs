//! Who may use the UI. A page that can answer checkpoints and revoke grants is worth attacking
//! from any web page the user visits, so every request passes the same checks:
//!
//! - **Host**: only the names this server answers to on loopback (`127.0.0.1:P`, `localhost:P`,
//!   `[::1]:P`, or the `--listen` address): a DNS-rebinding page sends its own name and is refused.
//! - **Origin**, when the browser sends one: the same, so a foreign page's `fetch` or form post is
//!   refused even before the cookie is looked at.
//! - **Session**: the URL printed at start carries a random token; it is exchanged once for an
//!   `HttpOnly; SameSite=Strict` cookie, and every other request needs that cookie.
//! - **CSRF**: every POST carries the page's token (a form field or `x-csrf-token`).
//!
//! Tokens are compared in constant time. Every response gets a strict Content-Security-Policy
//! (scripts and styles from this origin only, no inline script, no frames), `nosniff`, no referrer
//! to other sites and no caching.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};

/// The cookie that carries the session.
pub const COOKIE: &str = "metash_ui";

/// The checks and their secrets, fixed for one server's life.
#[derive(Debug, Clone)]
pub struct Guard {
    /// In the URL printed at start, exchanged for the cookie.
    pub token: String,
    session: String,
    /// Carried by every form of every page.
    pub csrf: String,
    /// `Host` values accepted (`127.0.0.1:4000`...).
    hosts: Vec<String>,
}

/// Why a request was refused: its status and a plain message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: &'static str,
}

fn random() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Constant-time equality (the time does not tell how much of a guess was right).
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl Guard {
    /// A guard for a server on `port`, answering to loopback names and `extra_host` (the
    /// `--listen` address, when given).
    pub fn new(port: u16, extra_host: Option<String>) -> Self {
        let mut hosts = vec![
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
        ];
        hosts.extend(extra_host);
        Self {
            token: random(),
            session: random(),
            csrf: random(),
            hosts,
        }
    }

    fn host_ok(&self, headers: &HeaderMap) -> bool {
        headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .is_some_and(|h| self.hosts.iter().any(|a| a.eq_ignore_ascii_case(h)))
    }

    fn origin_ok(&self, headers: &HeaderMap) -> bool {
        match headers.get(header::ORIGIN).map(HeaderValue::to_str) {
            None => true,
            Some(Ok(o)) => o
                .strip_prefix("http://")
                .is_some_and(|h| self.hosts.iter().any(|a| a.eq_ignore_ascii_case(h))),
            Some(Err(_)) => false,
        }
    }

    /// Whether the request carries the session cookie.
    pub fn has_session(&self, headers: &HeaderMap) -> bool {
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().split_once('='))
            .any(|(k, v)| k == COOKIE && same(v, &self.session))
    }

    /// Whether `token` is the start URL's.
    pub fn token_ok(&self, token: &str) -> bool {
        same(token, &self.token)
    }

    /// Whether `csrf` is the pages' token.
    pub fn csrf_ok(&self, csrf: &str) -> bool {
        same(csrf, &self.csrf)
    }

    /// The `Set-Cookie` value that opens a session.
    pub fn session_cookie(&self) -> String {
        format!(
            "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/",
            self.session
        )
    }

    /// Host and Origin for every request; the session for all but the token exchange (`/login`)
    /// and the stylesheet of the refusal page; the CSRF header for POSTs that carry no form (a
    /// form's field is checked by its handler, which has read the body).
    pub fn check(&self, req: &Request<Body>) -> Result<(), Refusal> {
        let headers = req.headers();
        if !self.host_ok(headers) {
            return Err(Refusal {
                status: StatusCode::MISDIRECTED_REQUEST,
                message: "this server answers only to its own loopback address",
            });
        }
        if !self.origin_ok(headers) {
            return Err(Refusal {
                status: StatusCode::FORBIDDEN,
                message: "a request from another origin",
            });
        }
        let path = req.uri().path();
        if path == "/login" || path == "/assets/app.css" {
            return Ok(());
        }
        if !self.has_session(headers) {
            return Err(Refusal {
                status: StatusCode::UNAUTHORIZED,
                message: "no session: open the URL `metash ui` printed when it started",
            });
        }
        if req.method() == Method::POST {
            let form = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
            let header_ok = headers
                .get("x-csrf-token")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| self.csrf_ok(v));
            if !form && !header_ok {
                return Err(Refusal {
                    status: StatusCode::FORBIDDEN,
                    message: "a POST without the page's CSRF token",
                });
            }
        }
        Ok(())
    }
}

/// The Content-Security-Policy of every response: nothing from elsewhere, no inline script, no
/// plugins, no frames; images also from `data:` (previews) and this origin.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' \
                       data:; media-src 'self'; connect-src 'self'; form-action 'self'; \
                       frame-ancestors 'none'; base-uri 'self'";

/// Adds the security headers to a response.
pub fn harden(res: &mut Response<Body>) {
    let h = res.headers_mut();
    // A response that set a stricter policy (an artifact's `sandbox`) keeps it.
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Not `no-referrer`: with it a browser sends `Origin: null` on the page's own form posts,
    // which the Origin check must refuse (a sandboxed frame sends that too).
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: Method, path: &str, headers: &[(&str, &str)]) -> Request<Body> {
        let mut b = Request::builder().method(method).uri(path);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::empty()).unwrap_or_default()
    }

    #[test]
    fn each_check_refuses_what_it_is_for() {
        let g = Guard::new(4000, None);
        let cookie = format!("{COOKIE}={}", g.session);
        let ok = [("host", "127.0.0.1:4000"), ("cookie", cookie.as_str())];
        assert!(g.check(&req(Method::GET, "/", &ok)).is_ok());
        let status = |r: Request<Body>| g.check(&r).err().map(|e| e.status);
        assert_eq!(
            status(req(
                Method::GET,
                "/",
                &[("host", "evil.example:4000"), ok[1]]
            )),
            Some(StatusCode::MISDIRECTED_REQUEST)
        );
        assert_eq!(
            status(req(
                Method::GET,
                "/",
                &[ok[0], ok[1], ("origin", "http://evil.example")]
            )),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            status(req(
                Method::GET,
                "/",
                &[ok[0], ("cookie", "metash_ui=guess")]
            )),
            Some(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            status(req(Method::POST, "/revoke", &ok)),
            Some(StatusCode::FORBIDDEN),
            "a POST with neither form nor CSRF header"
        );
        let csrf = g.csrf.clone();
        assert!(g
            .check(&req(
                Method::POST,
                "/x",
                &[ok[0], ok[1], ("x-csrf-token", csrf.as_str())]
            ))
            .is_ok());
        assert!(g.check(&req(Method::GET, "/login", &ok[..1])).is_ok());
        assert!(!g.token_ok("") && g.token_ok(&g.token.clone()));
    }
}
