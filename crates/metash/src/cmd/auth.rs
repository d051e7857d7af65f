//! `metash auth login | list | logout`: a person's logins to OAuth providers (seed 002 §6),
//! kept in the vault (`$XDG_CONFIG_HOME/metash/vault.json`) under a key from the OS keychain or
//! a passphrase (`METASH_VAULT_PASSPHRASE`, or asked at a terminal). Agents never see these
//! tokens. See docs/auth.md.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Subcommand;
use metash_auth::broker::Login;
use metash_auth::flow::Opener;
use metash_auth::{AuthError, Broker, KeyOptions, Secret};
use serde_json::json;

use super::Ctx;

#[derive(Debug, Subcommand)]
pub enum AuthCommand {
    /// OAuth logins kept in the vault: login, list, logout.
    Auth {
        #[command(subcommand)]
        cmd: AuthCmd,
    },
}

#[derive(Debug, Subcommand)]
pub enum AuthCmd {
    /// Log in to PROVIDER ([oauth.providers.PROVIDER] in .meta/config.toml): authorization code
    /// with PKCE through a loopback redirect (the browser is opened, the URL printed), or the
    /// device flow (a code to enter on another device).
    Login {
        /// The provider's name in .meta/config.toml.
        provider: String,
        /// Scopes to ask for, comma-separated (default: the provider's `scopes`).
        #[arg(long, value_delimiter = ',')]
        scopes: Option<Vec<String>>,
        /// The device flow.
        #[arg(long)]
        device: bool,
        /// Print the URL only; do not open a browser ($BROWSER, else the desktop's opener).
        #[arg(long)]
        no_browser: bool,
    },
    /// The logins kept (never a token).
    List,
    /// Revoke the login at the provider (RFC 7009), then forget it.
    Logout {
        /// The provider's name in .meta/config.toml.
        provider: String,
    },
}

fn vault_path() -> Result<PathBuf> {
    let home =
        super::host::config_home().context("no config directory: set XDG_CONFIG_HOME or HOME")?;
    Ok(metash_auth::Vault::default_path(&home))
}

/// The key options from the environment; at a terminal, a passphrase asked when the vault needs
/// one and none was given.
fn broker(ctx: &Ctx) -> Result<Broker> {
    let mut keys = KeyOptions::from_env(|v| std::env::var(v).ok());
    let path = vault_path()?;
    if keys.passphrase.is_none() && std::io::stdin().is_terminal() {
        if let Err(AuthError::NoKey(why)) = metash_auth::Vault::open(&path, &keys) {
            eprintln!("metash: {why}");
            keys.passphrase = Some(ask_passphrase()?);
        }
    }
    Ok(Broker::new(&ctx.workspace, &path, keys)?)
}

/// Reads a passphrase from the terminal without echoing it.
fn ask_passphrase() -> Result<Secret> {
    eprint!("vault passphrase: ");
    #[cfg(unix)]
    let restore = echo_off();
    let mut line = String::new();
    let read = std::io::stdin().read_line(&mut line);
    #[cfg(unix)]
    restore();
    eprintln!();
    read.context("reading the passphrase")?;
    let p = line.trim_end_matches(['\n', '\r']).to_string();
    anyhow::ensure!(!p.is_empty(), "an empty passphrase seals nothing");
    Ok(Secret::new(p))
}

/// Turns the terminal's echo off; the returned closure turns it back on.
#[cfg(unix)]
fn echo_off() -> impl FnOnce() {
    // SAFETY: termios calls on stdin with a zeroed struct the call fills.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::tcgetattr(0, &mut t) } == 0;
    let saved = t;
    if ok {
        t.c_lflag &= !libc::ECHO;
        // SAFETY: as above, with the struct tcgetattr filled.
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &t) };
    }
    move || {
        if ok {
            // SAFETY: restores what tcgetattr read.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, &saved) };
        }
    }
}

pub fn run(cmd: AuthCommand, ctx: &Ctx) -> Result<ExitCode> {
    let AuthCommand::Auth { cmd } = cmd;
    let broker = broker(ctx)?;
    match cmd {
        AuthCmd::Login {
            provider,
            scopes,
            device,
            no_browser,
        } => {
            let how = Login {
                scopes,
                device,
                opener: Opener {
                    open_browser: !no_browser,
                    browser: std::env::var("BROWSER").ok(),
                    say: Box::new(|s| eprintln!("metash: {s}")),
                },
            };
            let info = broker.login(&provider, &how)?;
            if ctx.json {
                println!("{}", json!(info));
            } else {
                println!(
                    "logged in to {provider} ({}; scopes: {})",
                    info.flow,
                    info.scopes.join(" ")
                );
            }
        }
        AuthCmd::List => {
            let all = broker.list()?;
            if ctx.json {
                println!("{}", json!(all));
            } else if all.is_empty() {
                println!("no login kept");
            } else {
                for i in all {
                    println!(
                        "{}  scopes: {}  expires: {}  {}",
                        i.provider,
                        i.scopes.join(" "),
                        i.expires_at.as_deref().unwrap_or("-"),
                        if i.refreshable {
                            "refreshable"
                        } else {
                            "not refreshable"
                        }
                    );
                }
            }
        }
        AuthCmd::Logout { provider } => {
            let out = broker.logout(&provider)?;
            if ctx.json {
                println!("{}", json!(out));
            } else if !out.was_logged_in {
                println!("not logged in to {provider}");
            } else if out.revoked_at_provider {
                println!("logged out of {provider}: revoked at the provider, and forgotten");
            } else {
                println!("logged out of {provider}: forgotten (the provider has no revocation endpoint; revoke it there)");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
