//! Consent questions any client can answer (seed 002 §2 with §8's consent cards). When nobody is
//! at a terminal and no rule answers an agent's question, the host can wait (`[host]
//! consent_wait_seconds`) instead of denying at once: the question becomes a durable record in
//! `.meta/consent_asks.json`, shown by `metash ui` (and readable by any process), and the first
//! client to answer wins. An answer is one read-modify-write under the store's lock, so two
//! clients answering at once cannot both win; a question past its deadline cannot be answered and
//! is denied.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
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

    fn by_rule(&self, q: &ConsentQuestion) -> Option<Answer> {
        self.rules.decide(q)
    }
}

/// How many consent questions one agent may have: waiting at once, and asked in any minute
/// (`[host] consent_max_pending`, `consent_per_minute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuestionLimits {
    pub max_pending: usize,
    pub per_minute: usize,
}

/// Why an agent's question was refused without asking anyone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It already has this many different questions waiting.
    TooManyPending { max: usize },
    /// It was asked this many questions in the last minute.
    RateLimited { per_minute: usize },
}

impl Refusal {
    /// The `error` event's code.
    pub fn code(self) -> &'static str {
        match self {
            Self::TooManyPending { .. } => "consent_too_many_pending",
            Self::RateLimited { .. } => "consent_rate_limited",
        }
    }

    /// What the agent (and the log) is told.
    pub fn message(self, agent: &str) -> String {
        match self {
            Self::TooManyPending { max } => format!(
                "`{agent}` already has {max} consent questions waiting for an answer (the most \
                 an agent may have); refused without asking"
            ),
            Self::RateLimited { per_minute } => format!(
                "`{agent}` was asked {per_minute} consent questions in the last minute (the \
                 most an agent may ask); refused without asking"
            ),
        }
    }

    pub fn hint(self) -> &'static str {
        "wait for the answers you asked for, ask less often, or go on without it ([host] \
         consent_max_pending and consent_per_minute in .meta/config.toml set the limits)"
    }
}

/// Where one question stands for the caller that brings it.
pub(crate) enum Turn<A: Clone> {
    /// Nobody asks it yet: the caller asks, then [`Lead::finish`]es with the answer.
    Ask(Lead<A>),
    /// The same question (same agent, capability, reason) is waiting: its answer will be this
    /// one's ([`Slot::wait`]).
    Join(Arc<Slot<A>>),
    /// Past the agent's cap or rate.
    Refused(Refusal),
}

/// One question's answer, shared by everyone who asked it.
pub(crate) struct Slot<A> {
    answer: Mutex<Option<Option<A>>>,
    ready: Condvar,
}

impl<A: Clone> Slot<A> {
    /// Waits for the asker's answer; `None` when the asker went away without one.
    pub fn wait(&self) -> Option<A> {
        let mut a = self.answer.lock().unwrap_or_else(PoisonError::into_inner);
        while a.is_none() {
            a = self.ready.wait(a).unwrap_or_else(PoisonError::into_inner);
        }
        a.clone().flatten()
    }

    fn set(&self, answer: Option<A>) {
        *self.answer.lock().unwrap_or_else(PoisonError::into_inner) = Some(answer);
        self.ready.notify_all();
    }
}

/// The caller asking a question; dropping it without an answer frees its waiters (with none).
pub(crate) struct Lead<A: Clone> {
    questions: Arc<Questions<A>>,
    agent: String,
    key: (String, String),
    slot: Arc<Slot<A>>,
}

impl<A: Clone> Lead<A> {
    /// Gives everyone who asked the same question `answer`.
    pub fn finish(self, answer: A) {
        self.slot.set(Some(answer));
    }
}

impl<A: Clone> Drop for Lead<A> {
    fn drop(&mut self) {
        let mut all = self.questions.lock();
        if let Some(q) = all.get_mut(&self.agent) {
            q.pending.remove(&self.key);
        }
        drop(all);
        let mut a = self
            .slot
            .answer
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if a.is_none() {
            *a = Some(None);
            self.slot.ready.notify_all();
        }
    }
}

struct AgentQuestions<A> {
    pending: HashMap<(String, String), Arc<Slot<A>>>,
    /// When each question of the last minute was asked.
    asked: VecDeque<Instant>,
}

/// The consent questions agents have waiting and have asked: the cap on waiting questions and
/// the rate per agent, and identical waiting questions collapsed into one (issue 31: an agent
/// asked 40 questions in a row, each posted and waited for).
pub(crate) struct Questions<A> {
    agents: Mutex<HashMap<String, AgentQuestions<A>>>,
}

impl<A> Default for Questions<A> {
    fn default() -> Self {
        Self {
            agents: Mutex::new(HashMap::new()),
        }
    }
}

impl<A: Clone> Questions<A> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, AgentQuestions<A>>> {
        self.agents.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `agent` brings a question for `capability` because `reason`: join the same one waiting,
    /// ask it (counted), or be refused.
    pub fn enter(
        self: &Arc<Self>,
        agent: &str,
        capability: &str,
        reason: &str,
        limits: QuestionLimits,
    ) -> Turn<A> {
        let mut all = self.lock();
        let q = all
            .entry(agent.to_string())
            .or_insert_with(|| AgentQuestions {
                pending: HashMap::new(),
                asked: VecDeque::new(),
            });
        let key = (capability.to_string(), reason.to_string());
        if let Some(slot) = q.pending.get(&key) {
            return Turn::Join(Arc::clone(slot));
        }
        if q.pending.len() >= limits.max_pending {
            return Turn::Refused(Refusal::TooManyPending {
                max: limits.max_pending,
            });
        }
        let now = Instant::now();
        while q
            .asked
            .front()
            .is_some_and(|t| now.duration_since(*t) >= RATE_WINDOW)
        {
            q.asked.pop_front();
        }
        if q.asked.len() >= limits.per_minute {
            return Turn::Refused(Refusal::RateLimited {
                per_minute: limits.per_minute,
            });
        }
        q.asked.push_back(now);
        let slot = Arc::new(Slot {
            answer: Mutex::new(None),
            ready: Condvar::new(),
        });
        q.pending.insert(key.clone(), Arc::clone(&slot));
        Turn::Ask(Lead {
            questions: Arc::clone(self),
            agent: agent.to_string(),
            key,
            slot,
        })
    }
}

/// The window of [`QuestionLimits::per_minute`].
const RATE_WINDOW: Duration = Duration::from_secs(60);

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

    const LIMITS: QuestionLimits = QuestionLimits {
        max_pending: 3,
        per_minute: 10,
    };

    #[test]
    fn past_the_rate_questions_are_refused_and_other_agents_are_not() {
        let qs = Arc::new(Questions::<u32>::default());
        for i in 0..10 {
            match qs.enter("a", "network", &format!("why {i}"), LIMITS) {
                Turn::Ask(lead) => lead.finish(i),
                _ => panic!("question {i} was not asked"),
            }
        }
        assert!(matches!(
            qs.enter("a", "network", "one more", LIMITS),
            Turn::Refused(Refusal::RateLimited { per_minute: 10 })
        ));
        assert!(matches!(
            qs.enter("b", "network", "mine", LIMITS),
            Turn::Ask(_)
        ));
    }

    #[test]
    fn past_the_cap_of_waiting_questions_one_is_refused_but_the_same_one_joins() {
        let qs = Arc::new(Questions::<&'static str>::default());
        let leads: Vec<Lead<&str>> = (0..3)
            .map(
                |i| match qs.enter("a", "codegen", &format!("q{i}"), LIMITS) {
                    Turn::Ask(l) => l,
                    _ => panic!("not asked"),
                },
            )
            .collect();
        let refused = qs.enter("a", "codegen", "q3", LIMITS);
        assert!(matches!(
            refused,
            Turn::Refused(Refusal::TooManyPending { max: 3 })
        ));
        let joined: Vec<_> = (0..4)
            .map(|_| match qs.enter("a", "codegen", "q1", LIMITS) {
                Turn::Join(slot) => std::thread::spawn(move || slot.wait()),
                _ => panic!("the same question was not collapsed"),
            })
            .collect();
        let mut leads = leads.into_iter();
        for answer in ["first", "second"] {
            leads.next().expect("a lead").finish(answer);
        }
        for j in joined {
            assert_eq!(j.join().unwrap(), Some("second"), "one answer for all");
        }
        // Answered questions no longer wait: room for another; an abandoned one frees its waiters.
        let third = leads.next().unwrap();
        let Turn::Join(slot) = qs.enter("a", "codegen", "q2", LIMITS) else {
            panic!("not collapsed");
        };
        drop(third);
        assert_eq!(slot.wait(), None);
        assert!(matches!(
            qs.enter("a", "codegen", "q4", LIMITS),
            Turn::Ask(_)
        ));
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
