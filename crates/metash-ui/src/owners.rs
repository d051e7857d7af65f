//! Which agent saved each artifact: an index of the log's `artifact` records that the handlers'
//! shared state ([`crate::app::App`]) holds and the previews ([`crate::artifacts`]) consult. Kept
//! apart from both so that neither has to import the other.

use metash_protocol::LogKind;
use metash_store::Store;

/// Which agent saved each artifact (the log's `artifact` records, the last one winning), kept
/// up to date by reading only what was appended since the last lookup: a preview costs the new
/// records, not the whole log.
#[derive(Debug, Default)]
pub struct Owners {
    offset: u64,
    by_id: std::collections::HashMap<String, String>,
}

impl Owners {
    pub(crate) fn lookup(
        &mut self,
        store: &Store,
        id: &str,
    ) -> metash_store::Result<Option<String>> {
        loop {
            let (recs, next) = match store.log().read_from(self.offset, 4096) {
                Ok(v) => v,
                // The log was cut back (a failed update): index it again.
                Err(_) if self.offset > 0 => {
                    *self = Self::default();
                    continue;
                }
                Err(e) => return Err(e),
            };
            for r in recs.iter().filter(|r| r.kind == LogKind::Artifact) {
                if let (Some(id), Some(agent)) =
                    (r.data.get("id").and_then(|v| v.as_str()), &r.agent)
                {
                    self.by_id.insert(id.to_string(), agent.clone());
                }
            }
            if next == self.offset {
                return Ok(self.by_id.get(id).cloned());
            }
            self.offset = next;
        }
    }
}
