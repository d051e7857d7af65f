//! Seed 002 section 3's lifecycle as a checked state machine: the only place that decides which
//! transition is legal, so both sandboxes enforce the same rules.

use std::fmt;

use serde::Serialize;

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

/// What the host asks of an agent; each is legal only from some states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Start,
    Invoke,
    Suspend,
    Resume,
    Shutdown,
}

impl LifecycleState {
    /// The state `action` leads to from `self`, or `None` when the seed's lifecycle forbids it.
    /// `invoke` keeps an active agent active; termination is allowed from every live state (a
    /// forced stop must always be possible).
    pub fn after(self, action: Action) -> Option<LifecycleState> {
        use Action::*;
        use LifecycleState::*;
        match (self, action) {
            (Registered, Start) => Some(Initialized),
            (Initialized | Active, Invoke) => Some(Active),
            (Active, Suspend) => Some(Suspended),
            (Suspended, Resume) => Some(Active),
            (Registered | Initialized | Active | Suspended, Shutdown) => Some(Terminated),
            _ => None,
        }
    }

    /// The next state for `action` on `agent`.
    ///
    /// # Errors
    /// [`IllegalTransition`] when the lifecycle does not allow it.
    pub fn check(self, agent: &str, action: Action) -> Result<LifecycleState, IllegalTransition> {
        self.after(action).ok_or_else(|| IllegalTransition {
            agent: agent.to_string(),
            from: self,
            action: format!("{action:?}").to_lowercase(),
        })
    }
}

/// An action the lifecycle does not allow in the agent's state (the state machine's own error, so
/// it depends on nothing; the runtime's error wraps it).
#[derive(Debug, thiserror::Error)]
#[error("illegal lifecycle transition for agent {agent}: cannot {action} while {from}")]
pub struct IllegalTransition {
    pub agent: String,
    pub from: LifecycleState,
    pub action: String,
}

#[cfg(test)]
mod tests {
    use super::Action::*;
    use super::LifecycleState::*;

    #[test]
    fn legal_and_illegal() {
        assert_eq!(Registered.after(Start), Some(Initialized));
        assert_eq!(Registered.after(Invoke), None);
        assert_eq!(Initialized.after(Suspend), None);
        assert_eq!(Initialized.after(Resume), None);
        assert_eq!(Suspended.after(Invoke), None);
        assert_eq!(Suspended.after(Resume), Some(Active));
        assert_eq!(Suspended.after(Suspend), None);
        assert_eq!(Active.after(Resume), None);
        assert_eq!(Terminated.after(Invoke), None);
        assert_eq!(Terminated.after(Shutdown), None);
        assert_eq!(Active.after(Shutdown), Some(Terminated));
    }
}
