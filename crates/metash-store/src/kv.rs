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
        self.write(key, Some(value))
    }

    pub fn delete(&self, key: &str) -> Result<u64> {
        self.write(key, None)
    }

    fn write(&self, key: &str, value: Option<Value>) -> Result<u64> {
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
