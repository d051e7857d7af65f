//! A short, bounded busy wait before a thread sleeps.
//!
//! An invocation is a few hand-offs between the caller and the guest's worker, each a few
//! microseconds apart. Put to sleep, the waiting thread must be woken by the other, and on a
//! virtual machine that wake-up (an interrupt to another CPU, trapping to the hypervisor) costs
//! more than the wait itself. Watching for a moment first lets most hand-offs pass with no sleep
//! and no wake-up; past [`SPIN`] the thread sleeps as before. On one CPU the other side cannot run
//! while this one watches, so there it does not spin at all.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a thread watches before it sleeps: longer than the hand-offs within an invocation of
/// a small agent, short enough that a long wait wastes almost nothing.
pub const SPIN: Duration = Duration::from_micros(40);

/// Whether another CPU can run the thread this one waits for.
fn worth_it() -> bool {
    static MANY: OnceLock<bool> = OnceLock::new();
    *MANY.get_or_init(|| std::thread::available_parallelism().is_ok_and(|n| n.get() > 1))
}

/// Watches `done` for at most [`SPIN`]: whether it became true.
pub fn until(mut done: impl FnMut() -> bool) -> bool {
    if done() {
        return true;
    }
    if !worth_it() {
        return false;
    }
    let start = Instant::now();
    loop {
        // A yield, not a pause: when the awaited thread waits for this CPU, it runs now.
        std::thread::yield_now();
        if done() {
            return true;
        }
        if start.elapsed() >= SPIN {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_answers_at_once_when_done_and_gives_up_after_spin_when_not() {
        assert!(until(|| true));
        let start = Instant::now();
        assert!(!until(|| false));
        if worth_it() {
            assert!(start.elapsed() >= SPIN, "{:?}", start.elapsed());
        }
    }
}
