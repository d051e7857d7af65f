//! The vault: one file of sealed entries (`<config dir>/metash/vault.json`, in a directory only
//! its owner can enter). Each entry is a JSON value sealed with XChaCha20-Poly1305 under the
//! vault's key, a fresh random nonce per write, and the entry's name as associated data (an
//! entry moved to another name does not open). The file holds no secret byte in clear: the key
//! is in the OS keychain or derived from a passphrase ([`crate::key`]).
//!
//! Every change is a read-modify-write under the vault's lock file, written atomically (a crash
//! leaves the old file or the new one); a file that does not parse is reported with its line and
//! never overwritten.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::Value;
use zeroize::Zeroizing;

use crate::error::{AuthError, Result};
use crate::key::{Key, KeyRecord, KeySource};
use crate::keychain::KeychainChoice;
use crate::secret::Secret;

/// The file format this build writes and reads.
const VERSION: u32 = 1;
/// What the check entry holds: opening it proves the key.
const CHECK: &[u8] = b"metash vault";
/// How long a change waits for another process's.
const LOCK_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Sealed {
    nonce: String,
    data: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct VaultFile {
    version: u32,
    key: KeyRecord,
    check: Sealed,
    #[serde(default)]
    entries: BTreeMap<String, Sealed>,
}

/// How to get the key: a passphrase if the user gave one, and whether the OS keychain may be
/// used for a new vault.
#[derive(Debug, Clone, Default)]
pub struct KeyOptions {
    pub passphrase: Option<Secret>,
    pub keychain: KeychainChoice,
}

impl KeyOptions {
    /// From the environment: `METASH_VAULT_PASSPHRASE`, and `METASH_VAULT_KEYCHAIN` (`0` to never
    /// use a keychain, or the name of the one to use; see [`KeychainChoice::parse`]).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Self {
        Self {
            passphrase: var("METASH_VAULT_PASSPHRASE")
                .filter(|p| !p.is_empty())
                .map(Secret::new),
            keychain: KeychainChoice::parse(var("METASH_VAULT_KEYCHAIN").as_deref()),
        }
    }
}

/// The last key a vault's record unlocked, so a long-lived broker unlocks it once: a passphrase
/// costs Argon2id (64 MiB, ~0.1 s) and a keychain a round trip, at every token asked for
/// otherwise. Keyed by the record, so a vault made again under a new key is unlocked afresh.
#[derive(Default)]
pub struct KeyCache(std::sync::Mutex<Option<(KeyRecord, Key)>>);

impl KeyCache {
    fn get(&self, record: &KeyRecord) -> Option<Key> {
        let held = self.0.lock().ok()?;
        held.as_ref()
            .filter(|(r, _)| r == record)
            .map(|(_, k)| k.clone())
    }

    fn keep(&self, record: &KeyRecord, key: &Key) {
        if let Ok(mut held) = self.0.lock() {
            *held = Some((record.clone(), key.clone()));
        }
    }
}

pub struct Vault {
    path: PathBuf,
    key: Key,
    file: VaultFile,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD_NO_PAD
}

fn seal(key: &Key, aad: &str, plain: &[u8]) -> Result<Sealed> {
    let mut nonce = [0u8; 24];
    getrandom::getrandom(&mut nonce)
        .map_err(|e| AuthError::NoKey(format!("the system's random source failed: {e}")))?;
    let cipher = XChaCha20Poly1305::new(key.0.as_ref().into());
    let data = cipher
        .encrypt(
            XNonce::from_slice(&nonce),
            Payload {
                msg: plain,
                aad: aad.as_bytes(),
            },
        )
        .map_err(|_| AuthError::Config("sealing a vault entry failed".into()))?;
    Ok(Sealed {
        nonce: base64::Engine::encode(&b64(), nonce),
        data: base64::Engine::encode(&b64(), data),
    })
}

fn open_sealed(
    key: &Key,
    aad: &str,
    s: &Sealed,
) -> std::result::Result<Zeroizing<Vec<u8>>, String> {
    let nonce = base64::Engine::decode(&b64(), &s.nonce).map_err(|e| e.to_string())?;
    let data = base64::Engine::decode(&b64(), &s.data).map_err(|e| e.to_string())?;
    if nonce.len() != 24 {
        return Err("a nonce is not 24 bytes".into());
    }
    let cipher = XChaCha20Poly1305::new(key.0.as_ref().into());
    cipher
        .decrypt(
            XNonce::from_slice(&nonce),
            Payload {
                msg: &data,
                aad: aad.as_bytes(),
            },
        )
        .map(Zeroizing::new)
        .map_err(|_| "it does not open with this key".to_string())
}

fn read_file(path: &Path) -> Result<Option<VaultFile>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(AuthError::io(path.display().to_string(), e)),
    };
    let file: VaultFile = serde_json::from_str(&text).map_err(|e| AuthError::Damaged {
        path: path.to_path_buf(),
        why: format!("line {}, column {}: {e}", e.line(), e.column()),
    })?;
    if file.version != VERSION {
        return Err(AuthError::Damaged {
            path: path.to_path_buf(),
            why: format!("version {} (this build reads {VERSION})", file.version),
        });
    }
    Ok(Some(file))
}

impl Vault {
    /// `<config home>/metash/vault.json`.
    pub fn default_path(config_home: &Path) -> PathBuf {
        config_home.join("metash").join("vault.json")
    }

    /// Opens the vault at `path`, making it (with a key from the keychain, or the passphrase)
    /// when there is none.
    ///
    /// # Errors
    /// No key can be had ([`AuthError::NoKey`]), the key does not open it, the file is damaged.
    pub fn open(path: &Path, keys: &KeyOptions) -> Result<Self> {
        Self::open_with(path, keys, &KeyCache::default())
    }

    /// [`Vault::open`], taking the key from `cache` when the file's key record is the one it
    /// holds, and keeping a key it had to unlock there.
    ///
    /// # Errors
    /// As [`Vault::open`].
    pub fn open_with(path: &Path, keys: &KeyOptions, cache: &KeyCache) -> Result<Self> {
        let _lock = lock(path)?;
        if let Some(file) = read_file(path)? {
            let cached = cache.get(&file.key);
            let fresh = cached.is_none();
            let key = match cached {
                Some(key) => key,
                None => file.key.unlock(keys.passphrase.as_ref())?,
            };
            open_sealed(&key, "check", &file.check).map_err(|why| AuthError::WrongKey {
                path: path.to_path_buf(),
                why: match &file.key {
                    KeyRecord::Passphrase { .. } => "the passphrase is not this vault's".into(),
                    KeyRecord::Keychain { .. } => why,
                },
            })?;
            if fresh {
                cache.keep(&file.key, &key);
            }
            return Ok(Self {
                path: path.to_path_buf(),
                key,
                file,
            });
        }
        let source =
            match (&keys.passphrase, keys.keychain) {
                (Some(p), _) => KeySource::Passphrase(p.clone()),
                (None, KeychainChoice::Off) => return Err(AuthError::NoKey(
                    "no key for a new vault: the keychain is turned off (METASH_VAULT_KEYCHAIN is \
                     `0`, `off`, or not a keychain's name) and no passphrase was given \
                     (METASH_VAULT_PASSPHRASE)"
                        .into(),
                )),
                (None, choice) => KeySource::Keychain(choice),
            };
        let (record, key) = KeyRecord::create(&source)?;
        let check = seal(&key, "check", CHECK)?;
        let vault = Self {
            path: path.to_path_buf(),
            key,
            file: VaultFile {
                version: VERSION,
                key: record,
                check,
                entries: BTreeMap::new(),
            },
        };
        vault.write()?;
        Ok(vault)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The names of the entries.
    pub fn names(&self) -> Vec<String> {
        self.file.entries.keys().cloned().collect()
    }

    /// Entry `name`, opened and parsed.
    ///
    /// # Errors
    /// It does not open with the key, or does not parse as `T`.
    pub fn get<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>> {
        let Some(s) = self.file.entries.get(name) else {
            return Ok(None);
        };
        let plain = open_sealed(&self.key, name, s).map_err(|why| AuthError::Damaged {
            path: self.path.clone(),
            why: format!("entry `{name}`: {why}"),
        })?;
        serde_json::from_slice(&plain)
            .map(Some)
            .map_err(|e| AuthError::Damaged {
                path: self.path.clone(),
                why: format!("entry `{name}`: {e}"),
            })
    }

    /// Runs `f` on the vault as it is on disk now, under its lock, and writes what `f` left.
    ///
    /// # Errors
    /// The lock, the file, or `f`.
    pub fn update<R>(&mut self, f: impl FnOnce(&mut Entries<'_>) -> Result<R>) -> Result<R> {
        let _lock = lock(&self.path)?;
        self.reload()?;
        let r = f(&mut Entries { vault: self })?;
        self.write()?;
        Ok(r)
    }

    /// Holds the vault's lock (for a step that must not interleave with another process's,
    /// such as spending a refresh token) and reads the file again.
    ///
    /// # Errors
    /// The lock or the file.
    pub fn locked(&mut self) -> Result<Locked<'_>> {
        let guard = lock(&self.path)?;
        self.reload()?;
        Ok(Locked {
            vault: self,
            _guard: guard,
        })
    }

    fn reload(&mut self) -> Result<()> {
        if let Some(file) = read_file(&self.path)? {
            if file.key != self.file.key {
                return Err(AuthError::WrongKey {
                    path: self.path.clone(),
                    why: "the vault was made again with another key since it was opened".into(),
                });
            }
            self.file = file;
        }
        Ok(())
    }

    fn write(&self) -> Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        make_private_dir(dir)?;
        let text = serde_json::to_vec_pretty(&self.file)
            .map_err(|e| AuthError::Config(format!("writing the vault: {e}")))?;
        metash_store::atomic::write_atomic(&self.path, &text)?;
        Ok(())
    }

    fn put_value(&mut self, name: &str, value: &Value) -> Result<()> {
        let plain = Zeroizing::new(
            serde_json::to_vec(value).map_err(|e| AuthError::Config(format!("an entry: {e}")))?,
        );
        let sealed = seal(&self.key, name, &plain)?;
        self.file.entries.insert(name.to_string(), sealed);
        Ok(())
    }
}

/// The entries, for [`Vault::update`].
pub struct Entries<'a> {
    vault: &'a mut Vault,
}

impl Entries<'_> {
    pub fn get<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>> {
        self.vault.get(name)
    }

    pub fn put<T: Serialize>(&mut self, name: &str, value: &T) -> Result<()> {
        let v =
            serde_json::to_value(value).map_err(|e| AuthError::Config(format!("an entry: {e}")))?;
        self.vault.put_value(name, &v)
    }

    pub fn remove(&mut self, name: &str) -> bool {
        self.vault.file.entries.remove(name).is_some()
    }
}

/// The vault under its lock ([`Vault::locked`]): read, change, save, all before another
/// process can.
pub struct Locked<'a> {
    vault: &'a mut Vault,
    _guard: metash_store::lock::LockGuard,
}

impl Locked<'_> {
    pub fn get<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>> {
        self.vault.get(name)
    }

    /// Writes `value` as entry `name`, at once.
    ///
    /// # Errors
    /// Sealing or writing.
    pub fn put<T: Serialize>(&mut self, name: &str, value: &T) -> Result<()> {
        let v =
            serde_json::to_value(value).map_err(|e| AuthError::Config(format!("an entry: {e}")))?;
        self.vault.put_value(name, &v)?;
        self.vault.write()
    }
}

fn lock(path: &Path) -> Result<metash_store::lock::LockGuard> {
    let dir = path.parent().unwrap_or(Path::new("."));
    make_private_dir(dir)?;
    Ok(metash_store::lock::acquire(
        &path.with_extension("lock"),
        LOCK_WAIT,
    )?)
}

/// The vault's directory, made readable by its owner only.
fn make_private_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| AuthError::io(dir.display().to_string(), e))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| AuthError::io(dir.display().to_string(), e))?;
    }
    Ok(())
}
