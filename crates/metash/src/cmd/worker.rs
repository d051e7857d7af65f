//! `worker` (and the hidden `worker-task` each task runs in): executor turns queued by a
//! coordinator's `metash run --workers`, run on this machine (docs/scale-out.md).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use metash_orchestrator::worker::{self, WorkerOptions};

use super::host::HostArgs;
use super::Ctx;

#[derive(Debug, Subcommand)]
pub enum WorkerCommand {
    /// Run the tasks a coordinator (`metash run --workers`) queues on this project's PostgreSQL
    /// store, here, up to --slots at once. This workspace is a clone of the project with the same
    /// `.meta/config.toml` (its `[store]`, its roles) and agents.
    Worker(WorkerArgs),
    /// One task, in its own process group (started by `metash worker`).
    #[command(hide = true)]
    WorkerTask {
        /// The worker that leased the task.
        #[arg(long)]
        worker: String,
        #[command(flatten)]
        host: HostArgs,
        /// The task's id in the lease queue.
        qid: String,
        /// Where the result goes (JSON).
        out: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Tasks at once.
    #[arg(long, default_value_t = 1)]
    slots: usize,
    /// What this worker offers (comma-separated); it takes only tasks whose labels it has.
    #[arg(long, value_delimiter = ',')]
    labels: Vec<String>,
    /// This worker's name in leases and records (default: host name and pid).
    #[arg(long)]
    id: Option<String>,
    /// How long a lease lasts without a heartbeat (heartbeats come every third of it).
    #[arg(long, default_value_t = 30.0)]
    lease_seconds: f64,
    /// Stop after this many seconds with nothing to run (default: run until killed).
    #[arg(long)]
    idle_exit_seconds: Option<f64>,
    /// The project's PostgreSQL store (`postgres://USER@HOST:PORT/DB`, no password: that is
    /// METASH_STORE_PASSWORD), instead of `[store] url` in this workspace's config.
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// The project's name on that store, instead of `[store] project`.
    #[arg(long)]
    project: Option<String>,
    #[command(flatten)]
    host: HostArgs,
}

pub fn run(cmd: WorkerCommand, ctx: &Ctx) -> Result<ExitCode> {
    match cmd {
        WorkerCommand::Worker(args) => serve(args, ctx),
        WorkerCommand::WorkerTask {
            worker,
            host,
            qid,
            out,
        } => task(ctx, &host, &worker, &qid, &out),
    }
}

fn seconds(what: &str, s: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("--{what} must be a positive number of seconds, not {s}"))
}

fn serve(args: WorkerArgs, ctx: &Ctx) -> Result<ExitCode> {
    // Set before any thread starts; the tasks' processes inherit them.
    if let Some(url) = &args.store {
        std::env::set_var(metash_store::backend::URL_ENV, url);
    }
    if let Some(project) = &args.project {
        std::env::set_var(metash_store::backend::PROJECT_ENV, project);
    }
    let store = metash_store::Store::open(&ctx.workspace)?;
    let id = args.id.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "worker".into());
        format!("{host}-{}", std::process::id())
    });
    let mut command: Vec<std::ffi::OsString> = vec![
        std::env::current_exe()?.into(),
        "-C".into(),
        ctx.workspace.clone().into(),
        "worker-task".into(),
        "--worker".into(),
        id.clone().into(),
        "--non-interactive".into(),
    ];
    for cap in &args.host.yes_to {
        command.push("--yes-to".into());
        command.push(cap.into());
    }
    if let Some(p) = &args.host.policy {
        command.push("--policy".into());
        command.push(p.clone().into());
    }
    let opts = WorkerOptions {
        id: id.clone(),
        slots: args.slots.max(1),
        labels: args.labels,
        lease: seconds("lease-seconds", args.lease_seconds)?,
        idle_exit: args
            .idle_exit_seconds
            .map(|s| seconds("idle-exit-seconds", s))
            .transpose()?,
        task_command: command,
    };
    eprintln!(
        "metash: worker {id} serving project {} ({} slot(s))",
        store.server_project().unwrap_or("?"),
        opts.slots
    );
    let report = worker::serve(&store, &opts, &AtomicBool::new(false))?;
    eprintln!(
        "metash: worker {id} stops: {} task(s) completed, {} refused (stale lease), {} stopped (lease lost)",
        report.completed, report.refused, report.lost
    );
    if ctx.json {
        println!(
            "{}",
            serde_json::json!({"worker": id, "completed": report.completed,
                               "refused": report.refused, "lost": report.lost})
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn task(
    ctx: &Ctx,
    host: &HostArgs,
    worker: &str,
    qid: &str,
    out: &std::path::Path,
) -> Result<ExitCode> {
    let host = host.open(ctx)?;
    let result = match worker::run_task(&host, qid, worker) {
        Ok(r) => r,
        Err(e) => worker::error_result(worker, &format!("{e:#}")),
    };
    metash_store::atomic::write_atomic(out, serde_json::to_string(&result)?.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}
