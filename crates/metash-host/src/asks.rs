//! Consent questions any client can answer (seed 002 §2 with §8's consent cards). When nobody is
//! at a terminal and no rule answers an agent's question, the host can wait (`[host]
//! consent_wait_seconds`) instead of denying at once: the question becomes a durable record in
//! `.meta/consent_asks.json`, shown by `metash ui` (and readable by any process), and the first
//! client to answer wins. An answer is one read-modify-write under the store's lock, so two
//! clients answering at once cannot both win; a question past its deadline cannot be answered and
//! is denied.

use std::time::{Duration, Instant};

use metash_policy::{Answer, ConsentPrompter, ConsentQuestion, NonInteractive};
use metash_protocol::LogKind;
use metash_store::{NewEvent, Store, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::Result;

/// The document that holds the questions.
pub const ASKS_DOC: &str = "consent_asks";

/// How often a waiting question looks for its answer.
const POLL: Duration = Duration::from_millis(100);

/// Answered or expired questions older than this are dropped from the document (the log keeps
/// them).
const KEEP_S: i64 = 3_600;

/// One question, as stored and as shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ask {
    pub id: String,
    pub agent: String,
    pub capability: String,
    pub reason: String,
    pub duration_s: Option<u64>,
    pub asked_at: String,
    /// RFC 3339; unanswered by then, it is denied.
    pub deadline: String,
    /// `allow_once`, `allow_for`, `deny` once answered.
    #[serde(default)]
    pub answer: Option<String>,
    #[serde(default)]
    pub answer_duration_s: Option<u64>,
    #[serde(default)]
    pub by: Option<String>,
}

impl Ask {
    fn expired(&self, now: chrono::DateTime<chrono::Utc>) -> bool {
        chrono::DateTime::parse_from_rfc3339(&self.deadline).map_or(true, |d| now >= d)
    }

    fn answered(&self) -> Option<Answer> {
        match self.answer.as_deref()? {
            "allow_once" => Some(Answer::AllowOnce),
            "allow_for" => Some(Answer::AllowFor(self.answer_duration_s.unwrap_or(0).max(1))),
            _ => Some(Answer::Deny),
        }
    }
}

fn asks_of(doc: &Value) -> Vec<Ask> {
    doc.get("asks")
        .and_then(|a| serde_json::from_value(a.clone()).ok())
        .unwrap_or_default()
}

fn write_asks(doc: &mut Value, asks: &[Ask]) -> std::result::Result<(), StoreError> {
    let v = serde_json::to_value(asks).map_err(|e| StoreError::Rejected(e.to_string()))?;
    *doc = json!({ "asks": v });
    Ok(())
}

/// The questions waiting now (unanswered, before their deadline), oldest first.
///
/// # Errors
/// The document cannot be read.
pub fn pending(store: &Store) -> Result<Vec<Ask>> {
    let now = store.now();
    Ok(asks_of(&store.read_doc(ASKS_DOC)?)
        .into_iter()
        .filter(|a| a.answer.is_none() && !a.expired(now))
        .collect())
}

/// Records `q` as waiting until `wait` from now; its id.
///
/// # Errors
/// The store cannot record it (then nobody can answer: the caller denies).
pub fn post(store: &Store, q: &ConsentQuestion, wait: Duration) -> Result<String> {
    let now = store.now();
    let deadline = now + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::zero());
    let ask = Ask {
        id: format!("ask-{}", uuid::Uuid::new_v4().simple()),
        agent: q.agent.clone(),
        capability: q.capability.to_string(),
        reason: q.reason.clone(),
        duration_s: q.duration_s,
        asked_at: now.to_rfc3339(),
        deadline: deadline.to_rfc3339(),
        answer: None,
        answer_duration_s: None,
        by: None,
    };
    let id = ask.id.clone();
    store.update_doc(ASKS_DOC, |doc| {
        let cutoff = now - chrono::Duration::seconds(KEEP_S);
        let mut asks: Vec<Ask> = asks_of(doc)
            .into_iter()
            .filter(|a| {
                chrono::DateTime::parse_from_rfc3339(&a.asked_at).is_ok_and(|t| t > cutoff)
                    || (a.answer.is_none() && !a.expired(now))
            })
            .collect();
        asks.push(ask.clone());
        write_asks(doc, &asks)?;
        Ok(NewEvent::new(
            LogKind::ConsentPending,
            Some(&ask.agent),
            json!({"id": ask.id, "capability": ask.capability, "reason": ask.reason,
                   "duration_s": ask.duration_s, "deadline": ask.deadline}),
        ))
    })?;
    Ok(id)
}

/// Answers question `id` for client `by`, if it still waits: the first answer wins.
///
/// # Errors
/// Unknown, already answered, or past its deadline (each said so), or the store failed.
pub fn reply(store: &Store, id: &str, answer: Answer, by: &str) -> Result<()> {
    let now = store.now();
    store.update_doc(ASKS_DOC, |doc| {
        let mut asks = asks_of(doc);
        let ask = asks
            .iter_mut()
            .find(|a| a.id == id)
            .ok_or_else(|| StoreError::Rejected(format!("no consent question `{id}`")))?;
        if let Some(given) = &ask.answer {
            return Err(StoreError::Rejected(format!(
                "consent question `{id}` was already answered ({given}, by {})",
                ask.by.as_deref().unwrap_or("someone")
            )));
        }
        if ask.expired(now) {
            return Err(StoreError::Rejected(format!(
                "consent question `{id}` is past its deadline and was denied"
            )));
        }
        let (word, secs) = match answer {
            Answer::AllowOnce => ("allow_once", None),
            Answer::AllowFor(s) => ("allow_for", Some(s)),
            Answer::Deny => ("deny", None),
        };
        ask.answer = Some(word.to_string());
        ask.answer_duration_s = secs;
        ask.by = Some(by.to_string());
        let agent = ask.agent.clone();
        write_asks(doc, &asks)?;
        Ok(NewEvent::new(
            LogKind::ConsentReplied,
            Some(&agent),
            json!({"id": id, "answer": word, "duration_s": secs, "by": by}),
        ))
    })?;
    Ok(())
}

/// The answer to `id`, once there is one.
pub(crate) fn answer_of(store: &Store, id: &str) -> Option<Answer> {
    let doc = store.read_doc(ASKS_DOC).ok()?;
    asks_of(&doc)
        .into_iter()
        .find(|a| a.id == id)
        .and_then(|a| a.answered())
}

/// Scripts' and servers' prompter with a wait: the policy file and `--yes-to` first; a question
/// they do not answer is posted for any client and waited for, then denied at its deadline.
pub struct WaitingPrompter {
    rules: NonInteractive,
    store: Store,
    wait: Duration,
}

impl WaitingPrompter {
    pub fn new(rules: NonInteractive, store: Store, wait: Duration) -> Self {
        Self { rules, store, wait }
    }
}

impl ConsentPrompter for WaitingPrompter {
    fn ask(&mut self, q: &ConsentQuestion) -> Answer {
        if let Some(a) = self.rules.decide(q) {
            return a;
        }
        let Ok(id) = post(&self.store, q, self.wait) else {
            return Answer::Deny;
        };
        let until = Instant::now() + self.wait;
        while Instant::now() < until {
            if let Some(a) = answer_of(&self.store, &id) {
                return a;
            }
            std::thread::sleep(POLL);
        }
        // One last look: an answer made just before the deadline counts.
        answer_of(&self.store, &id).unwrap_or(Answer::Deny)
    }

    fn name(&self) -> &'static str {
        "any client"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metash_policy::Capability;

    fn question() -> ConsentQuestion {
        ConsentQuestion {
            agent: "a".into(),
            agent_name: "A".into(),
            capability: "codegen"
                .parse::<Capability>()
                .unwrap_or_else(|_| unreachable!()),
            reason: "why".into(),
            sensitive: None,
            duration_s: Some(30),
        }
    }

    #[test]
    fn the_first_answer_wins_and_is_seen_by_the_waiting_side() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = Store::init(dir.path(), None).unwrap_or_else(|e| panic!("{e}"));
        let id =
            post(&store, &question(), Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(pending(&store).map(|p| p.len()).ok(), Some(1));
        assert_eq!(answer_of(&store, &id), None);
        reply(&store, &id, Answer::AllowFor(60), "ui").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(answer_of(&store, &id), Some(Answer::AllowFor(60)));
        assert!(reply(&store, &id, Answer::Deny, "terminal").is_err());
        assert_eq!(pending(&store).map(|p| p.len()).ok(), Some(0));
    }
}
