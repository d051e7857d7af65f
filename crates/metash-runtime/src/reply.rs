//! The host's half of an agent's stdin while it runs: how the host answers what the agent asks
//! (`consent_grant`, or an `error` with a code and hint) in the middle of an invocation. A native
//! agent's stdin lives as long as its process; a WASM agent's exists per invocation (each is a
//! fresh instance), so the handle is a slot the backend fills and empties.

use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use metash_protocol::AgentEvent;

use crate::codec;

/// How long a reply may wait for room in a stdin that the agent is not reading.
const SEND_WITHIN: Duration = Duration::from_secs(2);

/// Why a line could not be queued.
pub(crate) enum Refused {
    Full(Vec<u8>),
    Closed,
}

/// Where the agent's stdin lines go: the native writer thread's channel or the WASM guest's
/// stdin channel.
pub(crate) trait LineTx: Send + Sync {
    fn try_line(&self, line: Vec<u8>) -> Result<(), Refused>;
}

impl LineTx for SyncSender<Vec<u8>> {
    fn try_line(&self, line: Vec<u8>) -> Result<(), Refused> {
        self.try_send(line).map_err(|e| match e {
            mpsc::TrySendError::Full(l) => Refused::Full(l),
            mpsc::TrySendError::Disconnected(_) => Refused::Closed,
        })
    }
}

impl LineTx for tokio::sync::mpsc::Sender<Vec<u8>> {
    fn try_line(&self, line: Vec<u8>) -> Result<(), Refused> {
        self.try_send(line).map_err(|e| match e {
            tokio::sync::mpsc::error::TrySendError::Full(l) => Refused::Full(l),
            tokio::sync::mpsc::error::TrySendError::Closed(_) => Refused::Closed,
        })
    }
}

/// A cloneable handle that writes events on the agent's stdin. Cheap to clone; every clone talks to
/// the current run.
#[derive(Clone, Default)]
pub struct Replier(Arc<Mutex<Option<Arc<dyn LineTx>>>>);

impl Replier {
    /// Write `event` to the agent. False when no run is attached (the invocation is over) or the
    /// agent has not read its stdin for [`SEND_WITHIN`]: a reply never blocks the host for long.
    pub fn send(&self, event: AgentEvent) -> bool {
        let Ok(line) = codec::encode(event) else {
            return false;
        };
        let Some(tx) = self.0.lock().ok().and_then(|g| g.clone()) else {
            return false;
        };
        let start = Instant::now();
        let mut line = line;
        loop {
            match tx.try_line(line) {
                Ok(()) => return true,
                Err(Refused::Closed) => return false,
                Err(Refused::Full(back)) => {
                    if start.elapsed() >= SEND_WITHIN {
                        return false;
                    }
                    line = back;
                    thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }

    /// Whether a run is attached.
    pub fn attached(&self) -> bool {
        self.0.lock().map(|g| g.is_some()).unwrap_or(false)
    }

    pub(crate) fn attach(&self, tx: impl LineTx + 'static) {
        if let Ok(mut g) = self.0.lock() {
            *g = Some(Arc::new(tx));
        }
    }

    /// Drop the sender: a WASM guest blocked reading stdin sees end of input.
    pub(crate) fn detach(&self) {
        if let Ok(mut g) = self.0.lock() {
            *g = None;
        }
    }
}
