//! `metash context edit | set FILE | show`: the project's owner changes `.meta/context.md`
//! explicitly. Agents never reach it, and a change made behind metash's back is still refused by
//! every command; this is the way to change it on purpose: checked, recorded in the log with both
//! hashes and the diff, refused while a run holds the run lock, and announced to the planner's
//! next request.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use metash_store::{ContextChange, Store};

use super::Ctx;

#[derive(Debug, Subcommand)]
pub enum ContextCommand {
    /// The project's context (.meta/context.md): the vision agents and runs read.
    Context {
        #[command(subcommand)]
        cmd: ContextCmd,
    },
}

#[derive(Debug, Subcommand)]
pub enum ContextCmd {
    /// Open $VISUAL or $EDITOR (else `vi`) on a copy; the saved copy is checked and installed.
    Edit,
    /// Install FILE as the context (`-` reads standard input).
    Set {
        /// The new context.md.
        file: PathBuf,
    },
    /// Print the context as recorded.
    Show,
}

pub fn run(cmd: ContextCommand, ctx: &Ctx) -> Result<ExitCode> {
    let ContextCommand::Context { cmd } = cmd;
    let store = Store::open(&ctx.workspace)?;
    match cmd {
        ContextCmd::Show => {
            print!("{}", store.context()?);
            Ok(ExitCode::SUCCESS)
        }
        ContextCmd::Set { file } => {
            let text = read_input(&file)?;
            install(&store, &text, ctx)
        }
        ContextCmd::Edit => {
            let text = edit(&store.context()?)?;
            install(&store, &text, ctx)
        }
    }
}

fn read_input(file: &Path) -> Result<String> {
    if file == Path::new("-") {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("reading the context from standard input")?;
        return Ok(text);
    }
    std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))
}

/// Checks `text` and installs it, printing what changed.
fn install(store: &Store, text: &str, ctx: &Ctx) -> Result<ExitCode> {
    if text.trim().is_empty() {
        bail!("the new context is empty; nothing was changed");
    }
    let change = store.set_context(text)?;
    let left = metash_store::placeholders_in(text);
    if ctx.json {
        let v = serde_json::json!({
            "changed": change.old_sha256 != change.new_sha256,
            "old_sha256": change.old_sha256,
            "new_sha256": change.new_sha256,
            "diff": change.diff,
            "placeholders": left,
        });
        println!("{v}");
        return Ok(ExitCode::SUCCESS);
    }
    report(&change, &left);
    Ok(ExitCode::SUCCESS)
}

fn report(change: &ContextChange, left: &[&str]) {
    if change.old_sha256 == change.new_sha256 {
        println!("context unchanged");
        return;
    }
    let changed = change
        .diff
        .lines()
        .filter(|l| l.starts_with('+') || l.starts_with('-'))
        .count();
    println!(
        "context changed ({changed} lines; sha256 {} -> {}); recorded in the log, and the planner's \
         next request says so",
        &change.old_sha256[..12],
        &change.new_sha256[..12]
    );
    if !left.is_empty() {
        println!(
            "still from the template: {} (`metash run` stops until they are filled in)",
            left.join(", ")
        );
    }
}

/// Runs the user's editor on a temporary copy of `current`; the saved text.
fn edit(current: &str) -> Result<String> {
    let dir = tempfile::tempdir().context("a temporary directory for the copy")?;
    let path = dir.path().join("context.md");
    std::fs::write(&path, current).with_context(|| format!("writing {}", path.display()))?;
    let editor = ["VISUAL", "EDITOR"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()))
        .unwrap_or_else(|| "vi".to_string());
    // `$EDITOR` may carry arguments (`code --wait`): split on whitespace, no shell.
    let mut words = editor.split_whitespace();
    let program = words.next().unwrap_or("vi");
    let status = std::process::Command::new(program)
        .args(words)
        .arg(&path)
        .status()
        .with_context(|| format!("starting the editor `{editor}`"))?;
    if !status.success() {
        bail!("the editor `{editor}` failed ({status}); nothing was changed");
    }
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}
