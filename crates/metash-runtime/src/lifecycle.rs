//! Seed 002 section 3's lifecycle as a checked state machine: the only place that decides which
//! transition is legal, so both sandboxes enforce the same rules.

use std::fmt;

use serde::Serialize;

use crate::error::{Result, RuntimeError};

/// The five lifecycle states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LifecycleState {
    Registered,
    Initialized,
    Active,
    Suspended,
    Terminated,
}

impl fmt::Display for LifecycleState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::Registered => "registered",
            Self::Initialized => "initialized",
            Self::Active => "active",
            Self::Suspended => "suspended",
            Self::Terminated => "terminated",
        };
        f.write_str(s)
    }
}

impl LifecycleState {
    /// Whether `self -> to` is allowed. `Active -> Active` is a new invocation; termination is
    /// allowed from every live state (a forced stop must always be possible).
    pub fn can_go(self, to: LifecycleState) -> bool {
        use LifecycleState::*;
        matches!(
            (self, to),
            (Registered, Initialized)
                | (Initialized, Active)
                | (Active, Active)
                | (Active, Suspended)
                | (Suspended, Active)
                | (Registered | Initialized | Active | Suspended, Terminated)
        )
    }

    /// Check a transition for `agent`.
    ///
    /// # Errors
    /// [`RuntimeError::IllegalTransition`] when the seed's lifecycle does not allow it.
    pub fn check(self, agent: &str, to: LifecycleState) -> Result<()> {
        if self.can_go(to) {
            Ok(())
        } else {
            Err(RuntimeError::IllegalTransition {
                agent: agent.to_string(),
                from: self,
                to,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LifecycleState::*;

    #[test]
    fn legal_and_illegal() {
        assert!(Registered.can_go(Initialized));
        assert!(!Registered.can_go(Active));
        assert!(!Initialized.can_go(Suspended));
        assert!(Suspended.can_go(Active));
        assert!(!Suspended.can_go(Suspended));
        assert!(!Terminated.can_go(Active));
        assert!(!Terminated.can_go(Terminated));
        assert!(Active.can_go(Terminated));
    }
}
