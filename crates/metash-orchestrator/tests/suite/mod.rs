mod common;
mod kill;
mod loop_sim;
mod model_roles;
mod parallel;
mod plans;
mod provider;
mod wasm_example;
