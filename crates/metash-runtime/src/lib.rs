//! metash's sandboxed agent runtime (seed 002 sections 3 to 5).
//!
//! An agent is a program that speaks the agent protocol (JSON lines on stdio, `docs/agent-protocol.md`)
//! and runs either under wasmtime ([`wasm`]: a WASI preview-1 module, or a preview-2 component,
//! which may have network through the allowlist proxy) or, with the user's consent,
//! as a native Linux process under Landlock, seccomp and cgroups ([`native`]). Both are driven
//! through the same lifecycle ([`Agent`]), report to the same [`EventSink`], and stream through the
//! same bounded, throttled reader. A CLI executor's model key stays in the host: the agent talks to
//! the [`credential`] proxy, which adds the key on the way out.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use metash_runtime::*;
//! # fn demo(manifest: metash_protocol::Manifest) -> Result<()> {
//! let sink = Arc::new(MemorySink::new());
//! let rt = Runtime::new(
//!     RuntimeConfig { cache_dir: ".meta/cache/wasm".into(), cache_key: CacheKey::for_user()? },
//!     sink,
//! )?;
//! let mut agent = rt.register(AgentSpec::new("a1", manifest, "agent.wasm", "."))?;
//! agent.start()?;
//! let outcome = agent.invoke("hello", &[], &mut |event| println!("{event:?}"))?;
//! agent.shutdown()?;
//! # Ok(()) }
//! ```

mod agent;
pub mod codec;
pub mod credential;
mod error;
mod invocation;
pub mod lifecycle;
pub mod limits;
pub mod native;
mod pump;
pub mod reply;
pub mod sink;
pub mod spec;
pub mod stream;
pub mod wasm;
mod withdraw;

pub use agent::{Agent, Interrupter, Pauser, Runtime, RuntimeConfig, ShutdownKind};
pub use error::{Result, RuntimeError};
pub use invocation::{InvocationStatus, Outcome};
pub use lifecycle::{Action, LifecycleState};
pub use reply::Replier;
pub use sink::{EventSink, MemorySink, NullSink, Recorded};
pub use spec::{ActionGate, AgentSpec, Gate, GateVerdict, GatedAction, NetworkAccess, PathAccess};
pub use stream::{Card, ChunkAssembler, Throttle, TokenBucket};
pub use wasm::cache::CacheKey;
pub use withdraw::{Withdraw, Withdrawer};
