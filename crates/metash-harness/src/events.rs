//! The turn's event stream in seed 003's envelope: one emitter per turn owns the gapless `seq`
//! and stamps `continuation` on every event from the moment a key is first observed.

use metash_protocol::{
    BaseEvent, HarnessContinuationRef, HarnessEvent, HarnessEventEnvelope, ProviderDomain,
};

/// Where events go; the host logs them to the store first, then fans them out.
pub type EventSink<'a> = &'a mut (dyn FnMut(HarnessEventEnvelope) + Send);

pub struct Emitter<'a> {
    cp_session_id: String,
    run_id: String,
    seq: u64,
    provider: ProviderDomain,
    continuation: Option<HarnessContinuationRef>,
    sink: EventSink<'a>,
}

impl<'a> Emitter<'a> {
    pub fn new(
        cp_session_id: &str,
        run_id: &str,
        provider: ProviderDomain,
        sink: EventSink<'a>,
    ) -> Self {
        Self {
            cp_session_id: cp_session_id.to_string(),
            run_id: run_id.to_string(),
            seq: 0,
            provider,
            continuation: None,
            sink,
        }
    }

    pub fn emit(&mut self, payload: HarnessEvent) {
        self.seq += 1;
        let ev = BaseEvent {
            ts: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            seq: self.seq,
            cp_session_id: self.cp_session_id.clone(),
            run_id: self.run_id.clone(),
            continuation: self.continuation.clone(),
            payload: Some(payload),
        };
        (self.sink)(ev);
    }

    /// Records the key; emits `continuation_observed` the first time (and if it ever changes).
    pub fn observe_key(&mut self, key: &str) {
        if self.continuation.as_ref().and_then(|c| c.key.as_deref()) == Some(key) {
            return;
        }
        self.continuation = Some(HarnessContinuationRef {
            provider: self.provider,
            key: Some(key.to_string()),
        });
        self.emit(HarnessEvent::ContinuationObserved {
            key: key.to_string(),
        });
    }

    pub fn continuation(&self) -> Option<HarnessContinuationRef> {
        self.continuation.clone()
    }
}
