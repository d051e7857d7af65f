//! `metash git trust|check`: the repository's executable git configuration (filters, diff and
//! merge drivers, fsmonitor, hooks, ...) that metash checks before every git operation
//! (docs/orchestrator.md, "Git trust"). `check` says whether it changed since a person last
//! accepted it; `trust` shows each change and, once the person accepts, records it.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use metash_orchestrator::git::trust::{self, printable, Review};
use metash_protocol::LogKind;
use metash_store::Store;

use super::Ctx;
use crate::exit::Exit;

#[derive(Debug, Subcommand)]
pub enum GitCommand {
    /// The repository's executable git configuration, which metash checks before it runs git.
    Git {
        #[command(subcommand)]
        cmd: GitCmd,
    },
}

#[derive(Debug, Subcommand)]
pub enum GitCmd {
    /// Show what changed in the executable git configuration since metash last checked it and,
    /// once you accept, record it as trusted (`metash run` refuses until then).
    Trust {
        /// Accept without asking.
        #[arg(long)]
        yes: bool,
    },
    /// Exit 1 when the executable git configuration differs from the trusted record, listing
    /// each change.
    Check {},
}

pub fn run(cmd: GitCommand, ctx: &Ctx) -> Result<ExitCode> {
    let GitCommand::Git { cmd } = cmd;
    let store = Store::open(&ctx.workspace)
        .with_context(|| format!("opening the project at {}", ctx.workspace.display()))?;
    let Some(review) = trust::review(store.workspace())? else {
        bail!(
            "{} is not in a git repository: there is no git configuration to check",
            store.workspace().display()
        );
    };
    match cmd {
        GitCmd::Check {} => check(ctx, &store, &review),
        GitCmd::Trust { yes } => accept(ctx, &store, &review, yes),
    }
}

fn check(ctx: &Ctx, store: &Store, review: &Review) -> Result<ExitCode> {
    let changed = review.trusted.is_none() || !review.changes.is_empty();
    if ctx.json {
        print_json(
            store,
            &serde_json::json!({
                "changed": changed,
                "recorded": review.trusted.is_some(),
                "changes": review.changes,
                "warnings": review.warnings,
            }),
        )?;
    } else {
        print!("{}", shown(store, &describe(review)));
    }
    Ok(if changed {
        Exit::Failure.into()
    } else {
        ExitCode::SUCCESS
    })
}

fn accept(ctx: &Ctx, store: &Store, review: &Review, yes: bool) -> Result<ExitCode> {
    let changed = review.trusted.is_none() || !review.changes.is_empty();
    if !ctx.json {
        print!("{}", shown(store, &describe(review)));
    }
    if changed && !yes && !confirmed(ctx.json)? {
        if ctx.json {
            print_outcome(store, review, false)?;
        } else {
            println!("nothing was recorded");
        }
        return Ok(Exit::Failure.into());
    }
    if changed {
        trust::accept(store.workspace(), review)?;
        store.append(
            LogKind::GitTrust,
            None,
            trust::event("accepted", &review.changes, "user"),
        )?;
    }
    if ctx.json {
        print_outcome(store, review, changed)?;
    } else if changed {
        println!(
            "recorded as trusted in .meta/{}: metash runs git here again",
            trust::TRUST_FILE
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// At a terminal: asks. Elsewhere (or for `--json`) the answer is no: `--yes` says yes.
fn confirmed(json: bool) -> Result<bool> {
    if json || !std::io::stdin().is_terminal() {
        eprintln!("metash: not recorded: rerun with --yes to accept these changes");
        return Ok(false);
    }
    eprint!("accept these as your git configuration, which metash's git may run? [y/N] ");
    std::io::stderr().flush().ok();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes"))
}

fn print_outcome(store: &Store, review: &Review, accepted: bool) -> Result<()> {
    print_json(
        store,
        &serde_json::json!({
            "changes": review.changes,
            "warnings": review.warnings,
            "accepted": accepted,
        }),
    )
}

/// The review for people: each change (old and new value), then the warnings. Values are
/// printable (no escape sequence reaches the terminal).
fn describe(review: &Review) -> String {
    let mut out = String::new();
    match (&review.trusted, review.changes.is_empty()) {
        (Some(_), true) => out.push_str(
            "the repository's executable git configuration is as metash last recorded it\n",
        ),
        (Some(_), false) => out.push_str(
            "the repository's executable git configuration changed since metash last recorded \
             it:\n",
        ),
        (None, _) => out.push_str(
            "metash has no record of this repository's executable git configuration yet; it is:\n",
        ),
    }
    for c in &review.changes {
        out.push_str(&format!("  {c}\n"));
    }
    if review.trusted.is_none() && review.changes.is_empty() {
        out.push_str("  (nothing: no filter, driver, fsmonitor or hook is configured)\n");
    }
    for w in &review.warnings {
        out.push_str(&format!("warning: {}\n", printable(w)));
    }
    out
}

/// Text as it may be printed: a config value can hold a token (a credential helper's argument),
/// so it goes through the project's output redaction.
fn shown(store: &Store, text: &str) -> String {
    let config = metash_host::config::HostConfig::load(store.workspace()).unwrap_or_default();
    metash_host::redaction::output_redactor(store, &config, &|k| std::env::var(k).ok(), [])
        .redact_str(text)
        .into_owned()
}

fn print_json(store: &Store, value: &serde_json::Value) -> Result<()> {
    println!("{}", shown(store, &serde_json::to_string_pretty(value)?));
    Ok(())
}
