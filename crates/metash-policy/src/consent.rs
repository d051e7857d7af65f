//! Consent grants, persisted in `.meta/consent.json` through the store's locked read-modify-write,
//! so a grant or revocation made by one `metash` process is seen by every other at its next check.
//! The file is a cache of decisions; each change is first an event in the log (`consent_grant`,
//! `consent_revoke`), which is the audit trail.
//!
//! A revoked grant stays as a tombstone (`revoked_at`) until the capability is granted again, so the
//! agent's next use gets `consent_revoked` (a clear error) rather than a fresh prompt the user just
//! answered by revoking. Expired grants are pruned on the next write; expiry itself is decided at
//! use time against the clock.

use chrono::{DateTime, Utc};
use metash_protocol::LogKind;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use metash_store::{NewEvent, Store, StoreError};

use crate::capability::Capability;
use crate::clock::{parse_rfc3339, rfc3339};
use crate::error::{PolicyError, Result};

pub const CONSENT_DOC: &str = "consent";
const DOC_VERSION: u64 = 1;

/// One grant of one capability to one agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub agent: String,
    pub capability: Capability,
    pub granted_at: String,
    pub expires_at: String,
    pub duration_s: u64,
    /// Whether the grant also answers sensitive actions (network writes, process starts, writes
    /// outside the workspace, native execution), which otherwise ask every time.
    #[serde(default)]
    pub sensitive: bool,
    /// Who granted: `cli`, `terminal`, `policy`, ...
    #[serde(default)]
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
    /// Order of the last change (grant or revocation) within the document: a grant counts only
    /// if it is newer than every revocation covering the request. A counter, not the clock, so
    /// two changes in the same microsecond (or under a frozen test clock) still have an order.
    #[serde(default)]
    pub seq: u64,
}

impl Grant {
    pub fn expires(&self) -> Option<DateTime<Utc>> {
        parse_rfc3339(&self.expires_at)
    }

    /// Not revoked and not expired at `now` (an unparsable expiry counts as expired).
    pub fn active_at(&self, now: DateTime<Utc>) -> bool {
        self.revoked_at.is_none() && self.expires().is_some_and(|e| now < e)
    }
}

/// The document, as read.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ConsentDoc {
    #[serde(default)]
    pub version: u64,
    /// The last `seq` handed out.
    #[serde(default)]
    pub counter: u64,
    #[serde(default)]
    pub grants: Vec<Grant>,
}

impl ConsentDoc {
    /// Folds in grant `g` (its `seq` set from the advanced counter; returned as stored): the grant
    /// or tombstone it replaces goes, and so do tombstones it covers (granting `network` again
    /// supersedes revoking `network:x.com`). The one rule for the live document
    /// ([`grant`]) and for a document rebuilt from the log (`metash fork`).
    pub fn fold_grant(&mut self, mut g: Grant) -> Grant {
        self.grants.retain(|x| {
            let replaced = x.agent == g.agent
                && (x.capability == g.capability
                    || (x.revoked_at.is_some() && g.capability.covers(&x.capability)));
            !replaced
        });
        self.counter += 1;
        g.seq = self.counter;
        self.grants.push(g.clone());
        g
    }

    /// Folds in a revocation at `ts`: every grant of `agent` that `capability` covers is marked
    /// revoked, and a tombstone stands for `capability` itself unless a grant of exactly it was
    /// there. Returns the covered grants as they were before (the caller judges which were live).
    pub fn fold_revoke(
        &mut self,
        agent: &str,
        capability: &Capability,
        ts: &str,
        source: &str,
    ) -> Vec<Grant> {
        self.counter += 1;
        let seq = self.counter;
        let mut before = Vec::new();
        for g in self
            .grants
            .iter_mut()
            .filter(|g| g.agent == agent && capability.covers(&g.capability))
        {
            before.push(g.clone());
            g.revoked_at = Some(ts.to_string());
            g.seq = seq;
        }
        if !before.iter().any(|g| g.capability == *capability) {
            self.grants.push(Grant {
                agent: agent.to_string(),
                capability: capability.clone(),
                granted_at: ts.to_string(),
                expires_at: ts.to_string(),
                duration_s: 0,
                sensitive: false,
                source: source.to_string(),
                revoked_at: Some(ts.to_string()),
                seq,
            });
        }
        before
    }

    fn from_value(v: Value) -> Result<Self> {
        if v.is_null() {
            return Ok(Self::default());
        }
        serde_json::from_value(v).map_err(|e| {
            PolicyError::Invalid(format!(".meta/{CONSENT_DOC}.json does not parse: {e}"))
        })
    }
}

/// Reads the grants as persisted now.
///
/// # Errors
/// Store I/O, or a consent document that does not parse.
pub fn load(store: &Store) -> Result<ConsentDoc> {
    ConsentDoc::from_value(store.read_doc(CONSENT_DOC)?)
}

/// The grants of one agent as persisted now. The hot path of every check: it deserialises only
/// that agent's entries, not the whole document.
///
/// # Errors
/// Store I/O, or an entry of that agent that does not parse.
pub fn load_for(store: &Store, agent: &str) -> Result<Vec<Grant>> {
    let doc = store.read_doc(CONSENT_DOC)?;
    let Some(all) = doc.get("grants").and_then(Value::as_array) else {
        return Ok(Vec::new());
    };
    all.iter()
        .filter(|g| g.get("agent").and_then(Value::as_str) == Some(agent))
        .map(|g| {
            Grant::deserialize(g).map_err(|e| {
                PolicyError::Invalid(format!(
                    ".meta/{CONSENT_DOC}.json: a grant does not parse: {e}"
                ))
            })
        })
        .collect()
}

/// How long a grant lasts, whether it covers a sensitive action, and who gave it.
pub(crate) struct Terms<'a> {
    pub duration_s: u64,
    pub sensitive: bool,
    pub source: &'a str,
}

/// Records a grant (replacing any grant or tombstone for the same agent and capability) and its
/// `consent_grant` event.
pub(crate) fn grant(
    store: &Store,
    now: DateTime<Utc>,
    agent: &str,
    capability: &Capability,
    terms: Terms<'_>,
) -> Result<Grant> {
    let duration_s = terms.duration_s;
    let expires = chrono::Duration::try_seconds(i64::try_from(duration_s).unwrap_or(i64::MAX))
        .and_then(|d| now.checked_add_signed(d))
        .ok_or_else(|| PolicyError::Invalid(format!("a grant of {duration_s} s is too long")))?;
    let mut g = Grant {
        agent: agent.to_string(),
        capability: capability.clone(),
        granted_at: rfc3339(now),
        expires_at: rfc3339(expires),
        duration_s,
        sensitive: terms.sensitive,
        source: terms.source.to_string(),
        revoked_at: None,
        seq: 0,
    };
    let mut out = None;
    store.update_doc(CONSENT_DOC, |doc| {
        let mut d =
            ConsentDoc::from_value(doc.take()).map_err(|e| StoreError::Rejected(e.to_string()))?;
        // Expired grants go (tombstones stay: they are the record of a revocation).
        d.grants
            .retain(|x| x.revoked_at.is_some() || x.active_at(now));
        g = d.fold_grant(g.clone());
        let event = NewEvent::new(
            LogKind::ConsentGrant,
            Some(&g.agent),
            json!({
                "capability": g.capability,
                "expires_at": g.expires_at,
                "duration_s": g.duration_s,
                "sensitive": g.sensitive,
                "source": g.source,
            }),
        );
        out = Some(g.clone());
        d.version = DOC_VERSION;
        *doc = serde_json::to_value(&d).map_err(|e| StoreError::Rejected(e.to_string()))?;
        Ok(event)
    })?;
    out.ok_or_else(|| PolicyError::Invalid("the grant was not recorded".into()))
}

/// Revokes every live grant of `agent` that `capability` covers (so revoking `network` revokes
/// `network:api.github.com` too) and records a `consent_revoke` event. Returns the grants revoked;
/// none revoked still leaves a tombstone and an event, so the revocation is on record and
/// the next use is refused with `consent_revoked`.
pub(crate) fn revoke(
    store: &Store,
    now: DateTime<Utc>,
    agent: &str,
    capability: &Capability,
    source: &str,
) -> Result<Vec<Grant>> {
    let mut revoked = Vec::new();
    let revoked_ref = &mut revoked;
    store.update_doc(CONSENT_DOC, |doc| {
        let mut d = ConsentDoc::from_value(doc.take()).map_err(|e| StoreError::Rejected(e.to_string()))?;
        let covered = d.fold_revoke(agent, capability, &rfc3339(now), source);
        revoked_ref.extend(covered.into_iter().filter(|g| g.active_at(now)));
        d.version = DOC_VERSION;
        let event = NewEvent::new(
            LogKind::ConsentRevoke,
            Some(agent),
            json!({
                "capability": capability,
                "revoked": revoked_ref.iter().map(|g| json!({"capability": g.capability, "expires_at": g.expires_at})).collect::<Vec<_>>(),
                "source": source,
            }),
        );
        *doc = serde_json::to_value(&d).map_err(|e| StoreError::Rejected(e.to_string()))?;
        Ok(event)
    })?;
    Ok(revoked)
}
