//! An elastic pool of worker threads for WASM invocations (the guest and its output reader). A
//! thread spawn costs tens of microseconds, more than instantiating a cached module; reusing
//! threads keeps an invocation in the microseconds.
//!
//! Jobs never wait for a busy worker: a job either claims a worker known to be idle or gets a new
//! thread. (A guest waiting on its reader while the reader sat in a queue would deadlock.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread;

use crate::error::{io_err, Result};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The pool. Idle workers wait on a shared queue.
pub struct Pool {
    tx: Mutex<Sender<Job>>,
    rx: Arc<Mutex<Receiver<Job>>>,
    idle: Arc<AtomicUsize>,
}

impl Pool {
    pub fn new() -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        Self {
            tx: Mutex::new(tx),
            rx: Arc::new(Mutex::new(rx)),
            idle: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Run `job` on an idle worker, or on a new one when none is idle.
    ///
    /// # Errors
    /// A new thread could not be started.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) -> Result<()> {
        let claimed = self
            .idle
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |i| i.checked_sub(1))
            .is_ok();
        if claimed {
            if let Ok(tx) = self.tx.lock() {
                // The claimed worker is waiting on the queue (or about to): it takes this job.
                if tx.send(Box::new(job)).is_ok() {
                    return Ok(());
                }
            }
            return Err(crate::RuntimeError::Wasm("worker pool is gone".into()));
        }
        let (rx, idle) = (Arc::clone(&self.rx), Arc::clone(&self.idle));
        thread::Builder::new()
            .name("metash-wasm-worker".into())
            .spawn(move || {
                job();
                loop {
                    idle.fetch_add(1, Ordering::SeqCst);
                    let next = match rx.lock() {
                        Ok(guard) => guard.recv(),
                        Err(_) => return,
                    };
                    match next {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                }
            })
            .map_err(io_err("starting a wasm worker thread"))?;
        Ok(())
    }
}
