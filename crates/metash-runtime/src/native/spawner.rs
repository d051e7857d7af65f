//! One long-lived thread that forks every native agent. `PR_SET_PDEATHSIG` fires when the *thread*
//! that forked the child exits, not the process: spawning from a short-lived thread (a tokio
//! blocking worker, a test thread) would kill the agent when that thread retires. Forking from a
//! thread that lives as long as the process keeps "the host died" as the only trigger.
//!
//! The thread also empties its own capability bounding set once, when it starts: the bounding set
//! is part of a thread's credentials and a fork inherits it, so every child starts with it empty
//! and its own drop ([`super::privs::drop_bounding_set`]) is only reads. Each drop commits new
//! credentials (~55 µs for all of them by perf tracepoints, though not above the bench's noise),
//! paid here once instead of per spawn.
//! Only this thread's credentials change, and it only ever forks sandboxed agents. A child that
//! enters a user namespace gets a full set there again and empties it itself, as before.
//!
//! And it keeps each child's mount namespace open until the child has exited ([`NsKeeper`]): the
//! last process to leave a mount namespace tears it down in its exit (an expedited RCU grace
//! period, ~90 µs in the bench), before its parent hears of the exit. Held here, the namespace outlives the
//! tree by a moment and is torn down on the keeper's thread instead, off the path to the host's
//! `wait`. Nobody is in it by then; nothing else changes.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;

use super::vspawn::{self, Request, Spawned};

/// A spawn to run on the spawner thread, given the keeper (when it could be started).
type Job = Box<dyn FnOnce(Option<&NsKeeper>) + Send>;

static SPAWNER: OnceLock<Mutex<Sender<Job>>> = OnceLock::new();

fn spawner() -> io::Result<&'static Mutex<Sender<Job>>> {
    if let Some(s) = SPAWNER.get() {
        return Ok(s);
    }
    let (tx, rx) = mpsc::channel::<Job>();
    thread::Builder::new()
        .name("metash-spawner".into())
        .spawn(move || {
            // SAFETY: prctl on this thread's own credentials; nothing else runs here yet.
            unsafe { super::privs::drop_bounding_set() };
            let keeper = NsKeeper::start().ok();
            for job in rx {
                job(keeper.as_ref());
            }
        })?;
    // A racing initializer may win; its thread serves everyone and ours exits when `tx` drops.
    Ok(SPAWNER.get_or_init(|| Mutex::new(tx)))
}

/// Runs `job` on the spawner thread and returns its result.
fn on_spawner<T: Send + 'static>(
    job: impl FnOnce(Option<&NsKeeper>) -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let (reply_tx, reply_rx) = mpsc::channel();
    {
        let guard = spawner()?
            .lock()
            .map_err(|_| io::Error::other("spawner lock poisoned"))?;
        guard
            .send(Box::new(move |keeper| {
                let _ = reply_tx.send(job(keeper));
            }))
            .map_err(|_| io::Error::other("spawner thread is gone"))?;
    }
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("spawner thread is gone"))?
}

/// Spawn `cmd` from the spawner thread.
///
/// # Errors
/// The spawn failed (including a sandbox step failing in the child), or the spawner is gone.
pub fn spawn(mut cmd: Command) -> io::Result<Child> {
    on_spawner(move |keeper| {
        let child = cmd.spawn()?;
        // Before the child is handed out: its pid cannot have been reaped and reused yet.
        // Without a keeper the namespace is let go at once (the tree still holds it).
        if let (Some(k), Some(h)) = (keeper, Held::open(child.id())) {
            k.give(h);
        }
        Ok(child)
    })
}

/// Start a sandboxed agent from the spawner thread without copying the host
/// ([`super::vspawn`]); the keeper unmaps its stacks when its tree is gone.
///
/// # Errors
/// The spawn failed (the failed step's own message), or the spawner is gone.
pub(super) fn spawn_sandboxed(req: Request) -> io::Result<Spawned> {
    on_spawner(move |keeper| {
        let (spawned, tree) = vspawn::spawn(&req)?;
        match (Held::tree(spawned.id(), tree), keeper) {
            (Ok(held), Some(k)) => k.give(held),
            // No keeper thread (it could not be started): the stacks are kept until P has
            // exited, which is only known by waiting, so they are left mapped instead.
            (Ok(held), None) => held.abandon(),
            (Err(stacks), _) => std::mem::forget(stacks),
        }
        Ok(spawned)
    })
}

/// A spawned child's mount namespace, held until its pidfd reports the child gone; for a tree
/// that shares the host's memory, its stacks too, and maybe the child to reap.
struct Held {
    done: OwnedFd,
    _mount_ns: Option<OwnedFd>,
    stacks: Option<vspawn::Stacks>,
    reap: Option<Arc<AtomicBool>>,
}

impl Held {
    /// `None` where the kernel has no pidfd (before 5.3) or the child is already gone: the
    /// namespace then ends with its last process, as it would anyway.
    fn open(pid: u32) -> Option<Self> {
        let pid = libc::pid_t::try_from(pid).ok()?;
        let done = super::fds::pidfd(pid).ok()?;
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt")).ok()?;
        Some(Self {
            done,
            _mount_ns: Some(ns.into()),
            stacks: None,
            reap: None,
        })
    }

    /// A tree started by [`vspawn`], done when P has exited. `Err` (the stacks, to leak) where
    /// no pidfd can be had: nothing would say when they are free.
    fn tree(pid: u32, tree: vspawn::Tree) -> Result<Self, vspawn::Stacks> {
        let Some((pid, done)) = libc::pid_t::try_from(pid)
            .ok()
            .and_then(|p| super::fds::pidfd(p).ok().map(|fd| (p, fd)))
        else {
            return Err(tree.stacks);
        };
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt")).ok();
        Ok(Self {
            done,
            _mount_ns: ns.map(OwnedFd::from),
            stacks: Some(tree.stacks),
            reap: Some(tree.keeper_reaps),
        })
    }

    /// The child has exited: reap it if its handle is gone (see `vspawn::Spawned`'s `Drop`),
    /// through the pidfd (that process, whatever its number has become since).
    fn finish(self) {
        if self.reap.as_ref().is_some_and(|r| r.load(Ordering::SeqCst)) {
            let _ = vspawn::reap_pidfd(self.done.as_raw_fd(), libc::WNOHANG);
        }
    }

    /// Lets go without knowing whether the tree is gone: its stacks are leaked, never unmapped
    /// under a shim that may still run on them.
    fn abandon(mut self) {
        if let Some(s) = self.stacks.take() {
            std::mem::forget(s);
        }
    }
}

/// The thread that lets each held namespace go once its child has exited: it polls the pidfds
/// and a pipe the spawner writes a byte to with each new one.
struct NsKeeper {
    tx: Sender<Held>,
    wake: OwnedFd,
}

impl NsKeeper {
    fn start() -> io::Result<Self> {
        let (read, wake) = super::fds::pipe(0)?;
        let (tx, rx) = mpsc::channel::<Held>();
        thread::Builder::new()
            .name("metash-ns-keeper".into())
            .spawn(move || keep(&read, &rx))?;
        Ok(Self { tx, wake })
    }

    fn give(&self, held: Held) {
        if self.tx.send(held).is_ok() {
            // SAFETY: write(2) of one byte from a static buffer to our pipe.
            unsafe { libc::write(self.wake.as_raw_fd(), b"+".as_ptr().cast(), 1) };
        }
    }
}

/// The keeper's loop: until the spawner is gone (its pipe end closed), wait for a new namespace
/// or a child's exit, and drop the exited ones.
fn keep(wake: &OwnedFd, rx: &Receiver<Held>) {
    let mut held: Vec<Held> = Vec::new();
    loop {
        let mut fds: Vec<libc::pollfd> = std::iter::once(wake.as_raw_fd())
            .chain(held.iter().map(|h| h.done.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: poll(2) on a live array of `fds.len()` entries.
        if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) } < 0 {
            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                // Not a wait that can succeed (too many descriptors?): let them all go now.
                held.drain(..).for_each(Held::abandon);
            }
            continue;
        }
        // Highest first: `swap_remove` moves in an entry already looked at.
        for i in (1..fds.len()).rev() {
            if fds[i].revents != 0 {
                held.swap_remove(i - 1).finish();
            }
        }
        if fds[0].revents != 0 {
            let mut buf = [0u8; 64];
            // SAFETY: read(2) into a stack buffer of its length.
            let n = unsafe { libc::read(wake.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n == 0 {
                held.into_iter().for_each(Held::abandon);
                return;
            }
            held.extend(rx.try_iter());
        }
    }
}
