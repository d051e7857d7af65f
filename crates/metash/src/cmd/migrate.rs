//! `metash migrate`: upgrades the project's files written before they carried a version, and
//! changes nothing else. `config.toml` gets `schema_version = 1` as a new line (comments, order
//! and layout kept byte for byte); store documents without their envelope get it; session.json is
//! versioned by opening the store. Log records are never rewritten: each one's hash chains the
//! next, and lines without a version read as version 1. A file newer than this build is an error
//! naming it, and nothing is written. Manifests have their own command, `metash agents migrate`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use metash_host::config::{HostConfig, CONFIG_SCHEMA_VERSION};
use metash_store::Store;
use serde_json::json;

use super::Ctx;

/// One file that was (or would be) upgraded.
struct Upgrade {
    path: PathBuf,
    change: String,
}

pub fn run(ctx: &Ctx, check: bool) -> Result<ExitCode> {
    let mut upgrades = Vec::new();
    let config = ctx.workspace.join(".meta").join("config.toml");
    if let Ok(text) = std::fs::read_to_string(&config) {
        // Refuses a version this build does not read (and any other mistake), naming the line.
        HostConfig::parse(&text, &config)?;
        let line = format!("schema_version = {CONFIG_SCHEMA_VERSION}");
        let m = metash_policy::migrate::add_version_key(
            &config,
            &text,
            &line,
            &format!("added `{line}` (the file predates versioning)"),
        )
        .map_err(|d| anyhow::anyhow!("{d}"))?;
        if let Some(c) = m.changes.first() {
            if !check {
                metash_store::atomic::write_atomic(&config, m.output.as_bytes())
                    .with_context(|| format!("writing {}", config.display()))?;
            }
            upgrades.push(Upgrade {
                path: config.clone(),
                change: format!("line {}: {}", c.line, c.description),
            });
        }
    }
    let store = Store::open(&ctx.workspace)?;
    for path in store.migrate_docs(check)? {
        upgrades.push(Upgrade {
            path,
            change: "wrapped in {\"schema_version\": 1, \"data\": …}".into(),
        });
    }
    if ctx.json {
        let list: Vec<_> = upgrades
            .iter()
            .map(|u| json!({"path": u.path, "change": u.change, "written": !check}))
            .collect();
        println!("{}", serde_json::Value::Array(list));
    } else if upgrades.is_empty() {
        println!(
            "up to date: nothing in {} predates versioning",
            ctx.workspace.display()
        );
    } else {
        let verb = if check { "would upgrade" } else { "upgraded" };
        for u in &upgrades {
            println!("{verb} {}: {}", u.path.display(), u.change);
        }
    }
    Ok(if check && !upgrades.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
