//! The hook through which a caller confines the CLI processes the harness spawns. The harness
//! cannot import the runtime (layering), so the host implements [`Confiner`] with the runtime's
//! native sandbox and hands it in with the turn request; [`crate::runner`] applies it to the
//! `Command` just before the spawn.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use metash_protocol::ProcessInvocationSpec;

/// Whatever must live as long as the confined child (a cgroup, a ruleset fd, a proxy). Dropped
/// after the child has been reaped.
pub type ConfineGuard = Box<dyn Any + Send>;

/// Confines one process before it is spawned.
pub trait Confiner: Send + Sync {
    /// Rewrites `cmd` for `spec` (environment, `pre_exec` steps) so that the child runs confined.
    /// The confinement must put the child in its own process group with its pid as the group id
    /// (e.g. `setsid`): the runner then does not set one itself and kills the group as usual.
    ///
    /// # Errors
    /// A message saying which restriction could not be prepared; the process is then not run
    /// (fail closed).
    fn confine(
        &self,
        spec: &ProcessInvocationSpec,
        cmd: &mut std::process::Command,
    ) -> Result<ConfineGuard, String>;

    /// The confined child started with `pid` (its process group's id too): a caller that pauses
    /// or watches it learns its pid here.
    fn spawned(&self, _pid: u32) {}
}

/// An optional [`Confiner`] carried by a turn request. Not serialized (a process-local object);
/// every handle compares equal, so requests keep their derived equality.
#[derive(Clone, Default)]
pub struct ConfinerHandle(pub Option<Arc<dyn Confiner>>);

impl ConfinerHandle {
    pub fn new(c: Arc<dyn Confiner>) -> Self {
        Self(Some(c))
    }

    pub fn get(&self) -> Option<&dyn Confiner> {
        self.0.as_deref()
    }
}

impl fmt::Debug for ConfinerHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "ConfinerHandle(Some)"
        } else {
            "ConfinerHandle(None)"
        })
    }
}

impl PartialEq for ConfinerHandle {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
