//! Checking the configured roles before anything is spent: each model-backed role's key (through
//! the credential proxy's preflight) and program. Its own module, above both `host` and
//! `spawn::key_proxy`, so that neither imports the other back.

use crate::config::Role;
use crate::error::{HostError, Result};
use crate::host::Host;

impl Host {
    /// Refuses a model-backed role whose key variable or program is missing, before anything is
    /// spent.
    ///
    /// # Errors
    /// [`HostError::Config`] naming the missing variable or program.
    pub fn preflight_role(&self, name: &str, role: &Role) -> Result<()> {
        crate::spawn::key_proxy::preflight(self, name, role)?;
        // An ACP role runs its own `command` (checked when the sandbox resolves it).
        if let Some(p) = metash_harness::frontend::info(role.frontend)
            .program
            .filter(|_| !role.acp)
        {
            if self.harness()?.programs.get(p).is_none() {
                return Err(HostError::Config(format!(
                    "role `{name}` ({}) needs the `{}` program, which is not installed \
                     (bash scripts/setup installs it into .tools/)",
                    role.frontend.as_str(),
                    p.name()
                )));
            }
        }
        Ok(())
    }

    /// Checks every configured role (for `metash run` to stop before spending anything).
    pub fn preflight(&self) -> Result<()> {
        for (name, role) in &self.config().roles {
            self.preflight_role(name, role)?;
        }
        Ok(())
    }
}
