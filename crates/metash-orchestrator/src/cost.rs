//! What the host's own trust checks cost (issue 30): the git-trust check before each git
//! operation, the tree check before a merge or revert, and the recorded-branch checks. Each adds
//! its time here, so the `schedule` benchmark can report a run's host time per task with the
//! checks against the same run without them, from one run and without a switch that turns a
//! defence off. A relaxed atomic add per check; nothing else reads it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

static CHECKS_NANOS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Checks running on this thread: a check inside another is counted once, in the outer one.
    static DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Runs `f`, a trust check, adding its time to [`checks_time`].
pub(crate) fn checking<T>(f: impl FnOnce() -> T) -> T {
    let outer = DEPTH.with(|d| {
        d.set(d.get() + 1);
        d.get() == 1
    });
    let start = Instant::now();
    let out = f();
    if outer {
        let spent = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        CHECKS_NANOS.fetch_add(spent, Ordering::Relaxed);
    }
    DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    out
}

/// The time this process has spent in trust checks so far.
pub fn checks_time() -> Duration {
    Duration::from_nanos(CHECKS_NANOS.load(Ordering::Relaxed))
}
