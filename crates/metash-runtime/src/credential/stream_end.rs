//! How a forwarded response ended: shared by the usage tap and the recording, so neither
//! imports the other for it.

/// How a forwarded response stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The upstream finished the body.
    Complete,
    /// The upstream connection failed mid-body (the agent sees a truncated response).
    UpstreamError,
    /// The agent closed its connection (or the proxy stopped) before the body ended.
    ClientGone,
    /// The route's credential was withdrawn (a grant revoked) mid-body: the proxy cut it.
    Withdrawn,
}
