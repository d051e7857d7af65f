//! OAuth handles (seed 002 §6): an agent that holds a live `oauth:PROVIDER.SCOPE` grant is given
//! a handle, an opaque id and a base URL on a credential proxy, never the token. The proxy adds
//! the person's token (from the vault, through `metash_auth::Broker`, refreshed when due) only on
//! requests to the provider's API base, and only while the grant is live: the grant is looked up
//! at every request, so a revocation or an expiry stops the next one. Anything else (another
//! path, another host, `CONNECT`) is refused by the proxy with a clear body.
//!
//! A login that expired and cannot be renewed raises a checkpoint for a person ("log in to NAME
//! again") and the request is refused with the reason: not a crash.
//!
//! The broker does network round trips (a refresh), and the proxy asks for a credential on its
//! own async runtime, so the broker lives on a thread of its own (the token server) that the
//! proxy's source asks through a channel.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metash_auth::{Broker, KeyOptions, Provider, Vault};
use metash_policy::{consent, Capability, Category};
use metash_protocol::{CheckpointReason, CheckpointSignal, LogKind};
use metash_runtime::credential::{
    AuthStyle, CredentialProxy, CredentialSource, Mount, ProxyConfig, Route, Secret, SourceError,
};
use metash_store::atomic::{stamp, Stamp};
use metash_store::{NewEvent, Store};
use serde_json::json;

use crate::error::{HostError, Result};
use crate::host::Host;

/// How long a request waits for the token server (a refresh included).
const TOKEN_WAIT: Duration = Duration::from_secs(60);

/// One handle: what the agent is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handle {
    pub provider: String,
    /// Opaque; names the handle in the log, never a token.
    pub id: String,
    /// Where the agent sends its API requests (the proxy's route for the provider).
    pub base_url: String,
    pub capability: String,
}

/// The handles of one spawn, served while this lives.
pub struct Handles {
    pub handles: Vec<Handle>,
    _proxy: CredentialProxy,
    /// Ends the withdrawal watcher.
    stop: Arc<std::sync::atomic::AtomicBool>,
    uses: mpsc::Sender<Use>,
}

impl Drop for Handles {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.flush();
    }
}

/// A message to the ledger writer: an `oauth_use` entry, or a wait until all before it are
/// written.
enum Use {
    Entry(serde_json::Value),
    Flush(mpsc::Sender<()>),
}

/// How long [`Handles::flush`] waits for the ledger writer.
const FLUSH_WAIT: Duration = Duration::from_secs(10);

/// Writes the `oauth_use` entries behind the requests, on a thread of its own: an entry is
/// durable (an fsync of the log), and a request through a handle must not wait for one. What
/// arrives together is one batch, one fsync. A spawn's handles flush when they end, so its
/// entries are in the log before the spawn returns.
fn use_writer(store: Store, agent: String) -> mpsc::Sender<Use> {
    let (tx, rx) = mpsc::channel::<Use>();
    std::thread::spawn(move || {
        while let Ok(first) = rx.recv() {
            let mut entries = Vec::new();
            let mut acks = Vec::new();
            for msg in std::iter::once(first).chain(rx.try_iter()) {
                match msg {
                    Use::Entry(data) => {
                        entries.push(NewEvent::new(LogKind::OauthUse, Some(&agent), data));
                    }
                    Use::Flush(ack) => acks.push(ack),
                }
            }
            if !entries.is_empty() {
                let _ = store.append_batch(&entries);
            }
            for ack in acks {
                let _ = ack.send(());
            }
        }
    });
    tx
}

/// How often the watcher looks at the grants behind live handles.
const WATCH_EVERY: Duration = Duration::from_millis(100);

impl Handles {
    /// The variables an agent gets: `METASH_OAUTH_<PROVIDER>` (the base URL) and
    /// `METASH_OAUTH_<PROVIDER>_HANDLE`.
    pub fn env(&self) -> Vec<(String, String)> {
        self.handles
            .iter()
            .flat_map(|h| {
                let p = h
                    .provider
                    .to_ascii_uppercase()
                    .replace(|c: char| !c.is_ascii_alphanumeric(), "_");
                [
                    (format!("METASH_OAUTH_{p}"), h.base_url.clone()),
                    (format!("METASH_OAUTH_{p}_HANDLE"), h.id.clone()),
                ]
            })
            .collect()
    }

    pub fn port(&self) -> u16 {
        self._proxy.addr().port()
    }

    /// Waits until every request's ledger entry so far is in the log.
    pub fn flush(&self) {
        let (ack, done) = mpsc::channel();
        if self.uses.send(Use::Flush(ack)).is_ok() {
            let _ = done.recv_timeout(FLUSH_WAIT);
        }
    }
}

/// Why the token server gave no token: the message, and whether a person must log in again.
type NoToken = (String, bool);

type Ask = (
    String,
    mpsc::Sender<std::result::Result<(Secret, bool), NoToken>>,
);

/// The broker on its own thread (a refresh is a network round trip, and the proxy asks on its
/// async runtime); ends when every sender is dropped.
fn token_server(broker: Arc<Broker>) -> mpsc::Sender<Ask> {
    let (tx, rx) = mpsc::channel::<Ask>();
    std::thread::spawn(move || {
        for (provider, reply) in rx {
            let r = broker
                .access_token_noting(&provider)
                .map(|(s, refreshed)| (Secret::new(s.expose().to_string()), refreshed))
                .map_err(|e| {
                    let expired = matches!(e, metash_auth::AuthError::LoginExpired(_));
                    (e.to_string(), expired)
                });
            let _ = reply.send(r);
        }
    });
    tx
}

/// The proxy's source: the grant checked at every request, then the token asked for. Each
/// request is a ledger entry (`oauth_use`), refused or not, written behind it.
struct HandleSource {
    store: Store,
    agent: String,
    uses: Mutex<mpsc::Sender<Use>>,
    /// The agent's grants as last read, under the consent document's stamp: every request
    /// checks its grant, and reads the document only when it changed.
    grants: Mutex<Option<(Stamp, Vec<consent::Grant>)>>,
    /// route id (the provider) -> the capability that must be live, and the handle's id.
    caps: Vec<(String, Capability, String)>,
    /// Asked first for a token already read and fresh (no I/O); else the token server.
    broker: Arc<Broker>,
    tokens: Mutex<mpsc::Sender<Ask>>,
    /// Per route: `true` once its grant is gone (the proxy cuts exchanges in flight).
    withdrawn: Vec<(String, tokio::sync::watch::Receiver<bool>)>,
}

impl CredentialSource for HandleSource {
    fn credential(&self, route: &str) -> std::result::Result<Secret, SourceError> {
        let r = self.lookup(route);
        if let Some((_, cap, handle)) = self.caps.iter().find(|(p, _, _)| p == route) {
            let mut data =
                json!({"provider": route, "handle": handle, "capability": cap.to_string()});
            match &r {
                Ok((_, refreshed)) => data["refreshed"] = json!(refreshed),
                Err(e) => data["refused"] = json!(e.to_string()),
            }
            if let Ok(uses) = self.uses.lock() {
                let _ = uses.send(Use::Entry(data));
            }
        }
        r.map(|(s, _)| s)
    }

    fn withdrawn(&self, route: &str) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.withdrawn
            .iter()
            .find(|(r, _)| r == route)
            .map(|(_, rx)| rx.clone())
    }
}

/// Whether `agent` holds a live grant covering `cap` now.
fn live(store: &Store, agent: &str, cap: &Capability) -> bool {
    let now = store.now();
    consent::load_for(store, agent)
        .map(|g| {
            g.iter()
                .any(|g| g.active_at(now) && g.capability.covers(cap))
        })
        .unwrap_or(false)
}

/// Looks at the grants every [`WATCH_EVERY`] until `stop`; a route whose grant is gone is
/// signalled once, and its exchanges in flight are cut by the proxy.
fn watch_grants(
    store: Store,
    agent: String,
    routes: Vec<(Capability, tokio::sync::watch::Sender<bool>)>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    std::thread::spawn(move || {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            for (cap, tx) in &routes {
                if !*tx.borrow() && !live(&store, &agent, cap) {
                    let _ = tx.send(true);
                }
            }
            std::thread::sleep(WATCH_EVERY);
        }
    });
}

impl HandleSource {
    /// [`live`], reading the consent document only when it is a new version.
    fn live(&self, cap: &Capability) -> bool {
        let path = self
            .store
            .meta_dir()
            .join(format!("{}.json", consent::CONSENT_DOC));
        let Some(now_stamp) = stamp(&path) else {
            return live(&self.store, &self.agent, cap);
        };
        let Ok(mut held) = self.grants.lock() else {
            return false;
        };
        let grants = match held.as_ref() {
            Some((at, grants)) if *at == now_stamp => grants,
            _ => match consent::load_for(&self.store, &self.agent) {
                // Stamped before the read: a version written meanwhile is read again next time.
                Ok(grants) => &held.insert((now_stamp, grants)).1,
                Err(_) => return false,
            },
        };
        let now = self.store.now();
        grants
            .iter()
            .any(|g| g.active_at(now) && g.capability.covers(cap))
    }

    fn lookup(&self, route: &str) -> std::result::Result<(Secret, bool), SourceError> {
        let unavailable = |reason: String| SourceError::Unavailable {
            route: route.to_string(),
            reason,
        };
        let Some((_, cap, _)) = self.caps.iter().find(|(r, _, _)| r == route) else {
            return Err(SourceError::Missing(route.to_string()));
        };
        if !self.live(cap) {
            return Err(unavailable(format!(
                "`{cap}` is no longer granted to {} (revoked or expired)",
                self.agent
            )));
        }
        if let Some(token) = self.broker.fresh_token(route) {
            return Ok((Secret::new(token.expose().to_string()), false));
        }
        let (tx, rx) = mpsc::channel();
        self.tokens
            .lock()
            .map_err(|_| unavailable("the token server is gone".into()))?
            .send((route.to_string(), tx))
            .map_err(|_| unavailable("the token server is gone".into()))?;
        match rx.recv_timeout(TOKEN_WAIT) {
            Ok(Ok(t)) => Ok(t),
            Ok(Err((why, expired))) => {
                if expired {
                    self.ask_for_login(route);
                }
                Err(unavailable(why))
            }
            Err(_) => Err(unavailable("no token in time".into())),
        }
    }

    /// The login behind a handle expired: not a crash but a checkpoint for a person ("log in
    /// again"), raised once (a second raise while it waits is refused and ignored).
    fn ask_for_login(&self, provider: &str) {
        let signal = CheckpointSignal {
            kind: Default::default(),
            reason: CheckpointReason::HumanAction,
            message: format!(
                "The login to {provider} has expired and could not be renewed. Run `metash auth \
                 login {provider}`, then answer `done`."
            ),
            options: vec!["done".into()],
            resume_id: Some(format!("metash-oauth-{provider}")),
        };
        let _ = crate::checkpoint::raise(&self.store, "host", &signal);
    }
}

/// The provider a capability names: `oauth:PROVIDER.SCOPE` (or `oauth:PROVIDER`).
fn provider_of(cap: &Capability) -> Option<String> {
    let scope = cap.scope.as_deref()?;
    Some(scope.split('.').next().unwrap_or(scope).to_string())
}

/// Starts the handles for `agent`'s live OAuth grants among `caps`; `None` when it holds none.
///
/// # Errors
/// A provider that is not configured or has no API base, the vault, or the proxy.
pub fn start(host: &Host, agent: &str, caps: &[Capability]) -> Result<Option<Handles>> {
    let wanted = wanted(host, agent, caps)?;
    if wanted.is_empty() {
        return Ok(None);
    }
    let root = host.store().workspace().to_path_buf();
    let routes = routes(&root, &wanted)?;
    let home = host.config_home().ok_or_else(|| {
        HostError::Config("no config directory for the vault (XDG_CONFIG_HOME or HOME)".into())
    })?;
    let keys = KeyOptions::from_env(|v| host.env_var(v));
    let broker = Arc::new(
        Broker::new(&root, &Vault::default_path(&home), keys)
            .map_err(|e| HostError::Config(e.to_string()))?,
    );
    let ids: Vec<String> = wanted
        .iter()
        .map(|_| format!("handle-{}", uuid::Uuid::new_v4().simple()))
        .collect();
    let (senders, receivers): (Vec<_>, Vec<_>) = wanted
        .iter()
        .map(|(p, c)| {
            let (tx, rx) = tokio::sync::watch::channel(false);
            ((c.clone(), tx), (p.clone(), rx))
        })
        .unzip();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    watch_grants(
        host.store().clone(),
        agent.to_string(),
        senders,
        Arc::clone(&stop),
    );
    let uses = use_writer(host.store().clone(), agent.to_string());
    let source = HandleSource {
        store: host.store().clone(),
        agent: agent.to_string(),
        uses: Mutex::new(uses.clone()),
        grants: Mutex::new(None),
        caps: wanted
            .iter()
            .zip(&ids)
            .map(|((p, c), id)| (p.clone(), c.clone(), id.clone()))
            .collect(),
        tokens: Mutex::new(token_server(Arc::clone(&broker))),
        broker,
        withdrawn: receivers,
    };
    let mut config = ProxyConfig::new(routes);
    config.agent = Some(agent.to_string());
    let proxy = CredentialProxy::start(config, Arc::new(source), host.event_sink())
        .map_err(|e| HostError::Config(format!("the OAuth handles' proxy: {e}")))?;
    let mut handles = Vec::new();
    for ((provider, cap), id) in wanted.into_iter().zip(ids) {
        let base_url = proxy
            .base_url(&provider)
            .ok_or_else(|| HostError::Other("the OAuth proxy lost a route".into()))?;
        let h = Handle {
            id,
            provider,
            base_url,
            capability: cap.to_string(),
        };
        host.store().append(
            LogKind::OauthHandle,
            Some(agent),
            json!({"provider": h.provider, "handle": h.id, "capability": h.capability,
                   "base_url": h.base_url}),
        )?;
        handles.push(h);
    }
    Ok(Some(Handles {
        handles,
        _proxy: proxy,
        stop,
        uses,
    }))
}

/// The providers `agent` holds a live grant for among `caps`, one capability each.
fn wanted(host: &Host, agent: &str, caps: &[Capability]) -> Result<Vec<(String, Capability)>> {
    let now = host.store().now();
    let grants = consent::load_for(host.store(), agent)?;
    let mut wanted: Vec<(String, Capability)> = Vec::new();
    for cap in caps.iter().filter(|c| c.category == Category::Oauth) {
        let Some(provider) = provider_of(cap) else {
            continue;
        };
        let live = grants
            .iter()
            .any(|g| g.active_at(now) && g.capability.covers(cap));
        if live && !wanted.iter().any(|(p, _)| *p == provider) {
            wanted.push((provider, cap.clone()));
        }
    }
    Ok(wanted)
}

/// One proxy route per provider: `/oauth/NAME` onto its first API base, with a bearer token.
fn routes(root: &std::path::Path, wanted: &[(String, Capability)]) -> Result<Vec<Route>> {
    wanted
        .iter()
        .map(|(provider, _)| {
            let p = Provider::named(root, provider)
                .map_err(|e| HostError::Config(e.to_string()))?;
            let base = p.api_bases.first().ok_or_else(|| {
                HostError::Config(format!(
                    "[oauth.providers.{provider}] names no api_bases: a handle needs the API it is for"
                ))
            })?;
            Ok(Route {
                id: provider.clone(),
                mount: Mount::Prefix(format!("/oauth/{provider}")),
                upstream: base.as_str().trim_end_matches('/').to_string(),
                auth: AuthStyle::Bearer,
            })
        })
        .collect()
}
