//! Group commit for the events of a spawn. Lifecycle and output events are many and small; one
//! fsync each would cost more than running a cached WASM agent. They are buffered and written
//! together (one append, one fsync) when 64 are waiting, when the oldest is 50 ms old, before any
//! write that must be immediate (state updates, checkpoints, so the log keeps its order), and at
//! the end of every spawn. Subscribers see events only after they are durable.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metash_protocol::LogKind;

use metash_protocol::LogRecord;
use metash_store::{NewEvent, Store};
use serde_json::Value;

use crate::bus::Bus;
use crate::error::Result;

const MAX_EVENTS: usize = 64;
const MAX_AGE: Duration = Duration::from_millis(50);

pub struct Journal {
    store: Store,
    bus: Arc<Bus>,
    pending: Mutex<(Vec<NewEvent>, Option<Instant>)>,
}

impl Journal {
    pub fn new(store: Store, bus: Arc<Bus>) -> Self {
        Self {
            store,
            bus,
            pending: Mutex::new((Vec::new(), None)),
        }
    }

    /// Buffers one event; writes the batch when it is full or old enough.
    pub fn push(&self, event: NewEvent) -> Result<()> {
        let due = {
            let Ok(mut p) = self.pending.lock() else {
                return Ok(());
            };
            p.0.push(event);
            let first = *p.1.get_or_insert_with(Instant::now);
            p.0.len() >= MAX_EVENTS || first.elapsed() >= MAX_AGE
        };
        if due {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes everything buffered (one fsync) and hands it to subscribers.
    pub fn flush(&self) -> Result<Vec<LogRecord>> {
        let batch = match self.pending.lock() {
            Ok(mut p) => {
                p.1 = None;
                std::mem::take(&mut p.0)
            }
            Err(_) => return Ok(Vec::new()),
        };
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let recs = self.store.append_batch(&batch)?;
        self.bus.publish(&recs);
        Ok(recs)
    }
}

impl metash_runtime::EventSink for Journal {
    fn record(&self, kind: LogKind, agent: Option<&str>, data: Value) {
        let _ = self.push(NewEvent::new(kind, agent, data));
    }
}
