mod api_clients;
mod invocation;
mod real_cli;
mod runner;
pub mod support;
