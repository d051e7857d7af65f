//! An elastic pool of worker threads for WASM invocations (the guest). A thread spawn costs tens
//! of microseconds, more than instantiating a cached module; reusing threads keeps an invocation
//! in the microseconds.
//!
//! Jobs never wait for a busy worker: a job either goes to a worker known to be idle or gets a
//! new thread. (A guest waiting on its reader while the reader sat in a queue would deadlock.)
//!
//! Waking a sleeping thread is the most expensive step of an invocation on a virtual machine (the
//! wake-up is an interrupt to another CPU, which traps to the hypervisor), so each hand-off wakes
//! at most one thread, and often none:
//! - each idle worker waits in a slot of its own, and a job goes to exactly one of them (idle
//!   workers sharing one queue behind a mutex woke each other in turn on every job);
//! - a worker that just finished watches its slot for a moment ([`super::spin`]) before it
//!   sleeps, so an invocation that follows at once hands its job over without a wake-up;
//! - the most recently idle worker goes first, its stack and caches still warm.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread::{self, Thread};

use crate::error::{io_err, Result};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// One worker's slot: where the pool leaves its next job.
struct Slot {
    /// The job; `None` with `ready` set means the pool is gone.
    job: Mutex<Option<Job>>,
    /// Set after `job` was filled: the worker's wait ends.
    ready: AtomicBool,
    /// The worker, to unpark (only a parked worker makes this a system call).
    thread: Thread,
}

impl Slot {
    fn hand(&self, job: Option<Job>) {
        *self.job.lock().unwrap_or_else(PoisonError::into_inner) = job;
        self.ready.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// The idle workers, most recently idle last; `closed` once the pool is gone.
#[derive(Default)]
struct IdleList {
    workers: Vec<Arc<Slot>>,
    closed: bool,
}

/// The pool.
pub struct Pool {
    idle: Arc<Mutex<IdleList>>,
}

impl Pool {
    pub fn new() -> Self {
        Self {
            idle: Arc::new(Mutex::new(IdleList::default())),
        }
    }

    /// Run `job` on an idle worker, or on a new one when none is idle.
    ///
    /// # Errors
    /// A new thread could not be started.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) -> Result<()> {
        let job: Job = Box::new(job);
        let next = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .workers
            .pop();
        if let Some(worker) = next {
            worker.hand(Some(job));
            return Ok(());
        }
        let idle = Arc::downgrade(&self.idle);
        thread::Builder::new()
            .name("metash-wasm-worker".into())
            .spawn(move || {
                job();
                work(&idle);
            })
            .map_err(io_err("starting a wasm worker thread"))?;
        Ok(())
    }
}

impl Drop for Pool {
    /// Idle workers end; busy ones end after their job.
    fn drop(&mut self) {
        let workers = {
            let mut list = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            list.closed = true;
            std::mem::take(&mut list.workers)
        };
        for w in workers {
            w.hand(None);
        }
    }
}

/// A worker's life after its first job: back on the idle list, then the next job, until the pool
/// is gone.
fn work(idle: &Weak<Mutex<IdleList>>) {
    let slot = Arc::new(Slot {
        job: Mutex::new(None),
        ready: AtomicBool::new(false),
        thread: thread::current(),
    });
    loop {
        {
            let Some(list) = idle.upgrade() else { return };
            let mut list = list.lock().unwrap_or_else(PoisonError::into_inner);
            if list.closed {
                return;
            }
            list.workers.push(Arc::clone(&slot));
        }
        if !super::spin::until(|| slot.ready.load(Ordering::Acquire)) {
            while !slot.ready.load(Ordering::Acquire) {
                thread::park();
            }
        }
        slot.ready.store(false, Ordering::Relaxed);
        let job = slot
            .job
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match job {
            Some(job) => job(),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    const WAIT: Duration = Duration::from_secs(10);

    /// The pool's idle workers, once `n` of them are back on the list.
    fn idle_workers(pool: &Pool, n: usize) -> usize {
        let until = std::time::Instant::now() + WAIT;
        loop {
            let now = pool.idle.lock().unwrap().workers.len();
            if now >= n || std::time::Instant::now() > until {
                return now;
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_job_never_waits_for_a_busy_worker() {
        let pool = Pool::new();
        let (to_first, first_waits) = mpsc::channel::<()>();
        let (done_tx, done) = mpsc::channel::<&str>();
        let d = done_tx.clone();
        pool.run(move || {
            // Busy until the second job has run: queued behind this one, it never would.
            let _ = first_waits.recv_timeout(WAIT);
            let _ = d.send("first");
        })
        .unwrap();
        pool.run(move || {
            // "second" is on its way before the first job may end and say "first".
            let _ = done_tx.send("second");
            let _ = to_first.send(());
        })
        .unwrap();
        assert_eq!(done.recv_timeout(WAIT), Ok("second"));
        assert_eq!(done.recv_timeout(WAIT), Ok("first"));
    }

    #[test]
    fn an_idle_worker_takes_the_next_job_on_its_own_thread() {
        let pool = Pool::new();
        let (tx, rx) = mpsc::channel();
        for _ in 0..20 {
            let tx = tx.clone();
            pool.run(move || {
                let _ = tx.send(thread::current().id());
            })
            .unwrap();
            assert_eq!(idle_workers(&pool, 1), 1, "the worker went back idle");
        }
        let ids: std::collections::HashSet<_> = rx.try_iter().collect();
        assert_eq!(ids.len(), 1, "one thread ran all 20 jobs: {ids:?}");
    }

    #[test]
    fn dropping_the_pool_ends_its_idle_workers() {
        /// Reports its thread's end.
        struct Ends(mpsc::Sender<()>);
        impl Drop for Ends {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }
        thread_local! {
            static ENDS: std::cell::RefCell<Option<Ends>> = const { std::cell::RefCell::new(None) };
        }
        let pool = Pool::new();
        let (tx, ended) = mpsc::channel();
        pool.run(move || ENDS.with(|e| *e.borrow_mut() = Some(Ends(tx))))
            .unwrap();
        assert_eq!(idle_workers(&pool, 1), 1);
        assert!(ended.recv_timeout(Duration::from_millis(200)).is_err());
        drop(pool);
        assert_eq!(ended.recv_timeout(WAIT), Ok(()), "the idle worker ended");
    }
}
