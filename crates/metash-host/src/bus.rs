//! Fan-out of log records to attached clients (terminal, JSON-RPC, MCP). Every event reaches the
//! store's log first; subscribers get what was made durable. A subscriber that stops reading is
//! dropped rather than allowed to grow memory without bound.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Mutex;

use metash_protocol::LogRecord;

/// How many events a subscriber may lag behind before it is cut off.
pub const SUBSCRIBER_BUFFER: usize = 4096;

#[derive(Debug, Default)]
pub struct Bus {
    subscribers: Mutex<Vec<SyncSender<LogRecord>>>,
}

impl Bus {
    pub fn subscribe(&self) -> Receiver<LogRecord> {
        let (tx, rx) = sync_channel(SUBSCRIBER_BUFFER);
        if let Ok(mut subs) = self.subscribers.lock() {
            subs.push(tx);
        }
        rx
    }

    pub fn publish(&self, records: &[LogRecord]) {
        let Ok(mut subs) = self.subscribers.lock() else {
            return;
        };
        subs.retain(|tx| {
            records.iter().all(|r| match tx.try_send(r.clone()) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
            })
        });
    }
}
