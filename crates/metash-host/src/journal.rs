//! Group commit for the events of a spawn. Lifecycle and output events are many and small; one
//! fsync each would cost more than running a cached WASM agent. They are buffered and written
//! together (one append, one fsync) when 64 are waiting, when the oldest is 50 ms old, before any
//! write that must be immediate (state updates, checkpoints, so the log keeps its order), and at
//! the end of every spawn; a background tick writes a batch that has waited 50 ms with nothing
//! after it. Subscribers see events only after they are durable.
//!
//! Nothing is dropped silently. A write that fails (the store's lock held too long, a full disk)
//! keeps the batch for the next attempt. When [`Journal::HELD`] events are waiting, the agent
//! whose event is being recorded is held back: its event is not taken until the journal has
//! written or the give-up time has passed (backpressure reaches the agent through its pipe, as
//! the runtime's token bucket does). Only then are the oldest events given up, counted per
//! agent; the first write that succeeds again records the count as an `events_lost` record and in
//! `.meta/journal.json`, which `metash status` shows.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use metash_protocol::{LogKind, LogRecord};
use metash_store::{NewEvent, Store};
use serde_json::{json, Value};

use crate::bus::Bus;
use crate::error::Result;

const MAX_EVENTS: usize = 64;
const MAX_AGE: Duration = Duration::from_millis(50);

/// Where the journal's loss count lives (`.meta/journal.json`).
pub const JOURNAL_DOC: &str = "journal";

#[derive(Default)]
struct Pending {
    events: Vec<NewEvent>,
    oldest: Option<Instant>,
    /// Events given up, per agent (`host` for the host's own), not yet recorded as lost.
    lost: BTreeMap<String, u64>,
}

pub struct Journal {
    store: Store,
    bus: Arc<Bus>,
    pending: Mutex<Pending>,
    held: usize,
    give_up: Duration,
}

impl Journal {
    /// How many events may wait for a write before agents are held back.
    pub const HELD: usize = 16_384;
    /// How long an agent is held back before its oldest waiting events are given up.
    pub const GIVE_UP: Duration = Duration::from_secs(30);

    pub fn new(store: Store, bus: Arc<Bus>) -> Self {
        Self::with_limits(store, bus, Self::HELD, Self::GIVE_UP)
    }

    /// A journal with other limits (tests hold a few events for a short time).
    pub fn with_limits(store: Store, bus: Arc<Bus>, held: usize, give_up: Duration) -> Self {
        Self {
            store,
            bus,
            pending: Mutex::new(Pending::default()),
            held: held.max(MAX_EVENTS),
            give_up,
        }
    }

    /// Writes a batch once its oldest event is [`MAX_AGE`] old even when no further event comes
    /// (an agent that said something and then waits must be seen by `metash log tail`, the UI
    /// and other processes now, not at the end of its spawn). The thread holds only a weak
    /// reference and ends once the journal is gone.
    pub fn keep_flushing(journal: &Arc<Self>) {
        let weak = Arc::downgrade(journal);
        let _ = std::thread::Builder::new()
            .name("metash-journal".into())
            .spawn(move || loop {
                std::thread::sleep(MAX_AGE / 2);
                let Some(j) = weak.upgrade() else {
                    return;
                };
                let due = j.pending().oldest.is_some_and(|o| o.elapsed() >= MAX_AGE);
                if due {
                    // A failed write keeps the batch; the next push or tick tries again.
                    let _ = j.flush();
                }
            });
    }

    /// A poisoned lock still holds good events: a panic elsewhere must not lose them.
    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Buffers one event; writes the batch when it is full or old enough. When too many events
    /// are waiting on a failing store, waits (up to the give-up time) for a write to succeed.
    ///
    /// # Errors
    /// The store failed a write that was due; the events stay buffered.
    pub fn push(&self, event: NewEvent) -> Result<()> {
        let mut event = Some(event);
        let due = loop {
            let mut p = self.pending();
            // The common case takes the lock once; only a full buffer waits (outside the lock).
            if p.events.len() < self.held {
                p.events.extend(event.take());
                let first = *p.oldest.get_or_insert_with(Instant::now);
                break p.events.len() >= MAX_EVENTS || first.elapsed() >= MAX_AGE;
            }
            drop(p);
            self.make_room();
        };
        if due {
            self.flush()?;
        }
        Ok(())
    }

    /// Backpressure: while the buffer is full, retry the write; past the give-up time, give up
    /// the oldest events (counted) so the agent can go on.
    fn make_room(&self) {
        let deadline = Instant::now() + self.give_up;
        while self.pending().events.len() >= self.held {
            if self.flush().is_ok() {
                return;
            }
            if Instant::now() >= deadline {
                let mut p = self.pending();
                let excess = p.events.len() + 1 - self.held;
                let dropped: Vec<NewEvent> = p.events.drain(..excess).collect();
                for e in dropped {
                    let who = e.agent.unwrap_or_else(|| "host".to_string());
                    *p.lost.entry(who).or_default() += 1;
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Writes everything buffered (one fsync) and hands it to subscribers; first records any
    /// events given up since the last write.
    ///
    /// # Errors
    /// The store refused the write; the batch is kept for the next attempt.
    pub fn flush(&self) -> Result<Vec<LogRecord>> {
        let (batch, lost) = {
            let mut p = self.pending();
            p.oldest = None;
            (std::mem::take(&mut p.events), std::mem::take(&mut p.lost))
        };
        if !lost.is_empty() {
            if let Err(e) = self.record_lost(&lost) {
                self.put_back(batch, lost);
                return Err(e);
            }
        }
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        match self.store.append_batch(&batch) {
            Ok(recs) => {
                self.bus.publish(&recs);
                Ok(recs)
            }
            Err(e) => {
                self.put_back(batch, BTreeMap::new());
                Err(e.into())
            }
        }
    }

    /// A failed write's events go back in front of anything pushed since, in order.
    fn put_back(&self, mut batch: Vec<NewEvent>, lost: BTreeMap<String, u64>) {
        let mut p = self.pending();
        batch.append(&mut p.events);
        p.events = batch;
        p.oldest.get_or_insert_with(Instant::now);
        for (who, n) in lost {
            *p.lost.entry(who).or_default() += n;
        }
    }

    /// One `events_lost` record and the running totals in `.meta/journal.json`.
    fn record_lost(&self, lost: &BTreeMap<String, u64>) -> Result<()> {
        let events: u64 = lost.values().sum();
        let rec = self.store.update_doc(JOURNAL_DOC, |doc| {
            let total = doc["events_lost"].as_u64().unwrap_or(0);
            doc["events_lost"] = json!(total.saturating_add(events));
            for (who, n) in lost {
                let by = &mut doc["events_lost_by"][who.as_str()];
                *by = json!(by.as_u64().unwrap_or(0).saturating_add(*n));
            }
            Ok(NewEvent::new(
                LogKind::EventsLost,
                None,
                json!({"events": events, "by_agent": lost}),
            ))
        })?;
        self.bus.publish(std::slice::from_ref(&rec));
        Ok(())
    }

    /// Events given up and not yet recorded, per agent.
    #[cfg(test)]
    fn unrecorded_losses(&self) -> BTreeMap<String, u64> {
        self.pending().lost.clone()
    }
}

impl metash_runtime::EventSink for Journal {
    /// A failed write is not lost: the events stay buffered (see the module doc).
    fn record(&self, kind: LogKind, agent: Option<&str>, data: Value) {
        let _ = self.push(NewEvent::new(kind, agent, data));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A journal whose store gives up on its lock after 20 ms, and a second handle to hold it.
    fn locked_setup(held: usize, give_up: Duration) -> (tempfile::TempDir, Journal, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::init(dir.path(), Some("# journal\n")).unwrap();
        let quick = store.clone().with_lock_timeout(Duration::from_millis(20));
        let journal = Journal::with_limits(quick, Arc::new(Bus::default()), held, give_up);
        let other = Store::open(dir.path()).unwrap();
        (dir, journal, other)
    }

    fn event(agent: &str, i: usize) -> NewEvent {
        NewEvent::new(LogKind::AgentEvent, Some(agent), json!({"i": i}))
    }

    fn agent_events(store: &Store) -> Vec<u64> {
        let all = store.log().read_all().unwrap();
        let mine = all.into_iter().filter(|r| r.kind == LogKind::AgentEvent);
        mine.map(|r| r.data["i"].as_u64().unwrap()).collect()
    }

    #[test]
    fn a_failed_write_keeps_its_events_for_the_next_in_order() {
        let (_dir, journal, other) = locked_setup(64, Duration::from_millis(100));
        let guard = other.lock().unwrap();
        for i in 0..3 {
            journal.push(event("a", i)).unwrap();
        }
        assert!(journal.flush().is_err(), "the lock is held");
        journal.push(event("a", 3)).unwrap();
        drop(guard);
        assert_eq!(journal.flush().unwrap().len(), 4);
        assert_eq!(agent_events(&other), vec![0, 1, 2, 3]);
        assert!(
            other.read_doc(JOURNAL_DOC).unwrap().is_null(),
            "nothing lost"
        );
    }

    #[test]
    fn a_flood_into_a_stuck_store_holds_the_agent_back_then_counts_what_it_gave_up() {
        let give_up = Duration::from_millis(100);
        let (_dir, journal, other) = locked_setup(64, give_up);
        let guard = other.lock().unwrap();
        let started = Instant::now();
        for i in 0..74 {
            let _ = journal.push(event("flooder", i));
        }
        // Each of the last 10 pushes waited for the store before giving up one event.
        assert!(started.elapsed() >= give_up * 10, "{:?}", started.elapsed());
        assert_eq!(journal.unrecorded_losses()["flooder"], 10);
        drop(guard);
        assert_eq!(journal.flush().unwrap().len(), 64);
        assert_eq!(agent_events(&other), (10..74).collect::<Vec<u64>>());
        let lost = other.log().read_all().unwrap();
        let lost = lost.iter().find(|r| r.kind == LogKind::EventsLost).unwrap();
        assert_eq!(
            lost.data,
            json!({"events": 10, "by_agent": {"flooder": 10}})
        );
        let doc = other.read_doc(JOURNAL_DOC).unwrap();
        assert_eq!(doc["events_lost"], 10);
        assert_eq!(doc["events_lost_by"]["flooder"], 10);
        assert!(journal.unrecorded_losses().is_empty());
    }
}
