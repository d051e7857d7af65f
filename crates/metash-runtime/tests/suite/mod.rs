mod common;
mod flood;
mod lifecycle;
mod native_escape;
mod protocol;
mod rust_agent;
mod runaway;
mod wasm_escape;
