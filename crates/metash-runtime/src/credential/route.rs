//! Routes: which local path goes to which upstream, with which auth header. Validated once at
//! start, so serving a request is a prefix match and a string join.

use std::net::IpAddr;

use http::header::{self, HeaderName};
use reqwest::Url;

use super::CredentialError;

/// Headers that describe one connection, not the message: never forwarded either way
/// ([`super::headers`] strips them), so never a route's credential header either.
pub(crate) const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// A header a route may not use for its credential (it would be stripped or mean something else).
pub(crate) fn is_reserved(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name) || *name == header::HOST || *name == header::CONTENT_LENGTH
}

/// How the credential is presented to the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthStyle {
    /// `x-api-key: KEY` (Anthropic's API key header).
    XApiKey,
    /// `Authorization: Bearer KEY` (OpenAI-compatible APIs, OAuth tokens).
    Bearer,
    /// `NAME: KEY` under a custom header name (e.g. `api-key`, `x-goog-api-key`).
    Header(String),
}

/// Which requests on the proxy's port belong to a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// Paths equal to this prefix or under it (`/anthropic` serves `/anthropic/v1/messages`, not
    /// `/anthropicx`); the prefix is removed before the upstream's base path is put in front.
    Prefix(String),
    /// Every path not taken by a prefix route (at most one such route).
    WholePort,
}

/// One upstream the proxy may reach, and the only place its credential is added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Handed to [`super::CredentialSource::credential`] and named in events.
    pub id: String,
    pub mount: Mount,
    /// `https://host[:port][/base]`, or `http://` only for a loopback host (tests, local models): a
    /// key is never sent in clear text off the machine.
    pub upstream: String,
    pub auth: AuthStyle,
}

/// A validated route, ready to serve.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub id: String,
    /// `None` for [`Mount::WholePort`].
    pub prefix: Option<String>,
    /// `scheme://authority`, no trailing slash.
    pub origin: String,
    /// The upstream's base path without a trailing slash (may be empty).
    pub base_path: String,
    /// `host[:port]` as the upstream's `Host` header (reqwest sets it from the URL).
    pub host: String,
    pub header: HeaderName,
    pub bearer: bool,
}

impl Resolved {
    /// The upstream URL for `rest` (the path after the prefix, empty or starting with `/`) and
    /// the query, checked to still point at this route's host.
    pub fn target(&self, rest: &str, query: Option<&str>) -> Option<Url> {
        let mut s = format!("{}{}{}", self.origin, self.base_path, rest);
        if s.len() == self.origin.len() {
            s.push('/');
        }
        if let Some(q) = query {
            s.push('?');
            s.push_str(q);
        }
        let url = Url::parse(&s).ok()?;
        (authority(&url) == self.host).then_some(url)
    }
}

fn authority(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    }
}

/// Checks every route and turns them into [`Resolved`] ones.
pub(crate) fn resolve(routes: &[Route]) -> Result<Vec<Resolved>, CredentialError> {
    if routes.is_empty() {
        return Err(CredentialError::Route("no routes".into()));
    }
    let mut out: Vec<Resolved> = Vec::with_capacity(routes.len());
    for r in routes {
        let bad = |why: &str| CredentialError::Route(format!("route `{}`: {why}", r.id));
        if out.iter().any(|o| o.id == r.id) {
            return Err(bad("duplicate id"));
        }
        let prefix = match &r.mount {
            Mount::WholePort => None,
            Mount::Prefix(p) => Some(prefix_ok(p).ok_or_else(|| bad("bad prefix"))?),
        };
        if out.iter().any(|o| o.prefix == prefix) {
            return Err(bad("mount already taken"));
        }
        let url = Url::parse(&r.upstream).map_err(|e| bad(&format!("upstream: {e}")))?;
        let host = url.host_str().ok_or_else(|| bad("upstream has no host"))?;
        match url.scheme() {
            "https" => {}
            "http" if is_loopback(host) => {}
            "http" => return Err(bad("plain http upstream must be loopback")),
            _ => return Err(bad("upstream must be http(s)")),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(bad("upstream must not carry credentials"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(bad("upstream must not have a query or fragment"));
        }
        let (header, bearer) = match &r.auth {
            AuthStyle::XApiKey => (HeaderName::from_static("x-api-key"), false),
            AuthStyle::Bearer => (http::header::AUTHORIZATION, true),
            AuthStyle::Header(name) => {
                let h = HeaderName::try_from(name.as_str()).map_err(|_| bad("bad header name"))?;
                if is_reserved(&h) {
                    return Err(bad("auth header is hop-by-hop or Host"));
                }
                (h, false)
            }
        };
        let host = authority(&url);
        let origin = format!("{}://{host}", url.scheme());
        out.push(Resolved {
            id: r.id.clone(),
            prefix,
            base_path: url.path().trim_end_matches('/').to_string(),
            origin,
            host,
            header,
            bearer,
        });
    }
    Ok(out)
}

/// `/x[/y...]`, no trailing slash, no dot segments, nothing but a path.
fn prefix_ok(p: &str) -> Option<String> {
    let p = p.trim_end_matches('/');
    let ok = p.starts_with('/')
        && p.len() > 1
        && !p.contains(['?', '#', '%', '\\'])
        && !has_dot_segment(p);
    ok.then(|| p.to_string())
}

pub(crate) fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// `.` or `..` segments, also percent-encoded: refused so a path cannot climb out of the
/// upstream's base path once the upstream normalizes it.
pub(crate) fn has_dot_segment(path: &str) -> bool {
    path.split('/').any(|seg| {
        let s = seg.to_ascii_lowercase().replace("%2e", ".");
        s == "." || s == ".."
    })
}

/// The route serving `path` (longest prefix first, the whole-port route last) and the rest of
/// the path after its prefix.
pub(crate) fn route_for<'r, 'p>(
    routes: &'r [Resolved],
    path: &'p str,
) -> Option<(&'r Resolved, &'p str)> {
    let mut best: Option<(&Resolved, &str, usize)> = None;
    for r in routes {
        let (rest, len) = match &r.prefix {
            None => (path, 0),
            Some(p) => match path.strip_prefix(p.as_str()) {
                Some(rest) if rest.is_empty() || rest.starts_with('/') => (rest, p.len()),
                _ => continue,
            },
        };
        if best.is_none_or(|(_, _, l)| len > l) {
            best = Some((r, rest, len));
        }
    }
    best.map(|(r, rest, _)| (r, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(id: &str, mount: Mount, upstream: &str) -> Route {
        Route {
            id: id.into(),
            mount,
            upstream: upstream.into(),
            auth: AuthStyle::Bearer,
        }
    }

    #[test]
    fn prefixes_match_on_segment_boundaries_longest_first() {
        let rs = resolve(&[
            route(
                "a",
                Mount::Prefix("/a/".into()),
                "https://api.example.com/v1",
            ),
            route("ab", Mount::Prefix("/a/b".into()), "http://127.0.0.1:9"),
            route("all", Mount::WholePort, "https://other.example.com"),
        ])
        .expect("valid routes");
        let hit = |p: &str| route_for(&rs, p).map(|(r, rest)| (r.id.clone(), rest.to_string()));
        assert_eq!(hit("/a/x"), Some(("a".into(), "/x".into())));
        assert_eq!(hit("/a"), Some(("a".into(), "".into())));
        assert_eq!(hit("/a/b/c"), Some(("ab".into(), "/c".into())));
        assert_eq!(hit("/ax"), Some(("all".into(), "/ax".into())));
        let a = &rs[0];
        assert_eq!(
            a.target("/responses", Some("x=1")).map(|u| u.to_string()),
            Some("https://api.example.com/v1/responses?x=1".into())
        );
        assert_eq!(
            rs[1].target("", None).map(|u| u.to_string()),
            Some("http://127.0.0.1:9/".into())
        );
    }

    #[test]
    fn unsafe_routes_are_refused() {
        for (mount, up) in [
            (Mount::WholePort, "http://example.com"),
            (Mount::WholePort, "ftp://127.0.0.1"),
            (Mount::WholePort, "https://user:pw@example.com"),
            (Mount::WholePort, "https://example.com/?k=v"),
            (Mount::Prefix("a".into()), "https://example.com"),
            (Mount::Prefix("/a/../b".into()), "https://example.com"),
        ] {
            assert!(resolve(&[route("r", mount, up)]).is_err(), "{up}");
        }
        let mut r = route("r", Mount::WholePort, "https://example.com");
        r.auth = AuthStyle::Header("connection".into());
        assert!(resolve(&[r]).is_err());
        let twice = [
            route("r", Mount::WholePort, "https://example.com"),
            route("s", Mount::WholePort, "https://example.com"),
        ];
        assert!(resolve(&twice).is_err());
    }

    #[test]
    fn dot_segments_are_seen_encoded_or_not() {
        assert!(has_dot_segment("/a/../b"));
        assert!(has_dot_segment("/a/%2E%2e/b"));
        assert!(has_dot_segment("/a/./b"));
        assert!(!has_dot_segment("/a/..b/c.d"));
    }
}
