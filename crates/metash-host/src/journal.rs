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
//!
//! Each agent may add at most `[host] max_log_bytes_per_agent` bytes of log in a run (256 MiB
//! by default; a spawn's output alone may be 64 MiB). Past it, what the agent says (its
//! `agent_event`s, its model turn's `harness_event`s, tool calls and results, protocol errors) is
//! no longer logged; what the host decides about it (its start, limits, consent, its end) still
//! is. The moment the cap is reached is an `events_lost` record (`why: "log_cap"`), and so is the
//! count of what was left out since, at the next write (also in `.meta/journal.json` as
//! `log_capped`, `log_capped_by`). The cap is in every start report (`limits.log_bytes`).

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

/// Why events were not logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    /// The store failed for longer than the give-up time.
    Store,
    /// The agent reached its log cap.
    LogCap,
}

#[derive(Default)]
struct Pending {
    events: Vec<NewEvent>,
    oldest: Option<Instant>,
    /// Events given up, per agent (`host` for the host's own), not yet recorded as lost.
    lost: BTreeMap<String, u64>,
    /// Bytes of log each agent added in this run (about: the JSON of its records).
    logged: BTreeMap<String, u64>,
    /// Agent events left out past the log cap, per agent, not yet recorded.
    capped: BTreeMap<String, u64>,
    /// The agents whose log cap was reached (said once, at once).
    reached: std::collections::BTreeSet<String>,
    /// Since when `capped` holds counts; they are recorded at a spawn's end or after
    /// [`CAPPED_EVERY`] (not at every write: a flood past the cap would flood the log with them).
    capped_since: Option<Instant>,
    capped_due: bool,
}

/// How long left-out counts may wait for a spawn's end before they are recorded anyway.
const CAPPED_EVERY: Duration = Duration::from_secs(10);

pub struct Journal {
    store: Store,
    bus: Arc<Bus>,
    pending: Mutex<Pending>,
    held: usize,
    give_up: Duration,
    /// Bytes of log per agent and run (`[host] max_log_bytes_per_agent`).
    max_log_bytes: u64,
}

/// What an agent says, as opposed to what the host decides about it: past the agent's log cap,
/// only these are left out.
fn chatter(kind: &LogKind) -> bool {
    matches!(
        kind,
        LogKind::AgentEvent
            | LogKind::HarnessEvent
            | LogKind::ToolCall
            | LogKind::ToolResult
            | LogKind::ProtocolError
    )
}

/// About the bytes `v` takes as JSON (escapes aside), without serializing it.
fn json_len(v: &Value) -> u64 {
    match v {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => 12,
        Value::String(s) => s.len() as u64 + 2,
        Value::Array(a) => 2 + a.iter().map(|x| json_len(x) + 1).sum::<u64>(),
        Value::Object(m) => {
            2 + m
                .iter()
                .map(|(k, x)| k.len() as u64 + 4 + json_len(x))
                .sum::<u64>()
        }
    }
}

/// A record's size in the log: its data, kind and agent, and the envelope (sequence, time).
fn record_len(e: &NewEvent) -> u64 {
    let agent = e.agent.as_deref().map_or(0, str::len) as u64;
    json_len(&e.data) + e.kind.as_str().len() as u64 + agent + 80
}

impl Journal {
    /// How many events may wait for a write before agents are held back.
    pub const HELD: usize = 16_384;
    /// How long an agent is held back before its oldest waiting events are given up.
    pub const GIVE_UP: Duration = Duration::from_secs(30);

    /// The project's journal, with the log cap of its `.meta/config.toml` (already checked by
    /// the host that opens it; unreadable here, the default).
    pub fn new(store: Store, bus: Arc<Bus>) -> Self {
        let cap = crate::config::HostConfig::load(store.workspace())
            .map(|c| c.host.max_log_bytes_per_agent())
            .unwrap_or(crate::config::DEFAULT_MAX_LOG_BYTES_PER_AGENT);
        Self::with_limits(store, bus, Self::HELD, Self::GIVE_UP).with_log_cap(cap)
    }

    /// A journal with other limits (tests hold a few events for a short time).
    pub fn with_limits(store: Store, bus: Arc<Bus>, held: usize, give_up: Duration) -> Self {
        Self {
            store,
            bus,
            pending: Mutex::new(Pending::default()),
            held: held.max(MAX_EVENTS),
            give_up,
            max_log_bytes: crate::config::DEFAULT_MAX_LOG_BYTES_PER_AGENT,
        }
    }

    /// Another cap on each agent's bytes of log in this run.
    #[must_use]
    pub fn with_log_cap(mut self, bytes: u64) -> Self {
        self.max_log_bytes = bytes;
        self
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
    pub fn push(&self, mut event: NewEvent) -> Result<()> {
        if event.kind == LogKind::AgentStarted {
            self.report_cap(&mut event.data);
        }
        let mut event = Some(event);
        let due = loop {
            let mut p = self.pending();
            // The common case takes the lock once; only a full buffer waits (outside the lock).
            if p.events.len() < self.held {
                if let Some(e) = event.take() {
                    self.admit(&mut p, e);
                }
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

    /// Counts `e` against its agent's log cap and buffers it, unless it is chatter past the cap
    /// (then counted as left out; the first one is an `events_lost` record at once).
    fn admit(&self, p: &mut Pending, e: NewEvent) {
        p.capped_due |= e.kind == LogKind::SpawnEnd;
        let Some(agent) = e.agent.clone() else {
            p.events.push(e);
            return;
        };
        let logged = p.logged.entry(agent.clone()).or_default();
        *logged = logged.saturating_add(record_len(&e));
        if *logged <= self.max_log_bytes || !chatter(&e.kind) {
            p.events.push(e);
            return;
        }
        *p.capped.entry(agent.clone()).or_default() += 1;
        p.capped_since.get_or_insert_with(Instant::now);
        if p.reached.insert(agent.clone()) {
            let message = format!(
                "`{agent}` reached its log cap of {} bytes for this run ([host] \
                 max_log_bytes_per_agent): what it says is no longer logged, and how much is \
                 counted in later events_lost records",
                self.max_log_bytes
            );
            p.events.push(NewEvent::new(
                LogKind::EventsLost,
                Some(&agent),
                json!({"why": "log_cap", "events": 0, "by_agent": {},
                       "max_bytes": self.max_log_bytes, "message": message}),
            ));
        }
    }

    /// The log cap in an `agent_started` report's `limits` (a `metash sandbox` report nests it
    /// under `report`).
    fn report_cap(&self, data: &mut Value) {
        let limits = match data.get("report").and_then(|r| r.get("limits")) {
            Some(_) => &mut data["report"]["limits"],
            None => &mut data["limits"],
        };
        if let Some(l) = limits.as_object_mut() {
            l.insert(
                "log_bytes".into(),
                json!({"value": self.max_log_bytes, "via": "host-journal",
                       "note": "per agent and run: past it, its output and turn events are not \
                                logged (an events_lost record says so)"}),
            );
        }
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
        let (batch, lost, capped) = {
            let mut p = self.pending();
            p.oldest = None;
            let capped_due = std::mem::take(&mut p.capped_due)
                || p.capped_since.is_some_and(|t| t.elapsed() >= CAPPED_EVERY);
            let capped = if capped_due {
                p.capped_since = None;
                std::mem::take(&mut p.capped)
            } else {
                BTreeMap::new()
            };
            (
                std::mem::take(&mut p.events),
                std::mem::take(&mut p.lost),
                capped,
            )
        };
        if !lost.is_empty() {
            if let Err(e) = self.record_lost(&lost, Loss::Store) {
                self.put_back(batch, lost, capped);
                return Err(e);
            }
        }
        let recs = if batch.is_empty() {
            Vec::new()
        } else {
            match self.store.append_batch(&batch) {
                Ok(recs) => {
                    self.bus.publish(&recs);
                    recs
                }
                Err(e) => {
                    self.put_back(batch, BTreeMap::new(), capped);
                    return Err(e.into());
                }
            }
        };
        // After the batch: the moment the cap was reached (in the batch) comes first.
        if !capped.is_empty() {
            if let Err(e) = self.record_lost(&capped, Loss::LogCap) {
                self.put_back(Vec::new(), BTreeMap::new(), capped);
                return Err(e);
            }
        }
        Ok(recs)
    }

    /// A failed write's events go back in front of anything pushed since, in order.
    fn put_back(
        &self,
        mut batch: Vec<NewEvent>,
        lost: BTreeMap<String, u64>,
        capped: BTreeMap<String, u64>,
    ) {
        let mut p = self.pending();
        batch.append(&mut p.events);
        p.events = batch;
        p.oldest.get_or_insert_with(Instant::now);
        for (who, n) in lost {
            *p.lost.entry(who).or_default() += n;
        }
        if !capped.is_empty() {
            p.capped_due = true;
        }
        for (who, n) in capped {
            *p.capped.entry(who).or_default() += n;
        }
    }

    /// One `events_lost` record and the running totals in `.meta/journal.json` (`events_lost`
    /// for what a failing store made it give up, `log_capped` for what the log cap left out).
    fn record_lost(&self, lost: &BTreeMap<String, u64>, why: Loss) -> Result<()> {
        let events: u64 = lost.values().sum();
        let (total_key, by_key) = match why {
            Loss::Store => ("events_lost", "events_lost_by"),
            Loss::LogCap => ("log_capped", "log_capped_by"),
        };
        let rec = self.store.update_doc(JOURNAL_DOC, |doc| {
            let total = doc[total_key].as_u64().unwrap_or(0);
            doc[total_key] = json!(total.saturating_add(events));
            for (who, n) in lost {
                let by = &mut doc[by_key][who.as_str()];
                *by = json!(by.as_u64().unwrap_or(0).saturating_add(*n));
            }
            let mut data = json!({"events": events, "by_agent": lost});
            if why == Loss::LogCap {
                data["why"] = json!("log_cap");
                data["max_bytes"] = json!(self.max_log_bytes);
            }
            Ok(NewEvent::new(LogKind::EventsLost, None, data))
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
    fn past_its_log_cap_an_agents_chatter_is_left_out_and_said_so() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::init(dir.path(), Some("# journal\n")).unwrap();
        let journal = Journal::new(store.clone(), Arc::new(Bus::default())).with_log_cap(4_000);
        let chunk = "x".repeat(900);
        journal
            .push(NewEvent::new(
                LogKind::AgentStarted,
                Some("loud"),
                json!({"limits": {"memory_bytes": null}}),
            ))
            .unwrap();
        for i in 0..20 {
            let data = json!({"type": "output", "data": chunk, "i": i});
            journal
                .push(NewEvent::new(LogKind::AgentEvent, Some("loud"), data))
                .unwrap();
            journal.push(event("quiet", i)).unwrap();
        }
        journal
            .push(NewEvent::new(
                LogKind::AgentTerminated,
                Some("loud"),
                json!({}),
            ))
            .unwrap();
        journal.flush().unwrap();
        let counted = |s: &Store| {
            let all = s.log().read_all().unwrap();
            all.iter().filter(|r| r.kind == LogKind::EventsLost).count()
        };
        assert_eq!(
            counted(&store),
            1,
            "only the moment it was reached, until the spawn ends"
        );
        journal
            .push(NewEvent::new(LogKind::SpawnEnd, Some("loud"), json!({})))
            .unwrap();
        journal.flush().unwrap();
        let all = store.log().read_all().unwrap();
        let loud = |k: LogKind| {
            all.iter()
                .filter(|r| r.kind == k && r.agent.as_deref() == Some("loud"))
                .count()
        };
        let kept = loud(LogKind::AgentEvent);
        assert!(
            (2..=4).contains(&kept),
            "{kept} outputs of ~1 KB under a 4 KB cap"
        );
        assert_eq!(
            loud(LogKind::AgentTerminated),
            1,
            "the host's record is kept"
        );
        let quiet = all.iter().filter(|r| r.agent.as_deref() == Some("quiet"));
        assert_eq!(quiet.count(), 20, "another agent is not capped");
        let started = all
            .iter()
            .find(|r| r.kind == LogKind::AgentStarted)
            .unwrap();
        assert_eq!(started.data["limits"]["log_bytes"]["value"], 4_000);
        let lost: Vec<_> = all
            .iter()
            .filter(|r| r.kind == LogKind::EventsLost)
            .collect();
        assert_eq!(lost.len(), 2, "{lost:?}");
        assert_eq!(
            lost[0].agent.as_deref(),
            Some("loud"),
            "reaching it, at once"
        );
        assert_eq!(lost[0].data["why"], "log_cap");
        let left_out = 20 - kept as u64;
        assert_eq!(lost[1].data["by_agent"]["loud"], left_out, "{:?}", lost[1]);
        let doc = store.read_doc(JOURNAL_DOC).unwrap();
        assert_eq!(doc["log_capped_by"]["loud"], left_out);
        assert!(doc["events_lost"].is_null(), "not a store failure");
    }

    #[test]
    fn a_failed_write_keeps_its_events_for_the_next_in_order() {
        let (_dir, journal, other) = locked_setup(64, Duration::from_millis(100));
        let guard = other.lock().unwrap();
        // A push flushes once the oldest event waited 50 ms (a slow machine may get there):
        // that write fails while the lock is held, which is allowed here; the events must stay.
        for i in 0..3 {
            let _ = journal.push(event("a", i));
        }
        assert!(journal.flush().is_err(), "the lock is held");
        let _ = journal.push(event("a", 3));
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
