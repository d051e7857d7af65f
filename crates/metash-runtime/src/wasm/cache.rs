//! The on-disk compiled-code cache:
//! `<dir>/<sha256 of the file's bytes>-<kind>-<engine hash>.cwasm`, where kind is `module` (a
//! WASI preview-1 core module) or `component` (a WASI preview-2 component). The engine hash covers
//! the wasmtime version and every codegen setting (fuel metering included: the fuel engine's code
//! differs), so an entry written by another engine configuration is never loaded; a corrupt or
//! stale entry is recompiled.

use std::collections::hash_map::DefaultHasher;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Engine, Module};

use crate::error::{io_err, Result, RuntimeError};

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

/// Load compiled code from `dir`, or compile `bytes` (the file as read: binary or text) and store
/// it there. `hash` is [`module_hash`] of `bytes`.
///
/// # Errors
/// The code does not parse or compile, or the cache directory cannot be written.
pub fn load_or_compile(
    engine: &Engine,
    dir: &Path,
    hash: &str,
    bytes: &[u8],
) -> Result<(Compiled, CacheHit)> {
    let (bin, kind) = binary(bytes)?;
    let path: PathBuf = dir.join(format!(
        "{hash}-{}-{}.cwasm",
        kind.as_str(),
        engine_key(engine)
    ));
    if path.is_file() {
        // SAFETY: the file was written by `serialize` of the same kind of code, by an engine with
        // the same compatibility hash, into a cache directory the runtime owns. Deserialization
        // still validates the header; on failure we fall back to compiling.
        let loaded = match kind {
            Kind::Module => {
                unsafe { Module::deserialize_file(engine, &path) }.map(Compiled::Module)
            }
            Kind::Component => {
                unsafe { Component::deserialize_file(engine, &path) }.map(Compiled::Component)
            }
        };
        if let Ok(c) = loaded {
            return Ok((c, CacheHit::Disk));
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
    let _ = store(dir, hash, &ser, &path);
    Ok((compiled, CacheHit::Compiled))
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
        for (src, kind) in [("(module)", "module"), ("(component)", "component")] {
            let hash = module_hash(src.as_bytes());
            let (_, hit) = load_or_compile(&engine, dir.path(), &hash, src.as_bytes()).unwrap();
            assert_eq!(hit, CacheHit::Compiled);
            assert!(dir
                .path()
                .join(format!("{hash}-{kind}-{}.cwasm", engine_key(&engine)))
                .is_file());
            let (_, hit) = load_or_compile(&engine, dir.path(), &hash, src.as_bytes()).unwrap();
            assert_eq!(hit, CacheHit::Disk);
        }
    }
}
