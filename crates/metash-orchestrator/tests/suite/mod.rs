mod common;
mod kill;
mod loop_sim;
mod parallel;
mod plans;
mod wasm_example;
