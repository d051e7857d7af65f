//! The example project's verifier (see the crate docs).

fn main() -> std::process::ExitCode {
    match metash_example_agents::serve(metash_example_agents::verifier) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(_) => std::process::ExitCode::FAILURE,
    }
}
