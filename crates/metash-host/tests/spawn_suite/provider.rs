//! Scripted replies in order over the shared loopback Anthropic server (`metash-testkit`).

use std::time::Duration;

use metash_testkit::anthropic::{sse_text_with, ModelServer};
use serde_json::Value;

#[derive(Clone)]
pub enum Reply {
    /// Streams `text` with this usage and stop reason.
    Text {
        text: String,
        input_tokens: u64,
        output_tokens: u64,
        stop: &'static str,
    },
    /// Waits this long before answering.
    Slow(Duration),
}

impl Reply {
    pub fn text(t: &str) -> Self {
        Self::Text {
            text: t.into(),
            input_tokens: 11,
            output_tokens: 7,
            stop: "end_turn",
        }
    }
}

pub struct Provider {
    pub base_url: String,
    server: ModelServer,
}

impl Provider {
    /// Serves `replies` in order (the last one repeats).
    pub fn start(replies: Vec<Reply>) -> Self {
        let served = std::sync::atomic::AtomicUsize::new(0);
        let server = ModelServer::start(move |_| {
            let n = served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            match replies[n.min(replies.len() - 1)].clone() {
                Reply::Slow(d) => {
                    std::thread::sleep(d);
                    sse_text_with("too late", 1, 1, "end_turn")
                }
                Reply::Text {
                    text,
                    input_tokens,
                    output_tokens,
                    stop,
                } => sse_text_with(&text, input_tokens, output_tokens, stop),
            }
        });
        Self {
            base_url: server.base.clone(),
            server,
        }
    }

    /// The JSON bodies of the model requests, in order.
    pub fn bodies(&self) -> Vec<Value> {
        self.server.posts().iter().map(|c| c.json()).collect()
    }
}
