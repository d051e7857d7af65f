mod checkpoints;
mod common;
mod model_role;
mod native_agent;
mod provider;
mod wasm_agent;
