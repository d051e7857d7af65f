mod common;
mod model_role;
mod native_agent;
mod wasm_agent;
mod checkpoints;
