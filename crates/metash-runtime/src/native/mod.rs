//! The native sandbox: an agent executable in its own session and process group, with a cleared
//! environment, no new privileges, no capabilities, Landlock confining the filesystem (and TCP to
//! the allowlist proxy), seccomp denying sockets and group escapes, and cgroup (or rlimit) quotas.
//! Runs only with the user's consent (`AgentSpec::allow_native`).
//!
//! Only Linux has a backend. Elsewhere the same API is there and refuses (fail closed): a native
//! agent or a confined CLI is never run unconfined. [`macos`] sketches the macOS backend as a
//! generated `sandbox-exec` profile; `docs/portability.md` has the plan for Windows.

pub mod confine;
mod confine_spec;
pub mod macos;
pub mod probe;
mod proxy;

#[cfg(target_os = "linux")]
mod cgroup;
#[cfg(target_os = "linux")]
mod confinement;
#[cfg(target_os = "linux")]
pub(crate) mod disk_quota;
#[cfg(target_os = "linux")]
pub mod exec_gate;
#[cfg(target_os = "linux")]
mod fds;
#[cfg(target_os = "linux")]
pub mod isolate;
#[cfg(target_os = "linux")]
pub(crate) mod mask;
#[cfg(target_os = "linux")]
pub mod mountns;
#[cfg(target_os = "linux")]
mod mounts;
#[cfg(target_os = "linux")]
pub mod pidns;
#[cfg(target_os = "linux")]
mod privs;
#[cfg(target_os = "linux")]
mod process;
#[cfg(target_os = "linux")]
pub mod procs;
#[cfg(target_os = "linux")]
mod quota;
#[cfg(target_os = "linux")]
mod raw;
#[cfg(target_os = "linux")]
mod sandbox;
#[cfg(target_os = "linux")]
mod seccomp;
#[cfg(target_os = "linux")]
mod shim;
#[cfg(target_os = "linux")]
mod spawner;
#[cfg(target_os = "linux")]
pub mod tty;
#[cfg(target_os = "linux")]
mod vspawn;

// Also compiled into Linux's unit tests, so the refusal itself is tested where CI runs.
#[cfg(any(not(target_os = "linux"), test))]
mod refused;

pub use proxy::{proxy_env, ConnectProxy, ProxyCfg};

#[cfg(target_os = "linux")]
pub use process::NativeProcess;
#[cfg(target_os = "linux")]
pub use sandbox::Sandbox;
#[cfg(target_os = "linux")]
pub use vspawn::{ChildIo, Spawned};

#[cfg(not(target_os = "linux"))]
pub use refused::{NativeProcess, Sandbox};
