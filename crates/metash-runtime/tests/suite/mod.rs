mod common;
mod flood;
mod lifecycle;
mod native_escape;
mod protocol;
mod runaway;
mod rust_agent;
mod wasm_escape;
