//! One redaction for everything metash shows or sends (seed 002 §9): `metash log export` and
//! `tail`, JSON-RPC responses and notifications, MCP results, progress lines on the terminal and
//! error messages. It is the ledger export's [`Redactor`] (every known token shape, the project's
//! salt) plus the values of the key variables the project's roles use, so a key with no telltale
//! shape (`METASH_TEST_KEY=plainvalue…`) is caught too. The log itself keeps what happened; what
//! leaves the process is redacted.

use metash_policy::redact::existing_project_redactor;
use metash_policy::Redactor;
use metash_store::Store;

use crate::config::HostConfig;

/// The redactor for the project of `store`, knowing the values (looked up with `env`) of every
/// variable a role of `config` takes its key from, and `extra` values (keys passed to the host).
/// The project's salt is used when it exists, and never created here (showing something must not
/// write to the project); without one, a fresh random salt is used: output is still redacted,
/// only its markers are not comparable with an export's.
pub fn output_redactor(
    store: &Store,
    config: &HostConfig,
    env: &dyn Fn(&str) -> Option<String>,
    extra: impl IntoIterator<Item = String>,
) -> Redactor {
    let base = existing_project_redactor(store)
        .ok()
        .flatten()
        .unwrap_or_else(throwaway);
    let mut known: Vec<String> = config
        .roles
        .values()
        .flat_map(|role| {
            let info = metash_harness::frontend::info(role.frontend);
            let names = [
                role.api_key_env.as_deref(),
                Some(info.key_env),
                info.fixed_key_env,
            ];
            names.into_iter().flatten().map(str::to_string)
        })
        .filter_map(|var| env(&var))
        .collect();
    known.extend(extra);
    base.with_known_secrets(known)
}

/// Every token shape, under a salt that is used once: for output with no project to hold one.
pub fn throwaway() -> Redactor {
    Redactor::new(uuid::Uuid::new_v4().as_bytes())
}
