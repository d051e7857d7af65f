mod api_clients;
mod fake_cli;
mod invocation;
mod real_cli;
mod runner;
mod sse_props;
pub mod support;
mod test_frontend;
