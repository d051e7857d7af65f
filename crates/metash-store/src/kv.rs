//! Per-agent KV namespaces and the shared scratchpad: small JSON maps, each one file, replaced
//! atomically under the store lock with a `kv_set` event in the log for every write.

use std::path::PathBuf;

use metash_protocol::LogKind;

use serde_json::{json, Map, Value};

use crate::error::Result;
use crate::log::NewEvent;
use crate::Store;

/// One namespace. An agent gets only its own (the host hands out `store.kv(agent_name)`), so it can
/// neither read nor write another agent's memory.
#[derive(Debug)]
pub struct Kv<'a> {
    pub(crate) store: &'a Store,
    pub(crate) namespace: String,
    pub(crate) path: PathBuf,
}

impl Kv<'_> {
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn list(&self) -> Result<Map<String, Value>> {
        match self.store.read_json(&self.path)? {
            Value::Object(m) => Ok(m),
            _ => Ok(Map::new()),
        }
    }

    pub fn get(&self, key: &str) -> Result<Option<Value>> {
        Ok(self.list()?.remove(key))
    }

    /// Sets `key`; returns the log seq of the write.
    pub fn set(&self, key: &str, value: Value) -> Result<u64> {
        self.write(key, Some(value), None)
    }

    /// Sets `key` unless the namespace would then exceed `quota` (checked under the store lock,
    /// so two writers cannot both squeeze in); nothing is written when it would.
    ///
    /// # Errors
    /// [`crate::StoreError::Rejected`] naming the limit, or as [`Kv::set`].
    pub fn set_within(&self, key: &str, value: Value, quota: Quota) -> Result<u64> {
        self.write(key, Some(value), Some(quota))
    }

    pub fn delete(&self, key: &str) -> Result<u64> {
        self.write(key, None, None)
    }

    fn write(&self, key: &str, value: Option<Value>, quota: Option<Quota>) -> Result<u64> {
        crate::names::check(key, "key")?;
        let ns = self.namespace.clone();
        let rec = self.store.update_json(&self.path, |doc| {
            if !doc.is_object() {
                *doc = Value::Object(Map::new());
            }
            if let Value::Object(m) = doc {
                match &value {
                    Some(v) => {
                        m.insert(key.to_string(), v.clone());
                    }
                    None => {
                        m.remove(key);
                    }
                }
                if let Some(q) = quota {
                    q.check(&ns, m)?;
                }
            }
            Ok(NewEvent::new(
                LogKind::KvSet,
                Some(&ns),
                json!({"namespace": ns, "key": key, "value": value}),
            ))
        })?;
        Ok(rec.seq)
    }
}

/// How much one KV namespace may hold: keys, and bytes of its JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub max_keys: usize,
    pub max_bytes: usize,
}

impl Quota {
    fn check(&self, ns: &str, m: &Map<String, Value>) -> Result<()> {
        if m.len() > self.max_keys {
            return Err(crate::StoreError::Rejected(format!(
                "KV namespace `{ns}` would hold {} keys; its quota is {}",
                m.len(),
                self.max_keys
            )));
        }
        let bytes = serde_json::to_vec(m).map(|b| b.len()).unwrap_or(usize::MAX);
        if bytes > self.max_bytes {
            return Err(crate::StoreError::Rejected(format!(
                "KV namespace `{ns}` would hold {bytes} bytes; its quota is {}",
                self.max_bytes
            )));
        }
        Ok(())
    }
}
