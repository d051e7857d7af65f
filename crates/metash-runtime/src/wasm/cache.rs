//! The on-disk compiled-module cache: `<dir>/<sha256 of module bytes>-<engine hash>.cwasm`. The
//! engine hash covers the wasmtime version and every codegen setting, so a cache entry written by
//! another engine configuration is never loaded; a corrupt or stale entry is recompiled.

use std::collections::hash_map::DefaultHasher;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

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
    fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
    let tmp = dir.join(format!(".{hash}.{}.tmp", std::process::id()));
    fs::write(&tmp, &ser).map_err(io_err(format!("writing {}", tmp.display())))?;
    fs::rename(&tmp, &path).map_err(io_err(format!("renaming to {}", path.display())))?;
    Ok((module, CacheHit::Compiled))
}
