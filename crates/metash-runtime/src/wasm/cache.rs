//! The on-disk compiled-code cache:
//! `<dir>/<sha256 of the file's bytes>-<kind>-<engine hash>.cwasm`, where kind is `module` (a
//! WASI preview-1 core module) or `component` (a WASI preview-2 component). The engine hash covers
//! the wasmtime version and every codegen setting (fuel metering included: the fuel engine's code
//! differs), so an entry written by another engine configuration is never loaded; a corrupt or
//! stale entry is recompiled.
//!
//! **Entries are authenticated.** Deserializing compiled code is only safe on bytes wasmtime
//! itself produced: a planted `.cwasm` is native code the host would run. The cache directory sits
//! in the project (`.meta/cache/wasm`), so each entry ends with an HMAC-SHA256, under a per-user
//! host key ([`CacheKey`], outside any agent's reach), of the entry's file name and its bytes,
//! then a fixed trailer. An entry whose MAC is missing or wrong (planted, truncated, or a valid
//! entry renamed to stand for another module) is deleted, reported, and the module recompiled
//! from its `.wasm`; its bytes are never deserialized.

use std::collections::hash_map::DefaultHasher;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Engine, Module};

use crate::error::{io_err, Result, RuntimeError};

/// Marks an authenticated entry: `<serialized code><32-byte MAC><TRAILER>`.
const TRAILER: &[u8] = b"metash-cwasm-hmac-sha256-v1";
const MAC_LEN: usize = 32;

/// The host key that authenticates cache entries: 32 random bytes in a per-user file (never in a
/// project, so no agent's grant reaches it). Its `Debug` never shows the bytes.
#[derive(Clone)]
pub struct CacheKey([u8; 32]);

impl std::fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CacheKey(..)")
    }
}

impl CacheKey {
    /// A key for this process only, the same for every call in it (tests, benchmarks, a user
    /// with no home): entries other processes wrote fail the check and are recompiled, which is
    /// safe, only slower.
    ///
    /// # Errors
    /// `/dev/urandom` cannot be read.
    pub fn ephemeral() -> Result<Self> {
        static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
        if let Some(k) = KEY.get() {
            return Ok(Self(*k));
        }
        let k = Self::random()?;
        Ok(Self(*KEY.get_or_init(|| k.0)))
    }

    fn random() -> Result<Self> {
        let mut k = [0u8; 32];
        use std::io::Read;
        fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut k))
            .map_err(io_err("reading /dev/urandom"))?;
        Ok(Self(k))
    }

    /// `$XDG_DATA_HOME/metash/cache.key`, else `$HOME/.local/share/metash/cache.key`.
    pub fn default_path() -> Option<PathBuf> {
        let nonempty = |v: &str| {
            std::env::var_os(v)
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
        };
        nonempty("XDG_DATA_HOME")
            .or_else(|| nonempty("HOME").map(|h| h.join(".local").join("share")))
            .map(|d| d.join("metash").join("cache.key"))
    }

    /// The user's key ([`Self::default_path`], created on first use), or an ephemeral one when
    /// there is no home.
    ///
    /// # Errors
    /// As [`Self::load_or_create`].
    pub fn for_user() -> Result<Self> {
        match Self::default_path() {
            Some(p) => Self::load_or_create(&p),
            None => Self::ephemeral(),
        }
    }

    /// Reads the key at `path`, or creates it (0600, in a 0700 directory). Two processes creating
    /// it at once agree: the file appears whole (hard link of a finished temp file) or not at all,
    /// and the loser reads the winner's.
    ///
    /// # Errors
    /// A file of the wrong size (named), or I/O.
    pub fn load_or_create(path: &Path) -> Result<Self> {
        match fs::read(path) {
            Ok(bytes) => return Self::from_file(path, &bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(format!("reading {}", path.display()))(e)),
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        {
            let mut b = fs::DirBuilder::new();
            b.recursive(true);
            // Elsewhere the user's profile directory is already private to the user.
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
            b.create(dir)
                .map_err(io_err(format!("creating {}", dir.display())))?;
        }
        let key = Self::random()?;
        // Not the store's write_atomic: the key is created once, mode 0600 from the first byte,
        // and the first of several racing processes wins (a hard link fails if the file exists)
        // rather than the last replacing it.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let tmp = dir.join(format!(
            ".cache.key.{}.{}.tmp",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            use std::io::Write;
            let mut o = fs::OpenOptions::new();
            o.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
            let mut f = o.open(&tmp)?;
            f.write_all(&key.0)?;
            f.sync_all()
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(io_err(format!("writing {}", tmp.display()))(e));
        }
        let linked = fs::hard_link(&tmp, path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(key),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let bytes =
                    fs::read(path).map_err(io_err(format!("reading {}", path.display())))?;
                Self::from_file(path, &bytes)
            }
            Err(e) => Err(io_err(format!("creating {}", path.display()))(e)),
        }
    }

    fn from_file(path: &Path, bytes: &[u8]) -> Result<Self> {
        let k: [u8; 32] = bytes.try_into().map_err(|_| {
            RuntimeError::Wasm(format!(
                "{}: a cache key is 32 bytes, this file has {} (delete it and a new one is made)",
                path.display(),
                bytes.len()
            ))
        })?;
        Ok(Self(k))
    }

    fn mac(&self, name: &str) -> Hmac<Sha256> {
        // A key of any length is valid for HMAC; 32 bytes cannot fail.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        m.update(name.as_bytes());
        m.update(&[0]);
        m
    }

    /// `code` with its MAC and trailer appended.
    fn seal(&self, name: &str, code: &[u8]) -> Vec<u8> {
        let mut m = self.mac(name);
        m.update(code);
        let mut out = Vec::with_capacity(code.len() + MAC_LEN + TRAILER.len());
        out.extend_from_slice(code);
        out.extend_from_slice(&m.finalize().into_bytes());
        out.extend_from_slice(TRAILER);
        out
    }

    /// The code of a sealed entry named `name`, or why it is not one (checked in constant time).
    fn open<'a>(&self, name: &str, entry: &'a [u8]) -> std::result::Result<&'a [u8], &'static str> {
        let body = entry
            .strip_suffix(TRAILER)
            .ok_or("no metash MAC trailer (not written by this host, or truncated)")?;
        if body.len() < MAC_LEN {
            return Err("truncated");
        }
        let (code, tag) = body.split_at(body.len() - MAC_LEN);
        let mut m = self.mac(name);
        m.update(code);
        m.verify_slice(tag)
            .map_err(|_| "the MAC does not match (forged, altered, renamed, or another key)")?;
        Ok(code)
    }
}

/// Where compiled code came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheHit {
    /// Already compiled in this process.
    Memory,
    /// Deserialized from the on-disk cache.
    Disk,
    /// Compiled now (and written to the cache).
    Compiled,
}

/// What a `.wasm`/`.wat` file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A core module (run as a WASI preview-1 command).
    Module,
    /// A component (run as a WASI preview-2 `wasi:cli/command`).
    Component,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Module => "module",
            Self::Component => "component",
        }
    }
}

/// Compiled code of either kind.
#[derive(Clone)]
pub enum Compiled {
    Module(Module),
    Component(Component),
}

/// The binary header after the magic: a core module is version 1, layer 0; a component is
/// version `0x0d`, layer 1.
const COMPONENT_HEADER: [u8; 4] = [0x0d, 0x00, 0x01, 0x00];
const MAGIC: &[u8; 4] = b"\0asm";

/// The file's binary form and kind. Text (`.wat`) is parsed here: the text format tells a module
/// from a component only once parsed.
///
/// # Errors
/// Text that does not parse.
pub fn binary(bytes: &[u8]) -> Result<(std::borrow::Cow<'_, [u8]>, Kind)> {
    let bin: std::borrow::Cow<'_, [u8]> = if bytes.starts_with(MAGIC) {
        bytes.into()
    } else {
        wat::parse_bytes(bytes).map_err(|e| RuntimeError::Wasm(format!("parse: {e}")))?
    };
    let kind = if bin.get(4..8) == Some(&COMPONENT_HEADER[..]) {
        Kind::Component
    } else {
        Kind::Module
    };
    Ok((bin, kind))
}

/// A stable key for this engine's compiled code.
pub fn engine_key(engine: &Engine) -> String {
    let mut h = DefaultHasher::new();
    "wasmtime-48".hash(&mut h);
    engine.precompile_compatibility_hash().hash(&mut h);
    format!("{:016x}", h.finish())
}

/// The cache key of `bytes` (sha256, hex).
pub fn module_hash(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Load compiled code from `dir` (only an entry that `key` authenticates), or compile `bytes` (the
/// file as read: binary or text) and store it there, sealed. `hash` is [`module_hash`] of `bytes`.
///
/// # Errors
/// The code does not parse or compile, or the cache directory cannot be written.
pub fn load_or_compile(
    engine: &Engine,
    dir: &Path,
    key: &CacheKey,
    hash: &str,
    bytes: &[u8],
) -> Result<Loaded> {
    let (bin, kind) = binary(bytes)?;
    let name = format!("{hash}-{}-{}.cwasm", kind.as_str(), engine_key(engine));
    let path: PathBuf = dir.join(&name);
    let mut rejected = None;
    if let Ok(entry) = fs::read(&path) {
        match key.open(&name, &entry) {
            Ok(code) => {
                // SAFETY: `code` is authenticated: this host wrote it with `serialize`, for this
                // name (so this kind and engine configuration), under a key no agent can read.
                // Deserialization still validates the header; on failure we compile.
                let loaded = match kind {
                    Kind::Module => {
                        unsafe { Module::deserialize(engine, code) }.map(Compiled::Module)
                    }
                    Kind::Component => {
                        unsafe { Component::deserialize(engine, code) }.map(Compiled::Component)
                    }
                };
                if let Ok(c) = loaded {
                    return Ok(Loaded {
                        compiled: c,
                        hit: CacheHit::Disk,
                        rejected: None,
                    });
                }
            }
            Err(why) => {
                let _ = fs::remove_file(&path);
                rejected = Some(Rejected {
                    file: path.clone(),
                    reason: why,
                });
            }
        }
    }
    let compile = |e: wasmtime::Error| RuntimeError::Wasm(format!("compile: {e:#}"));
    let serialize = |e: wasmtime::Error| RuntimeError::Wasm(format!("serialize: {e:#}"));
    let (compiled, ser) = match kind {
        Kind::Module => {
            let m = Module::from_binary(engine, &bin).map_err(compile)?;
            let ser = m.serialize().map_err(serialize)?;
            (Compiled::Module(m), ser)
        }
        Kind::Component => {
            let c = Component::from_binary(engine, &bin).map_err(compile)?;
            let ser = c.serialize().map_err(serialize)?;
            (Compiled::Component(c), ser)
        }
    };
    // The cache only saves time: code that compiled runs even if it cannot be stored. Parallel
    // first starts of one file each write their own temp file (unique per process *and* call);
    // the renames race harmlessly, every one installing identical bytes.
    let _ = store(dir, &key.seal(&name, &ser), &path);
    Ok(Loaded {
        compiled,
        hit: CacheHit::Compiled,
        rejected,
    })
}

/// What [`load_or_compile`] found.
pub struct Loaded {
    pub compiled: Compiled,
    pub hit: CacheHit,
    /// A cache entry that failed authentication and was deleted (the code was compiled anew).
    pub rejected: Option<Rejected>,
}

/// A cache entry refused before any of it was deserialized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub file: PathBuf,
    pub reason: &'static str,
}

fn store(dir: &Path, ser: &[u8], path: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
    metash_store::atomic::write_atomic(path, ser)
        .map_err(|e| RuntimeError::Wasm(format!("caching {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn kinds_from_header_and_text() {
        assert_eq!(binary(b"(module)").unwrap().1, Kind::Module);
        assert_eq!(binary(b"(component)").unwrap().1, Kind::Component);
        assert_eq!(
            binary(b"\0asm\x01\0\0\0").unwrap().1,
            Kind::Module,
            "core module header"
        );
        assert_eq!(
            binary(b"\0asm\x0d\0\x01\0").unwrap().1,
            Kind::Component,
            "component header"
        );
        assert!(binary(b"(not wat").is_err());
    }

    #[test]
    fn cache_names_distinguish_kind() {
        let engine = Engine::default();
        let dir = tempfile::tempdir().unwrap();
        let key = CacheKey::ephemeral().unwrap();
        for (src, kind) in [("(module)", "module"), ("(component)", "component")] {
            let hash = module_hash(src.as_bytes());
            let hit = load_or_compile(&engine, dir.path(), &key, &hash, src.as_bytes())
                .unwrap()
                .hit;
            assert_eq!(hit, CacheHit::Compiled);
            assert!(dir
                .path()
                .join(format!("{hash}-{kind}-{}.cwasm", engine_key(&engine)))
                .is_file());
            let hit = load_or_compile(&engine, dir.path(), &key, &hash, src.as_bytes())
                .unwrap()
                .hit;
            assert_eq!(hit, CacheHit::Disk);
        }
    }

    #[test]
    fn entries_from_another_key_or_name_are_rejected_and_replaced() {
        let engine = Engine::default();
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = ("(module)", "(module (func))");
        let (ha, hb) = (module_hash(a.as_bytes()), module_hash(b.as_bytes()));
        let key = CacheKey::ephemeral().unwrap();
        load_or_compile(&engine, dir.path(), &key, &ha, a.as_bytes()).unwrap();
        let name = |h: &str| {
            dir.path()
                .join(format!("{h}-module-{}.cwasm", engine_key(&engine)))
        };
        // A valid entry of `a` renamed to stand for `b`.
        fs::copy(name(&ha), name(&hb)).unwrap();
        let l = load_or_compile(&engine, dir.path(), &key, &hb, b.as_bytes()).unwrap();
        assert_eq!(l.hit, CacheHit::Compiled);
        assert!(l.rejected.unwrap().reason.contains("MAC does not match"));
        // Another host's key.
        let other = CacheKey::random().unwrap();
        let l = load_or_compile(&engine, dir.path(), &other, &ha, a.as_bytes()).unwrap();
        assert!(l.rejected.is_some());
        // What `other` sealed now verifies for it, and no longer for `key`.
        let l = load_or_compile(&engine, dir.path(), &other, &ha, a.as_bytes()).unwrap();
        assert_eq!((l.hit, l.rejected), (CacheHit::Disk, None));
    }

    #[test]
    fn the_key_file_is_created_once_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/cache.key");
        let k1 = CacheKey::load_or_create(&path).unwrap();
        let k2 = CacheKey::load_or_create(&path).unwrap();
        assert_eq!(k1.0, k2.0);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(format!("{k1:?}"), "CacheKey(..)");
        fs::write(&path, b"short").unwrap();
        let err = CacheKey::load_or_create(&path).unwrap_err().to_string();
        assert!(
            err.contains("cache.key") && err.contains("32 bytes"),
            "{err}"
        );
    }
}
