//! The on-disk compiled-module cache: `<dir>/<sha256 of module bytes>-<engine hash>.cwasm`. The
//! engine hash covers the wasmtime version and every codegen setting, so a cache entry written by
//! another engine configuration is never loaded; a corrupt or stale entry is recompiled.

use std::collections::hash_map::DefaultHasher;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use wasmtime::{Engine, Module};

use crate::error::{io_err, Result, RuntimeError};

/// Where a module came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheHit {
    /// Already compiled in this process.
    Memory,
    /// Deserialized from the on-disk cache.
    Disk,
    /// Compiled now (and written to the cache).
    Compiled,
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

/// Load a compiled module from `dir`, or compile `bytes` and store it there.
///
/// # Errors
/// The module does not compile, or the cache directory cannot be written.
pub fn load_or_compile(
    engine: &Engine,
    dir: &Path,
    hash: &str,
    bytes: &[u8],
) -> Result<(Module, CacheHit)> {
    let path: PathBuf = dir.join(format!("{hash}-{}.cwasm", engine_key(engine)));
    if path.is_file() {
        // SAFETY: the file was written by `Module::serialize` of an engine with the same
        // compatibility hash, into a cache directory the runtime owns. Deserialization still
        // validates the header; on failure we fall back to compiling.
        if let Ok(m) = unsafe { Module::deserialize_file(engine, &path) } {
            return Ok((m, CacheHit::Disk));
        }
    }
    let module =
        Module::new(engine, bytes).map_err(|e| RuntimeError::Wasm(format!("compile: {e:#}")))?;
    let ser = module
        .serialize()
        .map_err(|e| RuntimeError::Wasm(format!("serialize: {e:#}")))?;
    // The cache only saves time: a module that compiled runs even if it cannot be stored. Parallel
    // first starts of one module each write their own temp file (unique per process *and* call);
    // the renames race harmlessly, every one installing identical bytes.
    let _ = store(dir, hash, &ser, &path);
    Ok((module, CacheHit::Compiled))
}

fn store(dir: &Path, hash: &str, ser: &[u8], path: &Path) -> Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
    let tmp = dir.join(format!(
        ".{hash}.{}.{}.tmp",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let written = fs::write(&tmp, ser)
        .map_err(io_err(format!("writing {}", tmp.display())))
        .and_then(|()| {
            fs::rename(&tmp, path).map_err(io_err(format!("renaming to {}", path.display())))
        });
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}
