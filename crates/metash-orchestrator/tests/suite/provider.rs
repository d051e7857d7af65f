//! The loopback model server (`metash-testkit`), answering each request by a closure over its
//! JSON body (so a test scripts the planner, executor and verifier by what they were asked).

use metash_testkit::anthropic::{sse_text_with, ModelServer};
use serde_json::Value;

pub struct Provider {
    pub base_url: String,
    server: ModelServer,
}

impl Provider {
    pub fn start(script: impl Fn(&Value) -> String + Send + Sync + 'static) -> Self {
        // 20 input + 10 output tokens per turn, as the budget assertions expect.
        let server =
            ModelServer::start(move |c| sse_text_with(&script(&c.json()), 20, 10, "end_turn"));
        Self {
            base_url: server.base.clone(),
            server,
        }
    }

    pub fn bodies(&self) -> Vec<Value> {
        self.server.posts().iter().map(|c| c.json()).collect()
    }
}
