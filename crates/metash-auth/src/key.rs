//! The vault's key: 32 random bytes kept in an OS keychain (the Secret Service or the kernel
//! keyring on Linux, the Keychain on macOS, the Credential Manager on Windows, through the
//! `keyring` crate; see [`crate::keychain`]), or derived with Argon2id from a passphrase. Never a silent plaintext fallback: with no keychain and no
//! passphrase there is no vault, and the error says what to do.
//!
//! The vault file records which (and, for a passphrase, the salt and cost), never the key.
//! On Linux the kernel keyring is memory only: it is gone after a reboot, and a vault whose key
//! is gone says so (log in again, or use a passphrase, which survives).

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::error::{AuthError, Result};
use crate::keychain::{Keychain, KeychainChoice};
use crate::secret::Secret;

/// Argon2id's cost for a passphrase (OWASP's suggestion for interactive use).
const KDF_MEMORY_KIB: u32 = 64 * 1024;
const KDF_ITERATIONS: u32 = 3;

/// The key in memory, zeroed on drop (each copy).
pub struct Key(pub(crate) Zeroizing<[u8; 32]>);

impl Clone for Key {
    fn clone(&self) -> Self {
        Self(Zeroizing::new(*self.0))
    }
}

/// Where a new vault's key should come from.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// An OS keychain, as `choice` allows.
    Keychain(KeychainChoice),
    /// Argon2id of this passphrase.
    Passphrase(Secret),
}

/// How the vault file says its key was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum KeyRecord {
    Keychain {
        account: String,
        /// Which keychain holds it; a vault from before this field used the platform's default.
        #[serde(default = "Keychain::legacy")]
        keychain: Keychain,
    },
    Passphrase {
        /// base64
        salt: String,
        m_kib: u32,
        t: u32,
        p: u32,
    },
}

fn random<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b)
        .map_err(|e| AuthError::NoKey(format!("the system's random source failed: {e}")))?;
    Ok(b)
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD_NO_PAD
}

/// Stores `key` in `keychain` and reads it back before trusting it: a keychain that takes a key
/// and cannot give it back (a process with no session keyring) would lose every token.
fn keep(keychain: Keychain, account: &str, key: &Key) -> keyring::Result<()> {
    let entry = keychain.entry(account)?;
    entry.set_secret(key.0.as_ref())?;
    let back = Zeroizing::new(entry.get_secret()?);
    if back.as_slice() != key.0.as_slice() {
        let _ = entry.delete_credential();
        return Err(keyring::Error::NoStorageAccess(
            "it did not give back the key it was given".into(),
        ));
    }
    Ok(())
}

fn derive(passphrase: &Secret, salt: &[u8], m_kib: u32, t: u32, p: u32) -> Result<Key> {
    let params = argon2::Params::new(m_kib, t, p, Some(32))
        .map_err(|e| AuthError::Config(format!("the vault's key parameters: {e}")))?;
    let argon = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let mut out = Zeroizing::new([0u8; 32]);
    argon
        .hash_password_into(passphrase.expose().as_bytes(), salt, out.as_mut())
        .map_err(|e| AuthError::NoKey(format!("deriving the key from the passphrase: {e}")))?;
    Ok(Key(out))
}

impl KeyRecord {
    /// A new key from `source`; for the keychain it is stored there first.
    ///
    /// # Errors
    /// The keychain refused, or the random source failed.
    pub fn create(source: &KeySource) -> Result<(Self, Key)> {
        match source {
            KeySource::Keychain(choice) => {
                let id: [u8; 8] = random()?;
                let account = format!("vault-key-{}", hex(&id));
                let key = Key(Zeroizing::new(random::<32>()?));
                let mut tried = Vec::new();
                for keychain in Keychain::candidates(*choice) {
                    match keep(keychain, &account, &key) {
                        Ok(()) => return Ok((Self::Keychain { account, keychain }, key)),
                        Err(e) => tried.push(format!("{}: {e}", keychain.label())),
                    }
                }
                Err(AuthError::NoKey(format!(
                    "no OS keychain took the vault's key ({}); give a passphrase instead \
                     (METASH_VAULT_PASSPHRASE, or answer the prompt at a terminal)",
                    if tried.is_empty() {
                        "none is allowed here".to_string()
                    } else {
                        tried.join("; ")
                    }
                )))
            }
            KeySource::Passphrase(p) => {
                let salt: [u8; 16] = random()?;
                let key = derive(p, &salt, KDF_MEMORY_KIB, KDF_ITERATIONS, 1)?;
                let record = Self::Passphrase {
                    salt: base64::Engine::encode(&b64(), salt),
                    m_kib: KDF_MEMORY_KIB,
                    t: KDF_ITERATIONS,
                    p: 1,
                };
                Ok((record, key))
            }
        }
    }

    /// The key this record describes.
    ///
    /// # Errors
    /// The keychain entry is gone (after a reboot, for the kernel keyring) or unreachable, or a
    /// passphrase is needed and none was given.
    pub fn unlock(&self, passphrase: Option<&Secret>) -> Result<Key> {
        match self {
            Self::Keychain { account, keychain } => {
                let bytes = keychain
                    .entry(account)
                    .and_then(|entry| entry.get_secret())
                    .map(Zeroizing::new)
                    .map_err(|e| {
                        AuthError::NoKey(format!(
                            "the vault's key is not in {} ({e}); the kernel keyring is emptied \
                             at reboot, and a Secret Service must be running and unlocked: log \
                             in again (`metash auth login`), which makes a new vault",
                            keychain.label()
                        ))
                    })?;
                let arr: [u8; 32] = bytes.as_slice().try_into().map_err(|_| {
                    AuthError::NoKey("the keychain's entry for the vault is not a key".into())
                })?;
                Ok(Key(Zeroizing::new(arr)))
            }
            Self::Passphrase { salt, m_kib, t, p } => {
                let passphrase = passphrase.ok_or_else(|| {
                    AuthError::NoKey(
                        "the vault is sealed with a passphrase: give it (METASH_VAULT_PASSPHRASE, \
                         or answer the prompt at a terminal)"
                            .into(),
                    )
                })?;
                let salt = base64::Engine::decode(&b64(), salt)
                    .map_err(|e| AuthError::Config(format!("the vault's salt: {e}")))?;
                derive(passphrase, &salt, *m_kib, *t, *p)
            }
        }
    }

    /// Forgets the keychain's entry (the vault is being removed).
    pub fn forget(&self) {
        if let Self::Keychain { account, keychain } = self {
            if let Ok(entry) = keychain.entry(account) {
                let _ = entry.delete_credential();
            }
        }
    }
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
