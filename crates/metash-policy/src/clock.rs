//! The clock grants are checked against, injectable so a test can make a grant expire without
//! sleeping. Expiry is always decided at use time against this clock, never cached.

use std::sync::Mutex;

use chrono::{DateTime, SecondsFormat, Utc};

pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> DateTime<Utc>;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// The clock of the store grants live in: its server's when it is on one ([`metash_store::Store::now`]).
#[derive(Debug)]
pub struct StoreClock(metash_store::Store);

impl Clock for StoreClock {
    fn now(&self) -> DateTime<Utc> {
        self.0.now()
    }
}

/// The clock grants on `store` are judged by: the server's when the store is on one, else this
/// machine's.
pub fn for_store(store: &metash_store::Store) -> std::sync::Arc<dyn Clock> {
    if store.server().is_some() {
        std::sync::Arc::new(StoreClock(store.clone()))
    } else {
        std::sync::Arc::new(SystemClock)
    }
}

/// A clock that only moves when told to (tests).
#[derive(Debug)]
pub struct ManualClock(Mutex<DateTime<Utc>>);

impl ManualClock {
    pub fn new(at: DateTime<Utc>) -> Self {
        Self(Mutex::new(at))
    }

    pub fn advance(&self, by: chrono::Duration) {
        if let Ok(mut t) = self.0.lock() {
            *t += by;
        }
    }

    pub fn set(&self, at: DateTime<Utc>) {
        if let Ok(mut t) = self.0.lock() {
            *t = at;
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        match self.0.lock() {
            Ok(t) => *t,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }
}

/// RFC 3339 UTC with microseconds, like the log's `ts`.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Parses an RFC 3339 timestamp to UTC.
pub fn parse_rfc3339(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}
