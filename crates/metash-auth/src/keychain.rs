//! Which OS keychain holds a vault's key, and how to reach it.
//!
//! On Linux there are two, and the right one depends on the machine: a desktop session has a
//! Secret Service (GNOME Keyring, KWallet, KeePassXC) on its D-Bus session bus, which keeps the
//! key across reboots and unlocks with the user's login; a headless machine has only the
//! kernel keyring, which is memory only. A new vault asks the Secret Service first when a
//! session bus is there and falls back to the kernel keyring when it does not answer. That
//! fallback is still a keychain, never plaintext. The vault file records which one took the
//! key, so it is always looked for in the same place. macOS and Windows have one keychain each.

use serde::{Deserialize, Serialize};

/// The keychain service name metash's entries are under.
const SERVICE: &str = "metash";

/// A keychain a vault's key can live in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Keychain {
    /// The freedesktop Secret Service over the D-Bus session bus (Linux desktops).
    SecretService,
    /// The Linux kernel keyring (keyutils): headless Linux; memory only.
    KernelKeyring,
    /// The macOS Keychain.
    MacosKeychain,
    /// The Windows Credential Manager.
    WindowsCredentialManager,
}

/// Which keychain a new vault may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeychainChoice {
    /// The best this machine has (on Linux: the Secret Service if a session bus answers, else
    /// the kernel keyring).
    #[default]
    Auto,
    /// Only this one; its failure is the error.
    Only(Keychain),
    /// No keychain: a passphrase or nothing.
    Off,
}

impl KeychainChoice {
    /// `METASH_VAULT_KEYCHAIN`: unset or `auto`; `0`/`off`; or a keychain's name
    /// (`secret-service`, `kernel-keyring`, `macos-keychain`, `windows-credential-manager`).
    /// Anything else is `Off`, so a typo never widens where the key goes; the error the vault
    /// then gives names the variable.
    #[must_use]
    pub fn parse(value: Option<&str>) -> Self {
        match value.map(str::trim) {
            None | Some("" | "auto") => Self::Auto,
            Some(v) => Keychain::from_name(v).map_or(Self::Off, Self::Only),
        }
    }
}

impl Keychain {
    fn from_name(name: &str) -> Option<Self> {
        Some(match name.replace('_', "-").as_str() {
            "secret-service" => Self::SecretService,
            "kernel-keyring" => Self::KernelKeyring,
            "macos-keychain" => Self::MacosKeychain,
            "windows-credential-manager" => Self::WindowsCredentialManager,
            _ => return None,
        })
    }

    /// What a user calls it, for messages.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::SecretService => "the Secret Service (D-Bus)",
            Self::KernelKeyring => "the kernel keyring",
            Self::MacosKeychain => "the macOS Keychain",
            Self::WindowsCredentialManager => "the Windows Credential Manager",
        }
    }

    /// The keychain a vault written before the file named one used: the platform's default.
    #[must_use]
    pub fn legacy() -> Self {
        if cfg!(target_os = "macos") {
            Self::MacosKeychain
        } else if cfg!(windows) {
            Self::WindowsCredentialManager
        } else {
            Self::KernelKeyring
        }
    }

    /// The keychains `choice` tries for a new vault, best first.
    pub(crate) fn candidates(choice: KeychainChoice) -> Vec<Self> {
        match choice {
            KeychainChoice::Off => Vec::new(),
            KeychainChoice::Only(k) => vec![k],
            KeychainChoice::Auto if cfg!(target_os = "linux") => {
                if session_bus_known() {
                    vec![Self::SecretService, Self::KernelKeyring]
                } else {
                    vec![Self::KernelKeyring]
                }
            }
            KeychainChoice::Auto => vec![Self::legacy()],
        }
    }

    /// This keychain's entry for `account`.
    pub(crate) fn entry(self, account: &str) -> keyring::Result<keyring::Entry> {
        match self {
            #[cfg(target_os = "linux")]
            Self::SecretService => {
                let c =
                    keyring::secret_service::SsCredential::new_with_target(None, SERVICE, account)?;
                Ok(keyring::Entry::new_with_credential(Box::new(c)))
            }
            #[cfg(target_os = "linux")]
            Self::KernelKeyring => {
                let c =
                    keyring::keyutils::KeyutilsCredential::new_with_target(None, SERVICE, account)?;
                Ok(keyring::Entry::new_with_credential(Box::new(c)))
            }
            #[cfg(target_os = "macos")]
            Self::MacosKeychain => keyring::Entry::new(SERVICE, account),
            #[cfg(windows)]
            Self::WindowsCredentialManager => keyring::Entry::new(SERVICE, account),
            #[allow(unreachable_patterns)]
            other => Err(keyring::Error::NoStorageAccess(
                format!("{} does not exist on this system", other.label()).into(),
            )),
        }
    }
}

/// Whether this process knows of a D-Bus session bus (what a desktop login has): the address
/// in the environment, or the systemd user bus socket.
fn session_bus_known() -> bool {
    if std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_some_and(|a| !a.is_empty()) {
        return true;
    }
    std::env::var_os("XDG_RUNTIME_DIR")
        .is_some_and(|d| std::path::Path::new(&d).join("bus").exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_names_a_keychain_or_turns_it_off() {
        assert_eq!(KeychainChoice::parse(None), KeychainChoice::Auto);
        assert_eq!(KeychainChoice::parse(Some("auto")), KeychainChoice::Auto);
        assert_eq!(KeychainChoice::parse(Some("0")), KeychainChoice::Off);
        assert_eq!(KeychainChoice::parse(Some("off")), KeychainChoice::Off);
        assert_eq!(KeychainChoice::parse(Some("typo")), KeychainChoice::Off);
        assert_eq!(
            KeychainChoice::parse(Some("secret-service")),
            KeychainChoice::Only(Keychain::SecretService)
        );
        assert_eq!(
            KeychainChoice::parse(Some("kernel_keyring")),
            KeychainChoice::Only(Keychain::KernelKeyring)
        );
        assert!(Keychain::candidates(KeychainChoice::Off).is_empty());
    }
}
