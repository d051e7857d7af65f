//! Confining a program that does not speak the agent protocol: a coding-agent CLI (Claude Code,
//! Codex, pi) that a model role runs, or any command `metash sandbox` is given. The same
//! restrictions as a native agent (Landlock, seccomp, no capabilities, no new privileges, its own
//! session, cgroup or rlimit quotas, `.meta/` masked, `.git` read-only), prepared in the parent
//! and applied to the caller's `Command` between fork and exec. Its network is TCP to the listed loopback ports only
//! (the credential proxy, an allowlist proxy): no other connect, no listening socket, no
//! Unix-domain socket, no UDP. This module holds what is confined; the Linux backend is in
//! `confinement.rs`, and other systems refuse.

pub use super::confine_spec::{program_dirs, ConfineSpec, Fence, PASS_ENV};
#[cfg(target_os = "linux")]
pub use super::confinement::Confinement;
#[cfg(not(target_os = "linux"))]
pub use super::refused::Confinement;
