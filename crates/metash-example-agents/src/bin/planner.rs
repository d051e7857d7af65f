//! The example project's planner (see the crate docs).

fn main() -> std::process::ExitCode {
    match metash_example_agents::serve(
        |p: &str, r: Option<&serde_json::Value>, _: &std::path::Path| {
            metash_example_agents::planner(p, r)
        },
    ) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(_) => std::process::ExitCode::FAILURE,
    }
}
