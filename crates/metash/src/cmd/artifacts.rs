//! `metash artifacts list|show|gc`: the files agents announced, kept in `.meta/artifacts/` under
//! the retention policy of `[artifacts]` in config.toml.

use std::io::Write;
use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::{bail, Result};
use clap::Subcommand;
use metash_host::config::HostConfig;
use metash_store::Store;

use super::Ctx;

#[derive(Debug, Subcommand)]
pub enum ArtifactsCmd {
    /// List the artifacts kept, oldest first (id, bytes, age).
    List {},
    /// Show one artifact's metadata, or with `--content` its bytes.
    Show {
        /// The artifact's id (as the agent announced it).
        id: String,
        /// Write the artifact's bytes to stdout instead.
        #[arg(long)]
        content: bool,
    },
    /// Apply the retention policy of `[artifacts]` in config.toml now.
    Gc {},
}

pub fn run(ctx: &Ctx, cmd: ArtifactsCmd) -> Result<ExitCode> {
    let store = Store::open(&ctx.workspace)?;
    let artifacts = store.artifacts();
    match cmd {
        ArtifactsCmd::List {} => {
            let list = artifacts.list()?;
            if ctx.json {
                println!("{}", serde_json::to_string(&list)?);
            } else if list.is_empty() {
                println!("no artifacts");
            } else {
                let now = unix_now();
                for a in &list {
                    let age = now.saturating_sub(a.modified_unix);
                    println!("{:<32} {:>10} bytes  {}", a.id, a.bytes, ago(age));
                }
            }
        }
        ArtifactsCmd::Show { id, content } => {
            let Some(a) = artifacts.list()?.into_iter().find(|a| a.id == id) else {
                bail!("no artifact `{id}` (see `metash artifacts list`)");
            };
            if content {
                std::io::stdout()
                    .lock()
                    .write_all(&std::fs::read(&a.path)?)?;
            } else if ctx.json {
                println!("{}", serde_json::to_string(&a)?);
            } else {
                println!(
                    "{}\n  {} bytes, {}\n  {}",
                    a.id,
                    a.bytes,
                    ago(unix_now().saturating_sub(a.modified_unix)),
                    a.path.display()
                );
            }
        }
        ArtifactsCmd::Gc {} => {
            let policy = HostConfig::load(&ctx.workspace)?.artifacts.retention();
            print_gc(&artifacts.gc(policy, SystemTime::now())?, ctx.json)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What a collection removed and kept, as text or JSON (`metash gc` prints the same).
pub(super) fn print_gc(report: &metash_store::GcReport, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        println!(
            "removed {} artifacts ({} bytes); kept {} ({} bytes)",
            report.removed.len(),
            report.removed_bytes,
            report.kept,
            report.kept_bytes
        );
    }
    Ok(())
}

/// `metash gc`'s report: the artifacts' as [`print_gc`] prints it, then the tapes' (in JSON,
/// under `tapes`).
pub(super) fn print_gc_with_tapes(
    report: &metash_store::GcReport,
    tapes: &metash_store::GcReport,
    json: bool,
) -> Result<()> {
    if json {
        let mut v = serde_json::to_value(report)?;
        v["tapes"] = serde_json::to_value(tapes)?;
        println!("{v}");
        return Ok(());
    }
    print_gc(report, false)?;
    println!(
        "removed {} tapes ({} bytes); kept {} ({} bytes)",
        tapes.removed.len(),
        tapes.removed_bytes,
        tapes.kept,
        tapes.kept_bytes
    );
    Ok(())
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `12 s ago`, `5 min ago`, `3 h ago`, `2 d ago`.
fn ago(secs: u64) -> String {
    match secs {
        0..=119 => format!("{secs} s ago"),
        120..=7_199 => format!("{} min ago", secs / 60),
        7_200..=172_799 => format!("{} h ago", secs / 3_600),
        _ => format!("{} d ago", secs / 86_400),
    }
}
