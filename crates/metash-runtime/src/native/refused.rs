//! The native backend where metash has none (every system but Linux): the same API as the Linux
//! backend, and every entry point refuses. Nothing can be constructed, so nothing runs: a native
//! agent or a coding CLI is never started unconfined. WASM agents run everywhere.

// On Linux this module is compiled only for its test, which calls the constructors alone.
#![cfg_attr(target_os = "linux", allow(dead_code))]

use std::convert::Infallible;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use metash_protocol::AgentEvent;
use serde_json::Value;

use super::confine_spec::ConfineSpec;
use crate::error::{Result, RuntimeError};
use crate::invocation::Outcome;
use crate::reply::Replier;
use crate::sink::EventSink;
use crate::spec::AgentSpec;

/// Why, in the words the user gets.
fn refused() -> RuntimeError {
    RuntimeError::SandboxSetup(format!(
        "no native sandbox on {}: metash confines native agents and coding CLIs only on Linux \
         (Landlock, seccomp, cgroups), and never runs them unconfined. Run the agent as WASM, or \
         run metash on Linux (docs/portability.md)",
        std::env::consts::OS
    ))
}

/// Never constructed: [`Sandbox::prepare`] refuses.
pub struct Sandbox {
    never: Infallible,
    pub report: Value,
}

impl Sandbox {
    /// # Errors
    /// Always: this system has no native backend.
    pub fn prepare(_: &AgentSpec, _: &Arc<dyn EventSink>, _: &Replier) -> Result<Self> {
        Err(refused())
    }

    pub fn spawn_failure(&self) -> Option<String> {
        match self.never {}
    }
}

/// Never constructed: [`NativeProcess::spawn`] refuses.
pub struct NativeProcess {
    never: Infallible,
    pub report: Value,
}

impl NativeProcess {
    /// # Errors
    /// Always: this system has no native backend.
    pub fn spawn(_: &AgentSpec, _: &Arc<dyn EventSink>, _: Vec<u8>, _: &Replier) -> Result<Self> {
        Err(refused())
    }

    pub fn pid(&self) -> i32 {
        match self.never {}
    }

    pub fn suspend(&self) {
        match self.never {}
    }

    pub fn resume(&self) {
        match self.never {}
    }

    pub fn terminate(&mut self, _: Duration) -> bool {
        match self.never {}
    }

    pub fn stderr_tail(&self) -> String {
        match self.never {}
    }

    pub fn stderr_after_exit(&self, _: Duration) -> String {
        match self.never {}
    }

    /// # Errors
    /// Never returns: there is no such process.
    pub fn invoke(
        &mut self,
        _: &AgentSpec,
        _: &Arc<dyn EventSink>,
        _: AgentEvent,
        _: &Arc<AtomicBool>,
        _: &mut dyn FnMut(&AgentEvent),
    ) -> Result<Outcome> {
        match self.never {}
    }

    pub fn shutdown(&mut self, _: Duration) -> bool {
        match self.never {}
    }

    pub fn limits_hit(&self) -> Vec<&'static str> {
        match self.never {}
    }
}

/// Never constructed: [`Confinement::prepare`] refuses.
pub struct Confinement {
    never: Infallible,
    pub report: Value,
}

impl std::fmt::Debug for Confinement {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.never {}
    }
}

impl Confinement {
    /// # Errors
    /// Always: this system has no native backend.
    pub fn prepare(_: &ConfineSpec, _: &Arc<dyn EventSink>) -> Result<Self> {
        Err(refused())
    }

    pub fn apply(&self, _: &mut Command) {
        match self.never {}
    }

    pub fn limits_hit(&self) -> Vec<&'static str> {
        match self.never {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::NullSink;
    use metash_protocol::{Manifest, SandboxKind};

    fn refusal<T>(r: Result<T>) -> String {
        match r {
            Err(RuntimeError::SandboxSetup(m)) => m,
            Err(e) => panic!("refused with the wrong error: {e}"),
            Ok(_) => panic!("a system without a backend ran something"),
        }
    }

    #[test]
    fn every_entry_point_refuses_and_says_why() {
        let sink: Arc<dyn EventSink> = Arc::new(NullSink);
        let manifest = Manifest::new("a", "x", SandboxKind::Native);
        let mut spec = AgentSpec::new("a", manifest, "/bin/true", "/tmp");
        spec.allow_native = true;
        let replier = Replier::default();
        let confine = ConfineSpec {
            name: "claude".into(),
            program: "/bin/true".into(),
            program_dirs: vec![],
            workspace: "/tmp".into(),
            paths: vec![],
            fence: crate::native::confine_spec::Fence::default(),
            env: vec![],
        };
        for message in [
            refusal(Sandbox::prepare(&spec, &sink, &replier)),
            refusal(NativeProcess::spawn(&spec, &sink, Vec::new(), &replier)),
            refusal(Confinement::prepare(&confine, &sink)),
        ] {
            assert!(message.contains(std::env::consts::OS), "{message}");
            assert!(message.contains("never runs them unconfined"), "{message}");
        }
    }
}
