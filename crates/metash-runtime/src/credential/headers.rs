//! Header hygiene both ways: hop-by-hop headers end at the proxy (RFC 9110 section 7.6.1), the
//! agent's own auth headers never pass, and the real credential is added last.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use zeroize::Zeroizing;

use super::route::{is_reserved, Resolved, HOP_BY_HOP};
use super::secret::Secret;

/// Whatever the agent sends as auth is dropped, whichever route it asked for.
const AGENT_AUTH: [HeaderName; 3] = [
    header::AUTHORIZATION,
    HeaderName::from_static("x-api-key"),
    header::PROXY_AUTHORIZATION,
];

/// Removes the hop-by-hop headers, including those the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::try_from(t.trim()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(named.iter()) {
        headers.remove(name);
    }
}

/// The agent's request headers as the upstream should see them, without the credential yet.
/// `Host` goes too: the client sets it from the upstream URL. A `Content-Length` next to a
/// `Transfer-Encoding` is dropped (the body's own length decides; no smuggling through us).
pub(crate) fn request_headers(mut headers: HeaderMap, route: &Resolved) -> HeaderMap {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
    strip_hop_by_hop(&mut headers);
    // `Expect: 100-continue` is answered by our server side; the upstream gets the whole body.
    for name in AGENT_AUTH
        .iter()
        .chain([&route.header, &header::HOST, &header::EXPECT])
    {
        headers.remove(name);
    }
    headers
}

/// Adds the credential in the route's style. `None` when the secret cannot be a header value
/// (control characters): the caller refuses the request without saying more.
pub(crate) fn add_credential(
    headers: &mut HeaderMap,
    route: &Resolved,
    secret: &Secret,
) -> Option<()> {
    let text = if route.bearer {
        Zeroizing::new(format!("Bearer {}", secret.expose()))
    } else {
        Zeroizing::new(secret.expose().to_string())
    };
    let mut value = HeaderValue::from_str(&text).ok()?;
    // Keeps it out of HPACK tables when the upstream speaks HTTP/2.
    value.set_sensitive(true);
    headers.insert(route.header.clone(), value);
    Some(())
}

/// Adds a grant's extra headers (a sign-in's account id), each replacing the agent's own copy.
/// `None` when a name or value is not a valid header, or names a header the proxy manages.
pub(crate) fn add_grant_headers(headers: &mut HeaderMap, extra: &[(String, Secret)]) -> Option<()> {
    for (name, value) in extra {
        let name = HeaderName::try_from(name.as_str()).ok()?;
        if is_reserved(&name) || AGENT_AUTH.contains(&name) {
            return None;
        }
        let mut value = HeaderValue::from_str(value.expose()).ok()?;
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    Some(())
}

/// The upstream's response headers as the agent should see them. The body is re-framed by the
/// server side (chunked when the upstream gave no length).
pub(crate) fn response_headers(mut headers: HeaderMap) -> HeaderMap {
    strip_hop_by_hop(&mut headers);
    headers
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credential::route::{resolve, AuthStyle, Mount, Route};

    fn resolved(auth: AuthStyle) -> Resolved {
        let r = Route {
            id: "m".into(),
            mount: Mount::WholePort,
            upstream: "https://api.example.com".into(),
            auth,
        };
        resolve(&[r]).expect("valid").remove(0)
    }

    #[test]
    fn agent_auth_and_hop_by_hop_are_stripped_then_the_key_added() {
        let route = resolved(AuthStyle::Header("api-key".into()));
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer placeholder"),
            ("x-api-key", "placeholder"),
            ("api-key", "placeholder"),
            ("proxy-authorization", "Basic x"),
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("transfer-encoding", "chunked"),
            ("content-length", "5"),
            ("host", "127.0.0.1:1"),
            ("content-type", "application/json"),
        ] {
            h.append(k, HeaderValue::from_static(v));
        }
        let mut out = request_headers(h, &route);
        assert_eq!(out.len(), 1, "{out:?}");
        add_credential(&mut out, &route, &Secret::new("real")).expect("valid value");
        assert_eq!(out.get("api-key").map(|v| v.as_bytes()), Some(&b"real"[..]));
        let bearer = resolved(AuthStyle::Bearer);
        let mut out = HeaderMap::new();
        add_credential(&mut out, &bearer, &Secret::new("real")).expect("valid value");
        assert_eq!(
            out.get("authorization").map(|v| v.as_bytes()),
            Some(&b"Bearer real"[..])
        );
        assert!(add_credential(&mut out, &bearer, &Secret::new("a\nb")).is_none());
    }

    #[test]
    fn grant_headers_replace_the_agents_and_may_not_touch_auth() {
        let mut h = HeaderMap::new();
        h.insert(
            "chatgpt-account-id",
            HeaderValue::from_static("placeholder"),
        );
        let extra = vec![("chatgpt-account-id".to_string(), Secret::new("acct-1"))];
        add_grant_headers(&mut h, &extra).expect("valid");
        assert_eq!(h.get_all("chatgpt-account-id").iter().count(), 1);
        assert_eq!(
            h.get("chatgpt-account-id").map(|v| v.as_bytes()),
            Some(&b"acct-1"[..])
        );
        for bad in ["authorization", "host", "bad name"] {
            let extra = vec![(bad.to_string(), Secret::new("x"))];
            assert!(add_grant_headers(&mut h, &extra).is_none(), "{bad}");
        }
    }
}
