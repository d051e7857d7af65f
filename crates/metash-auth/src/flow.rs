//! The two ways a person logs in (RFC 6749 with RFC 7636 PKCE through a loopback redirect, as
//! RFC 8252 asks of native apps; and RFC 8628's device flow), the refresh, the revocation and
//! the introspection, through the `oauth2` crate over metash's reqwest + rustls client (no
//! redirects followed: a token request never goes anywhere but the token endpoint).

use std::time::Duration;

use oauth2::basic::BasicClient;
use oauth2::{
    AuthUrl, AuthorizationCode, ClientId, CsrfToken, DeviceAuthorizationUrl, EndpointMaybeSet,
    IntrospectionUrl, PkceCodeChallenge, RedirectUrl, RevocationUrl, Scope,
    StandardDeviceAuthorizationResponse, TokenResponse, TokenUrl,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::{AuthError, Result};
use crate::provider::Provider;
use crate::secret::Secret;

/// How long a person has to finish a login in the browser.
const LOGIN_WAIT: Duration = Duration::from_secs(300);

pub(crate) type Client = BasicClient<
    EndpointMaybeSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

/// The HTTP client every flow uses.
///
/// # Errors
/// No TLS provider.
pub fn http_client() -> Result<reqwest::Client> {
    // Idempotent: an already installed provider is kept.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(30))
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| AuthError::Config(format!("the HTTP client: {e}")))
}

/// `oauth2`'s requests sent with reqwest.
pub(crate) async fn send(
    http: &reqwest::Client,
    req: oauth2::HttpRequest,
) -> std::result::Result<oauth2::HttpResponse, reqwest::Error> {
    let (parts, body) = req.into_parts();
    let resp = http
        .request(parts.method, parts.uri.to_string())
        .headers(parts.headers)
        .body(body)
        .send()
        .await?;
    let mut out = oauth2::http::Response::builder().status(resp.status());
    for (k, v) in resp.headers() {
        out = out.header(k, v);
    }
    let bytes = resp.bytes().await?;
    Ok(out.body(bytes.to_vec()).unwrap_or_default())
}

pub(crate) fn client(p: &Provider) -> Client {
    BasicClient::new(ClientId::new(p.client_id.clone()))
        .set_auth_uri_option(p.authorization_url.clone().map(AuthUrl::from_url))
        .set_token_uri_option(p.token_url.clone().map(TokenUrl::from_url))
        .set_device_authorization_url_option(
            p.device_authorization_url
                .clone()
                .map(DeviceAuthorizationUrl::from_url),
        )
        .set_revocation_url_option(p.revocation_url.clone().map(RevocationUrl::from_url))
        .set_introspection_url_option(p.introspection_url.clone().map(IntrospectionUrl::from_url))
}

/// What a successful login or refresh gave.
pub(crate) struct Granted {
    pub access_token: Secret,
    pub refresh_token: Option<Secret>,
    pub expires_in: Option<Duration>,
    pub scopes: Option<Vec<String>>,
}

fn granted(t: &oauth2::basic::BasicTokenResponse) -> Granted {
    Granted {
        access_token: Secret::new(t.access_token().secret().clone()),
        refresh_token: t.refresh_token().map(|r| Secret::new(r.secret().clone())),
        expires_in: t.expires_in(),
        scopes: t
            .scopes()
            .map(|s| s.iter().map(|x| x.to_string()).collect()),
    }
}

/// Shows a URL to the person: printed always (`say`), and opened in their browser unless told
/// not to: `browser` (the CLI passes `$BROWSER`), else the desktop's opener.
pub struct Opener {
    pub open_browser: bool,
    pub browser: Option<String>,
    pub say: Box<dyn Fn(&str) + Send + Sync>,
}

impl Opener {
    fn show(&self, url: &str) {
        if !self.open_browser {
            return;
        }
        let browser = self.browser.clone().filter(|b| !b.is_empty());
        let (prog, args): (String, Vec<String>) = match browser {
            Some(b) => (
                b.split(':').next().unwrap_or_default().to_string(),
                vec![url.to_string()],
            ),
            None if cfg!(target_os = "macos") => ("open".into(), vec![url.to_string()]),
            None if cfg!(windows) => (
                "cmd".into(),
                vec!["/C".into(), "start".into(), String::new(), url.to_string()],
            ),
            None => ("xdg-open".into(), vec![url.to_string()]),
        };
        if let Err(e) = std::process::Command::new(&prog)
            .args(&args)
            .stdin(std::process::Stdio::null())
            .spawn()
        {
            (self.say)(&format!(
                "could not start {prog} ({e}): open the URL yourself"
            ));
        }
    }
}

/// Authorization code with PKCE: a loopback listener on a free port is the redirect target;
/// the person signs in in their browser; the code comes back to the listener (its `state`
/// checked) and is exchanged with the verifier.
pub(crate) async fn pkce(
    http: &reqwest::Client,
    p: &Provider,
    scopes: &[String],
    opener: &Opener,
) -> Result<Granted> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| AuthError::io("binding the loopback redirect", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| AuthError::io("the loopback redirect's port", e))?
        .port();
    let redirect = RedirectUrl::new(format!("http://127.0.0.1:{port}/callback"))
        .map_err(|e| AuthError::flow(&p.name, "redirect", e))?;
    let client = client(p).set_redirect_uri(redirect);
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    let (url, state) = client
        .authorize_url(CsrfToken::new_random)
        .map_err(|e| AuthError::flow(&p.name, "authorization URL", e))?
        .add_scopes(scopes.iter().map(|s| Scope::new(s.clone())))
        .set_pkce_challenge(challenge)
        .url();
    (opener.say)(&format!("Sign in to {} in your browser: {url}", p.name));
    opener.show(url.as_str());
    let code = tokio::time::timeout(LOGIN_WAIT, callback(&listener, state.secret()))
        .await
        .map_err(|_| {
            AuthError::flow(
                &p.name,
                "sign-in",
                "no answer from the browser in 5 minutes",
            )
        })?
        .map_err(|why| AuthError::flow(&p.name, "sign-in", why))?;
    let token = client
        .exchange_code(AuthorizationCode::new(code))
        .map_err(|e| AuthError::flow(&p.name, "token URL", e))?
        .set_pkce_verifier(verifier)
        .request_async(&|r| send(http, r))
        .await
        .map_err(|e| AuthError::flow(&p.name, "code exchange", describe(&e)))?;
    Ok(granted(&token))
}

/// Waits for the browser's redirect to `/callback`; its code once the state matches.
async fn callback(
    listener: &tokio::net::TcpListener,
    state: &str,
) -> std::result::Result<String, String> {
    loop {
        let (mut conn, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 8192];
        let n = conn.read(&mut buf).await.unwrap_or(0);
        let head = String::from_utf8_lossy(&buf[..n]).into_owned();
        let target = head
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        let Some(query) = target.strip_prefix("/callback?") else {
            let _ = conn
                .write_all(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )
                .await;
            continue;
        };
        let params: std::collections::HashMap<String, String> =
            url::form_urlencoded::parse(query.as_bytes())
                .into_owned()
                .collect();
        let (status, body, result) =
            match (params.get("error"), params.get("state"), params.get("code")) {
                (Some(err), _, _) => (
                    "400 Bad Request",
                    "metash: the sign-in was refused.",
                    Err(format!("the provider said {err}")),
                ),
                (None, Some(s), Some(code)) if s == state => (
                    "200 OK",
                    "metash: signed in. You can close this window.",
                    Ok(code.clone()),
                ),
                _ => (
                    "400 Bad Request",
                    "metash: this is not the sign-in metash started.",
                    Err("a redirect with another state".to_string()),
                ),
            };
        let page = format!("<!doctype html><title>metash</title><p>{body}</p>");
        let _ = conn
            .write_all(format!("HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}", page.len()).as_bytes())
            .await;
        // A stray request with another state is ignored; an error from the provider ends it.
        match result {
            Ok(code) => return Ok(code),
            Err(why) if params.contains_key("error") => return Err(why),
            Err(_) => continue,
        }
    }
}

/// The device flow: the code is shown to the person (and the verification page opened), and
/// the token endpoint is polled at the server's interval, slower when it says `slow_down`.
pub(crate) async fn device(
    http: &reqwest::Client,
    p: &Provider,
    scopes: &[String],
    opener: &Opener,
) -> Result<Granted> {
    let client = client(p);
    let details: StandardDeviceAuthorizationResponse = client
        .exchange_device_code()
        .map_err(|e| AuthError::flow(&p.name, "device authorization URL", e))?
        .add_scopes(scopes.iter().map(|s| Scope::new(s.clone())))
        .request_async(&|r| send(http, r))
        .await
        .map_err(|e| AuthError::flow(&p.name, "device authorization", describe(&e)))?;
    (opener.say)(&format!(
        "To sign in to {}, open {} and enter the code {}",
        p.name,
        details.verification_uri().as_str(),
        details.user_code().secret()
    ));
    let page = details
        .verification_uri_complete()
        .map(|u| u.secret().clone())
        .unwrap_or_else(|| details.verification_uri().to_string());
    opener.show(&page);
    let token = client
        .exchange_device_access_token(&details)
        .map_err(|e| AuthError::flow(&p.name, "token URL", e))?
        .request_async(&|r| send(http, r), tokio::time::sleep, Some(LOGIN_WAIT))
        .await
        .map_err(|e| AuthError::flow(&p.name, "device token", describe(&e)))?;
    Ok(granted(&token))
}

/// A refresh: the new tokens (a rotated refresh token replaces the old one).
pub(crate) async fn refresh(
    http: &reqwest::Client,
    p: &Provider,
    refresh_token: &Secret,
) -> Result<Granted> {
    let rt = oauth2::RefreshToken::new(refresh_token.expose().to_string());
    let token = client(p)
        .exchange_refresh_token(&rt)
        .map_err(|e| AuthError::flow(&p.name, "token URL", e))?
        .request_async(&|r| send(http, r))
        .await
        .map_err(|e| match &e {
            oauth2::RequestTokenError::ServerResponse(r)
                if matches!(
                    r.error(),
                    oauth2::basic::BasicErrorResponseType::InvalidGrant
                ) =>
            {
                AuthError::LoginExpired(p.name.clone())
            }
            _ => AuthError::flow(&p.name, "refresh", describe(&e)),
        })?;
    Ok(granted(&token))
}

/// RFC 7009: revokes `token` at the provider. `Ok(false)` when the provider has no revocation
/// endpoint. Sent here rather than through `oauth2`, which refuses a plain-HTTP endpoint even on
/// loopback; this one requires HTTPS for anything but loopback.
pub(crate) async fn revoke(
    http: &reqwest::Client,
    p: &Provider,
    token: &Secret,
    refresh: bool,
) -> Result<bool> {
    let Some(url) = &p.revocation_url else {
        return Ok(false);
    };
    let loopback = matches!(url.host(), Some(url::Host::Ipv4(ip)) if ip.is_loopback())
        || matches!(url.host(), Some(url::Host::Ipv6(ip)) if ip.is_loopback())
        || url.host_str() == Some("localhost");
    if url.scheme() != "https" && !loopback {
        return Err(AuthError::flow(
            &p.name,
            "revocation",
            format!("{url} is not HTTPS"),
        ));
    }
    let hint = if refresh {
        "refresh_token"
    } else {
        "access_token"
    };
    let form: String = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("token", token.expose())
        .append_pair("token_type_hint", hint)
        .append_pair("client_id", &p.client_id)
        .finish();
    let resp = http
        .post(url.clone())
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .map_err(|e| AuthError::flow(&p.name, "revocation", format!("the request failed: {e}")))?;
    // RFC 7009 §2.2: 200 whether or not the token was valid.
    if !resp.status().is_success() {
        return Err(AuthError::flow(
            &p.name,
            "revocation",
            format!("the provider answered {}", resp.status()),
        ));
    }
    Ok(true)
}

/// RFC 7662: whether the provider still holds `token` active.
pub(crate) async fn introspect(
    http: &reqwest::Client,
    p: &Provider,
    token: &Secret,
) -> Result<bool> {
    let at = oauth2::AccessToken::new(token.expose().to_string());
    let client = client(p);
    let r = client
        .introspect(&at)
        .map_err(|e| AuthError::flow(&p.name, "introspection", e))?
        .request_async(&|r| send(http, r))
        .await
        .map_err(|e| AuthError::flow(&p.name, "introspection", describe(&e)))?;
    Ok(oauth2::TokenIntrospectionResponse::active(&r))
}

/// An `oauth2` request error as a person reads it (never with a token in it: the crate's errors
/// carry the server's error code and description, or the transport's).
fn describe<E: std::error::Error, T: oauth2::ErrorResponse>(
    e: &oauth2::RequestTokenError<E, T>,
) -> String {
    match e {
        oauth2::RequestTokenError::ServerResponse(r) => r.to_string(),
        oauth2::RequestTokenError::Request(e) => format!("the request failed: {e}"),
        oauth2::RequestTokenError::Parse(e, _) => format!("an answer that does not parse: {e}"),
        oauth2::RequestTokenError::Other(s) => s.clone(),
    }
}
