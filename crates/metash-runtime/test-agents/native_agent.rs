//! The native test agent (see `native_agent_unix.rs`). It exercises the Linux sandbox from the
//! inside (signals, process groups, sockets), so it exists only where Unix does; elsewhere this
//! binary says so, which keeps `cargo check --workspace` working for every target.

#[cfg(unix)]
#[path = "native_agent_unix.rs"]
mod agent;

#[cfg(unix)]
fn main() {
    agent::main();
}

#[cfg(not(unix))]
fn main() {
    eprintln!("metash-test-agent: Unix only");
    std::process::exit(2);
}
