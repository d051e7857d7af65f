//! Network for WASM agents. Only WASI preview-2 components have sockets (preview 1 has no outbound
//! socket API); for them every socket address the guest uses passes wasmtime-wasi's
//! `socket_addr_check`, and this module decides there, mirroring the native sandbox:
//!
//! - `network` not granted (or `NetworkAccess::None`): every connect, bind and UDP use is refused.
//! - `Allowlist`: the agent gets its own host-side CONNECT proxy (the native sandbox's
//!   [`ConnectProxy`], alive as long as the agent) and may connect to `127.0.0.1:<proxy port>`
//!   only; the proxy checks the allowlist and asks the gate. Name lookup is off (the proxy
//!   resolves, after its check). The proxy's address is in `HTTPS_PROXY` & co.
//! - `Unrestricted`: outbound TCP to any address and name lookup. Still no UDP and no listening
//!   socket: "unrestricted" is outbound TCP, as the spec defines it.
//! - In every mode, `127.0.0.1` on the ports of `AgentSpec::connect_ports`: the host's credential
//!   proxies (OAuth handles), which add a token only for their own API.
//!
//! TCP and UDP sockets can be *created* in every mode, so that every attempt to use one reaches the
//! check, and every refusal is logged host-side as `sandbox_denied` (`via:
//! wasi-socket-addr-check`), capped per invocation so a guest looping on `connect` cannot flood the
//! log. A refused name lookup is logged the same way (`via: wasi-ip-name-lookup`) by a thin layer
//! over wasmtime-wasi's own lookup. The guest's handle table is capped, which bounds the host
//! sockets (file descriptors) one instance can hold.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use metash_protocol::LogKind;

use serde_json::{json, Value};
use wasmtime::component::{HasData, Resource};
use wasmtime_wasi::p2::bindings::sockets::ip_name_lookup::{
    self, HostResolveAddressStream, ResolveAddressStream,
};
use wasmtime_wasi::p2::bindings::sockets::network::{self, ErrorCode, IpAddress, Network};
use wasmtime_wasi::p2::{DynPollable, SocketError};
use wasmtime_wasi::sockets::{SocketAddrUse, WasiSocketsCtxView, WasiSocketsView};
use wasmtime_wasi::WasiCtxBuilder;

use super::cache::Kind;
use crate::error::{io_err, Result};
use crate::native::{ConnectProxy, ProxyCfg};
use crate::reply::Replier;
use crate::sink::EventSink;
use crate::spec::{AgentSpec, NetworkAccess};

/// Denials logged per invocation; past it they are counted and summed up once at the end.
const MAX_LOGGED: u64 = 32;
/// Handles (streams, sockets, pollables, descriptors) one component instance may hold. Far more
/// than an agent needs; it bounds the host file descriptors a guest creating sockets in a loop
/// can pin.
pub const MAX_HANDLES: usize = 4096;
/// The proxy variables, named as the native sandbox names them.
const PROXY_VARS: [&str; 5] = [
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
];

/// What the socket address check lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Nothing.
    Deny,
    /// TCP connections to 127.0.0.1 on this port (the agent's proxy) only.
    Proxy(u16),
    /// Outbound TCP anywhere.
    Outbound,
}

impl Policy {
    /// Whether `addr` may be used for `usage`; the reason when not.
    pub fn check(self, addr: SocketAddr, usage: SocketAddrUse) -> Result<(), &'static str> {
        match usage {
            // wasmtime-wasi checks the wildcard address before any connect (the OS binds
            // implicitly). Passing it in every mode, `Deny` included, lets the connect itself be
            // checked, and refused and logged with its real target. An explicit bind to a
            // wildcard ephemeral port is inert: listening is refused.
            SocketAddrUse::TcpBind if addr.ip().is_unspecified() && addr.port() == 0 => Ok(()),
            SocketAddrUse::TcpConnect => match self {
                Self::Deny => Err("network not granted"),
                Self::Proxy(port) => {
                    if addr == SocketAddr::from((Ipv4Addr::LOCALHOST, port)) {
                        Ok(())
                    } else {
                        Err("direct connections are refused; connect through the proxy in $HTTPS_PROXY")
                    }
                }
                Self::Outbound => Ok(()),
            },
            SocketAddrUse::TcpBind | SocketAddrUse::TcpListen | SocketAddrUse::TcpAccept => {
                Err("listening sockets are not allowed")
            }
            SocketAddrUse::UdpBind | SocketAddrUse::UdpSend | SocketAddrUse::UdpReceive => {
                Err("UDP is not allowed")
            }
        }
    }

    fn lookup_allowed(self) -> bool {
        self == Self::Outbound
    }
}

/// The network set up for one WASM agent (for its whole life).
pub struct Net {
    policy: Policy,
    /// The effective mode, for the report.
    mode: NetworkAccess,
    kind: Kind,
    /// Kept alive with the agent; stops accepting when dropped.
    proxy: Option<ConnectProxy>,
    /// Loopback ports it may also connect to (the host's credential proxies: OAuth handles).
    extra: Vec<u16>,
}

impl Net {
    /// Decide the agent's network and start its proxy when it has an allowlist. A core module has
    /// no sockets whatever was granted, so it gets no proxy.
    ///
    /// # Errors
    /// The proxy's listener could not be bound.
    pub fn prepare(
        spec: &AgentSpec,
        kind: Kind,
        sink: &Arc<dyn EventSink>,
        replier: &Replier,
    ) -> Result<Self> {
        let mode = spec.effective_network();
        let mut proxy = None;
        let policy = match (&mode, kind) {
            (_, Kind::Module) | (NetworkAccess::None, _) => Policy::Deny,
            (NetworkAccess::Allowlist(list), Kind::Component) => {
                let p = ConnectProxy::start(ProxyCfg {
                    agent: spec.id.clone(),
                    allowlist: list.clone(),
                    sink: Arc::clone(sink),
                    gate: spec.gate.clone(),
                    replier: replier.clone(),
                })
                .map_err(io_err("starting the allowlist proxy"))?;
                let policy = Policy::Proxy(p.port());
                proxy = Some(p);
                policy
            }
            (NetworkAccess::Unrestricted, Kind::Component) => Policy::Outbound,
        };
        let extra = match kind {
            Kind::Component => spec.connect_ports.clone(),
            Kind::Module => Vec::new(),
        };
        Ok(Self {
            policy,
            mode,
            kind,
            proxy,
            extra,
        })
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The proxy's port, when there is one.
    pub fn proxy_port(&self) -> Option<u16> {
        self.proxy.as_ref().map(ConnectProxy::port)
    }

    /// What was applied, for `agent_started`.
    pub fn report(&self) -> Value {
        match self.kind {
            Kind::Module => json!({
                "mode": "none",
                "granted": self.mode,
                "via": "wasi-p1",
                "note": "a WASI preview-1 module has no outbound sockets; build the agent as a \
                         preview-2 component (wasm32-wasip2) for network",
            }),
            Kind::Component => json!({
                "mode": match self.policy {
                    Policy::Deny => "none",
                    Policy::Proxy(_) => "allowlist",
                    Policy::Outbound => "unrestricted",
                },
                "granted": self.mode,
                "via": "wasi-p2 socket_addr_check",
                "proxy_port": self.proxy_port(),
                "proxy_env": self.env().into_iter().map(|(k, _)| k).collect::<Vec<_>>(),
                "tcp_connect": match self.policy {
                    Policy::Deny => "refused".to_string(),
                    Policy::Proxy(p) => format!("127.0.0.1:{p} only (the allowlist proxy)"),
                    Policy::Outbound => "any".to_string(),
                },
                "credential_ports": self.extra,
                "name_lookup": self.policy.lookup_allowed(),
                "udp": false,
                "listen": false,
            }),
        }
    }

    /// The environment variables naming the proxy (empty without one).
    pub fn env(&self) -> Vec<(String, String)> {
        match self.proxy_port() {
            Some(port) => {
                let url = format!("http://127.0.0.1:{port}");
                PROXY_VARS
                    .iter()
                    .map(|k| (k.to_string(), url.clone()))
                    .collect()
            }
            None => Vec::new(),
        }
    }

    /// Configure a component's sockets: creation allowed (so attempts reach the check), every
    /// address through [`Policy::check`], refusals into `log`.
    pub fn apply(&self, b: &mut WasiCtxBuilder, log: &Arc<NetLog>) {
        let policy = self.policy;
        let log = Arc::clone(log);
        let extra = self.extra.clone();
        b.allow_tcp(true)
            .allow_udp(true)
            .allow_ip_name_lookup(policy.lookup_allowed())
            .socket_addr_check(move |addr, usage| {
                // The host's credential proxies (OAuth handles), whatever the network grant.
                let to_credential_proxy = matches!(usage, SocketAddrUse::TcpConnect)
                    && addr.ip() == IpAddr::V4(Ipv4Addr::LOCALHOST)
                    && extra.contains(&addr.port());
                let verdict = if to_credential_proxy {
                    Ok(())
                } else {
                    policy.check(addr, usage)
                };
                if let Err(reason) = verdict {
                    log.denied(json!({"what": "network", "reason": reason,
                                      "addr": addr.to_string(), "use": use_name(usage),
                                      "via": "wasi-socket-addr-check"}));
                }
                Box::pin(std::future::ready(verdict.is_ok()))
            });
    }
}

fn use_name(usage: SocketAddrUse) -> &'static str {
    match usage {
        SocketAddrUse::TcpBind => "tcp_bind",
        SocketAddrUse::TcpListen => "tcp_listen",
        SocketAddrUse::TcpAccept => "tcp_accept",
        SocketAddrUse::TcpConnect => "tcp_connect",
        SocketAddrUse::UdpBind => "udp_bind",
        SocketAddrUse::UdpSend => "udp_send",
        SocketAddrUse::UdpReceive => "udp_receive",
    }
}

/// Network denials of one invocation, recorded as `sandbox_denied` (the first [`MAX_LOGGED`];
/// the rest counted and reported once by [`NetLog::finish`]).
pub struct NetLog {
    agent: String,
    sink: Arc<dyn EventSink>,
    policy: Policy,
    count: AtomicU64,
}

impl NetLog {
    pub fn new(agent: &str, sink: &Arc<dyn EventSink>, policy: Policy) -> Arc<Self> {
        Arc::new(Self {
            agent: agent.to_string(),
            sink: Arc::clone(sink),
            policy,
            count: AtomicU64::new(0),
        })
    }

    fn denied(&self, data: Value) {
        if self.count.fetch_add(1, Ordering::Relaxed) < MAX_LOGGED {
            self.sink
                .record(LogKind::SandboxDenied, Some(&self.agent), data);
        }
    }

    /// Report the denials that were not logged one by one.
    pub fn finish(&self) {
        let n = self.count.load(Ordering::Relaxed);
        if n > MAX_LOGGED {
            self.sink.record(
                LogKind::SandboxDenied,
                Some(&self.agent),
                json!({"what": "network", "reason": "further network denials not logged one by one",
                       "suppressed": n - MAX_LOGGED, "total": n}),
            );
        }
    }
}

/// `wasi:sockets/ip-name-lookup` as wasmtime-wasi implements it, plus a log line when the lookup
/// is refused (wasmtime-wasi refuses it before any hook the embedder has).
pub struct Lookup<'a> {
    pub sockets: WasiSocketsCtxView<'a>,
    pub log: Option<&'a NetLog>,
}

/// The `HasData` marker for [`Lookup`].
pub struct LoggedLookup;

impl HasData for LoggedLookup {
    type Data<'a> = Lookup<'a>;
}

/// The view the linker's getter builds from a store's parts.
pub fn lookup_view<'a, V: WasiSocketsView>(
    wasi: &'a mut V,
    log: Option<&'a Arc<NetLog>>,
) -> Lookup<'a> {
    Lookup {
        sockets: wasi.sockets(),
        log: log.map(Arc::as_ref),
    }
}

impl ip_name_lookup::Host for Lookup<'_> {
    fn resolve_addresses(
        &mut self,
        network: Resource<Network>,
        name: String,
    ) -> Result<Resource<ResolveAddressStream>, SocketError> {
        if let Some(log) = self.log {
            // A literal address is not a lookup; wasmtime-wasi answers it even with lookups off.
            if !log.policy.lookup_allowed() && name.parse::<IpAddr>().is_err() {
                log.denied(
                    json!({"what": "network", "reason": "name lookup not allowed",
                                  "name": name, "via": "wasi-ip-name-lookup"}),
                );
            }
        }
        self.sockets.resolve_addresses(network, name)
    }
}

// The lookup interface uses the network interface's types, so its host trait requires this one:
// plain delegation.
impl network::Host for Lookup<'_> {
    fn convert_error_code(&mut self, error: SocketError) -> wasmtime::Result<ErrorCode> {
        self.sockets.convert_error_code(error)
    }

    fn network_error_code(
        &mut self,
        err: Resource<wasmtime::Error>,
    ) -> wasmtime::Result<Option<ErrorCode>> {
        self.sockets.network_error_code(err)
    }
}

impl network::HostNetwork for Lookup<'_> {
    fn drop(&mut self, this: Resource<Network>) -> wasmtime::Result<()> {
        network::HostNetwork::drop(&mut self.sockets, this)
    }
}

impl HostResolveAddressStream for Lookup<'_> {
    fn resolve_next_address(
        &mut self,
        stream: Resource<ResolveAddressStream>,
    ) -> Result<Option<IpAddress>, SocketError> {
        self.sockets.resolve_next_address(stream)
    }

    fn subscribe(
        &mut self,
        stream: Resource<ResolveAddressStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        self.sockets.subscribe(stream)
    }

    fn drop(&mut self, stream: Resource<ResolveAddressStream>) -> wasmtime::Result<()> {
        HostResolveAddressStream::drop(&mut self.sockets, stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::MemorySink;

    #[test]
    fn denials_are_capped_per_invocation() {
        let sink = Arc::new(MemorySink::new());
        let dyn_sink: Arc<dyn EventSink> = Arc::clone(&sink) as Arc<dyn EventSink>;
        let log = NetLog::new("a", &dyn_sink, Policy::Deny);
        for _ in 0..MAX_LOGGED + 10 {
            log.denied(json!({"what": "network"}));
        }
        log.finish();
        let denied = sink.of_kind(LogKind::SandboxDenied);
        assert_eq!(denied.len() as u64, MAX_LOGGED + 1);
        assert_eq!(denied[MAX_LOGGED as usize].data["suppressed"], 10);
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    #[test]
    fn policy_decisions() {
        let implicit = addr("0.0.0.0:0");
        let proxy = addr("127.0.0.1:4000");
        let other = addr("127.0.0.1:4001");
        for p in [Policy::Deny, Policy::Proxy(4000), Policy::Outbound] {
            assert!(p.check(implicit, SocketAddrUse::TcpBind).is_ok(), "{p:?}");
            assert!(
                p.check(addr("[::]:0"), SocketAddrUse::TcpBind).is_ok(),
                "{p:?}"
            );
            assert!(p
                .check(addr("0.0.0.0:8080"), SocketAddrUse::TcpBind)
                .is_err());
            assert!(p.check(implicit, SocketAddrUse::TcpListen).is_err());
            assert!(p.check(implicit, SocketAddrUse::UdpBind).is_err());
            assert!(p.check(other, SocketAddrUse::UdpSend).is_err());
        }
        assert!(Policy::Deny
            .check(proxy, SocketAddrUse::TcpConnect)
            .is_err());
        assert!(Policy::Proxy(4000)
            .check(proxy, SocketAddrUse::TcpConnect)
            .is_ok());
        assert!(Policy::Proxy(4000)
            .check(other, SocketAddrUse::TcpConnect)
            .is_err());
        assert!(Policy::Proxy(4000)
            .check(addr("[::1]:4000"), SocketAddrUse::TcpConnect)
            .is_err());
        assert!(Policy::Outbound
            .check(other, SocketAddrUse::TcpConnect)
            .is_ok());
        assert!(!Policy::Proxy(4000).lookup_allowed() && Policy::Outbound.lookup_allowed());
    }
}
