//! One long-lived thread that forks every native agent. `PR_SET_PDEATHSIG` fires when the *thread*
//! that forked the child exits, not the process: spawning from a short-lived thread (a tokio
//! blocking worker, a test thread) would kill the agent when that thread retires. Forking from a
//! thread that lives as long as the process keeps "the host died" as the only trigger.

use std::io;
use std::process::{Child, Command};
use std::sync::mpsc::{self, Sender};
use std::sync::{Mutex, OnceLock};
use std::thread;

type Job = (Command, Sender<io::Result<Child>>);

static SPAWNER: OnceLock<Mutex<Sender<Job>>> = OnceLock::new();

fn spawner() -> io::Result<&'static Mutex<Sender<Job>>> {
    if let Some(s) = SPAWNER.get() {
        return Ok(s);
    }
    let (tx, rx) = mpsc::channel::<Job>();
    thread::Builder::new()
        .name("metash-spawner".into())
        .spawn(move || {
            for (mut cmd, reply) in rx {
                let _ = reply.send(cmd.spawn());
            }
        })?;
    // A racing initializer may win; its thread serves everyone and ours exits when `tx` drops.
    Ok(SPAWNER.get_or_init(|| Mutex::new(tx)))
}

/// Spawn `cmd` from the spawner thread.
///
/// # Errors
/// The spawn failed (including a sandbox step failing in the child), or the spawner is gone.
pub fn spawn(cmd: Command) -> io::Result<Child> {
    let (reply_tx, reply_rx) = mpsc::channel();
    {
        let guard = spawner()?
            .lock()
            .map_err(|_| io::Error::other("spawner lock poisoned"))?;
        guard
            .send((cmd, reply_tx))
            .map_err(|_| io::Error::other("spawner thread is gone"))?;
    }
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("spawner thread is gone"))?
}
