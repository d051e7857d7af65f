mod checkpoints;
mod common;
mod consent;
mod model_role;
mod native_agent;
mod progress;
mod provider;
mod wasm_agent;
