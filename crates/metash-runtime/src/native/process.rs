//! A running native agent (Linux): spawned through the prepared [`Sandbox`], fed on stdin, read
//! by a reader thread, stopped by process group and cgroup.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use metash_protocol::LogKind;

use metash_protocol::AgentEvent;
use serde_json::{json, Value};

use super::{cgroup, procs, spawner, ChildIo, Sandbox, Spawned};

use crate::codec;
use crate::error::{io_err, Result, RuntimeError};
use crate::invocation::{InvocationStatus, Outcome, Step, Tracker};
use crate::pump::{pump, Msg, PumpCfg};
use crate::reply::Replier;
use crate::sink::EventSink;
use crate::spec::AgentSpec;
use crate::stream::TokenBucket;

/// How long, after killing, we wait for the group to disappear and the pipes to close.
const REAP_WITHIN: Duration = Duration::from_millis(200);
const STDERR_TAIL: usize = 64 * 1024;
/// SIGTERM-to-SIGKILL window after a deadline: the deadline is the limit, so it is short.
const TIMEOUT_GRACE: Duration = Duration::from_millis(50);

/// A running native agent.
pub struct NativeProcess {
    agent: String,
    /// The agent's mount namespace, when its grants can be withdrawn mid-run.
    mount_ns: Option<Arc<super::mountns::MountNs>>,
    child: Spawned,
    pgid: i32,
    input: Option<SyncSender<Vec<u8>>>,
    /// The same stdin, shared with the host (replies) and the sandbox (gate denials).
    replier: Replier,
    rx: Receiver<Msg>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    /// The thread keeping `stderr`: done once the agent (and anything it left) closed stderr.
    stderr_reader: Option<thread::JoinHandle<()>>,
    sandbox: Sandbox,
    exit: Option<ExitStatus>,
    /// Limits already logged as hit (each is logged once).
    reported: Vec<&'static str>,
    /// What was applied, for the `agent_started` event.
    pub report: Value,
}

/// A failed spawn: the child's own message names the failed step; with an exec gate, the
/// supervisor may know more. Either way the agent did not run (fail-closed).
fn sandbox_err(e: std::io::Error, sandbox: &Sandbox) -> RuntimeError {
    match sandbox.spawn_failure() {
        Some(step) => RuntimeError::SandboxSetup(format!("{step} ({e})")),
        None => RuntimeError::SandboxSetup(format!(
            "spawn failed while applying the sandbox in the child or at exec: {e}"
        )),
    }
}

/// The last `STDERR_TAIL` bytes of the agent's stderr, kept by a thread of its own.
fn keep_stderr_tail(
    id: &str,
    mut err: File,
    tail: Arc<Mutex<VecDeque<u8>>>,
) -> Result<thread::JoinHandle<()>> {
    thread::Builder::new()
        .name(format!("metash-err-{id}"))
        .spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut t) = tail.lock() {
                    t.extend(&buf[..n]);
                    let excess = t.len().saturating_sub(STDERR_TAIL);
                    t.drain(..excess);
                }
            }
        })
        .map_err(io_err("starting the stderr reader"))
}

/// Writes each queued line to the agent's stdin until it closes.
fn feed_stdin(id: &str, mut stdin: File, lines: Receiver<Vec<u8>>) -> Result<()> {
    thread::Builder::new()
        .name(format!("metash-in-{id}"))
        .spawn(move || {
            for chunk in lines {
                if stdin
                    .write_all(&chunk)
                    .and_then(|()| stdin.flush())
                    .is_err()
                {
                    break;
                }
            }
        })
        .map(drop)
        .map_err(io_err("starting the stdin writer"))
}

impl NativeProcess {
    /// Spawn the agent under every restriction and send it `start`.
    ///
    /// # Errors
    /// [`RuntimeError::SandboxSetup`] when any restriction cannot be applied (the agent never
    /// runs), I/O errors otherwise.
    pub fn spawn(
        spec: &AgentSpec,
        sink: &Arc<dyn EventSink>,
        start_line: Vec<u8>,
        replier: &Replier,
    ) -> Result<Self> {
        let sandbox = Sandbox::prepare(spec, sink, replier)?;
        let mut child = sandbox
            .start([ChildIo::Piped; 3])
            .map_err(|e| sandbox_err(e, &sandbox))?;
        let pgid = child.id() as i32;

        let (tx, rx) = mpsc::sync_channel::<Msg>(spec.channel_capacity.max(1));
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| RuntimeError::NotRunning(spec.id.clone()))?;
        let cfg = PumpCfg::new(spec, sink, replier);
        let throttle = spec.throttle;
        thread::Builder::new()
            .name(format!("metash-out-{}", spec.id))
            .spawn(move || {
                let mut bucket = TokenBucket::new(throttle);
                pump(
                    BufReader::with_capacity(64 * 1024, stdout),
                    &cfg,
                    &mut bucket,
                    |m| tx.send(m).is_ok(),
                );
            })
            .map_err(io_err("starting the output reader"))?;
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_reader = match child.stderr.take() {
            Some(err) => Some(keep_stderr_tail(&spec.id, err, Arc::clone(&stderr))?),
            None => None,
        };
        // Writes go through a thread so an agent that never reads stdin cannot block the host.
        let (in_tx, in_rx) = mpsc::sync_channel::<Vec<u8>>(16);
        if let Some(stdin) = child.stdin.take() {
            feed_stdin(&spec.id, stdin, in_rx)?;
        }
        let _ = in_tx.try_send(start_line);
        replier.attach(in_tx.clone());
        // The child has exec'd (spawn returned), so it is in its namespace; if it has already
        // exited there is nothing left to withdraw from.
        let mount_ns = sandbox
            .revocable
            .then(|| super::mountns::MountNs::of_process(pgid).ok().map(Arc::new))
            .flatten();
        let mut report = sandbox.report.clone();
        if let Value::Object(m) = &mut report {
            m.insert("pid".into(), json!(pgid));
        }
        Ok(Self {
            agent: spec.id.clone(),
            mount_ns,
            child,
            pgid,
            input: Some(in_tx),
            replier: replier.clone(),
            rx,
            stderr,
            stderr_reader,
            sandbox,
            exit: None,
            reported: Vec::new(),
            report,
        })
    }

    /// Spawns a command from the long-lived spawner thread (parent-death signal, bounding set)
    /// with std's `fork`: for the spawn benchmark's baseline of that hand-off. A native agent
    /// starts with [`Sandbox::start`] instead.
    ///
    /// # Errors
    /// The spawn failed (a sandbox step in the child included).
    #[doc(hidden)]
    pub fn spawn_command(cmd: std::process::Command) -> std::io::Result<Child> {
        spawner::spawn(cmd)
    }

    /// The agent's mount namespace, when its file grants can be withdrawn while it runs.
    pub fn mount_ns(&self) -> Option<Arc<super::mountns::MountNs>> {
        self.mount_ns.clone()
    }

    /// The agent's pid (= its process group id).
    pub fn pid(&self) -> i32 {
        self.pgid
    }

    fn send(&self, line: Vec<u8>) -> bool {
        self.input.as_ref().is_some_and(|tx| tx.send(line).is_ok())
    }

    /// Close the agent's stdin: ours and the host's handle.
    fn close_stdin(&mut self) {
        self.input = None;
        self.replier.detach();
    }

    fn signal_group(&self, sig: i32) {
        // SAFETY: kill(2) on our child's process group.
        unsafe {
            libc::kill(-self.pgid, sig);
        }
    }

    /// Pause every process of the agent.
    pub fn suspend(&self) {
        self.signal_group(libc::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal_group(libc::SIGCONT);
    }

    fn try_reap(&mut self) -> bool {
        if self.exit.is_some() {
            return true;
        }
        if let Ok(Some(st)) = self.child.try_wait() {
            self.exit = Some(st);
            return true;
        }
        false
    }

    /// Whether nothing of the agent is left: its cgroup empty (a confined process cannot leave it;
    /// cheap to read, so asked first), and no live process of its group. The group is scanned even
    /// with a cgroup: an exiting process leaves its cgroup before it has finished, and the PID
    /// namespace's init finishes last (it reaps the namespace after it left the cgroup).
    fn all_gone(&self) -> bool {
        self.sandbox
            .cgroup
            .as_ref()
            .is_none_or(|cg| cg.pids().is_empty())
            && procs::group_members(self.pgid).is_empty()
    }

    /// SIGTERM the group, wait `grace`, SIGKILL the group and the cgroup, reap. Returns whether the
    /// kill was needed (the leader was still alive after `grace`).
    pub fn terminate(&mut self, grace: Duration) -> bool {
        self.close_stdin();
        self.signal_group(libc::SIGCONT);
        self.signal_group(libc::SIGTERM);
        let start = Instant::now();
        let mut forced = true;
        while start.elapsed() < grace {
            if self.try_reap() && self.all_gone() {
                forced = false;
                break;
            }
            thread::sleep(Duration::from_millis(2));
        }
        self.kill_now();
        forced
    }

    /// SIGKILL everything now and wait (bounded) for it to be gone.
    fn kill_now(&mut self) {
        self.signal_group(libc::SIGKILL);
        if let Some(cg) = &self.sandbox.cgroup {
            cg.kill_all(REAP_WITHIN);
        }
        if self.exit.is_none() {
            if let Ok(st) = self.child.wait() {
                self.exit = Some(st);
            }
        }
        let start = Instant::now();
        while !self.all_gone() && start.elapsed() < REAP_WITHIN {
            self.signal_group(libc::SIGKILL);
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// The last bytes the agent wrote to stderr, once the reader has taken all of it (waiting at
    /// most `within`: a child the agent left behind may hold stderr open).
    pub fn stderr_after_exit(&self, within: Duration) -> String {
        let until = Instant::now() + within;
        while self
            .stderr_reader
            .as_ref()
            .is_some_and(|r| !r.is_finished())
            && Instant::now() < until
        {
            thread::sleep(Duration::from_millis(2));
        }
        self.stderr_tail()
    }

    /// The last bytes the agent wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        self.stderr
            .lock()
            .map(|t| String::from_utf8_lossy(&t.iter().copied().collect::<Vec<u8>>()).to_string())
            .unwrap_or_default()
    }

    /// Send `input` and stream events until the invocation ends.
    ///
    /// # Errors
    /// Protocol encoding errors only; agent failures are statuses.
    pub fn invoke(
        &mut self,
        spec: &AgentSpec,
        sink: &Arc<dyn EventSink>,
        input: AgentEvent,
        interrupt: &Arc<AtomicBool>,
        on_event: &mut dyn FnMut(&AgentEvent),
    ) -> Result<Outcome> {
        let mut tracker = Tracker::new(spec.output_cap);
        if !self.send(codec::encode(input)?) {
            return Ok(tracker.finish(self.exit_status(sink)));
        }
        let deadline = Instant::now() + spec.timeout;
        loop {
            if interrupt.load(Ordering::SeqCst) {
                let forced = self.terminate(spec.shutdown_grace);
                sink.record(
                    LogKind::AgentKilled,
                    Some(&self.agent),
                    json!({"reason": "host asked it to stop while running", "forced": forced}),
                );
                return Ok(tracker.finish(InvocationStatus::Killed {
                    reason: "interrupted".into(),
                }));
            }
            let now = Instant::now();
            if now >= deadline {
                // A timeout gets no grace beyond a short SIGTERM window: the deadline is the limit.
                let forced = self.terminate(spec.shutdown_grace.min(TIMEOUT_GRACE));
                sink.record(
                    LogKind::AgentTimeout,
                    Some(&self.agent),
                    json!({"timeout_ms": spec.timeout.as_millis() as u64, "forced": forced,
                           "via": "killpg+cgroup"}),
                );
                return Ok(tracker.finish(InvocationStatus::Timeout));
            }
            let wait = (deadline - now).min(Duration::from_millis(20));
            let msg = match self.rx.recv_timeout(wait) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => Msg::Eof,
            };
            match tracker.step(msg, on_event) {
                Step::Continue => {}
                Step::End(status) => {
                    self.report_limits(sink);
                    // Past its disk or file quota now: the turn ends on that (the tree is killed).
                    if let Some(hit) = self.sandbox.write_quota_exceeded() {
                        self.terminate(Duration::ZERO);
                        return Ok(tracker.finish(hit.status()));
                    }
                    return Ok(tracker.finish(status));
                }
                Step::OverCap => {
                    self.terminate(Duration::ZERO);
                    sink.record(
                        LogKind::LimitExceeded,
                        Some(&self.agent),
                        json!({"limit": "output_bytes", "max": spec.output_cap}),
                    );
                    return Ok(tracker.finish(InvocationStatus::LimitExceeded {
                        limit: "output_bytes".into(),
                    }));
                }
                Step::Eof => return Ok(tracker.finish(self.exit_status(sink))),
            }
        }
    }

    /// Log quotas the kernel enforced during the invocation (e.g. forks refused by `pids.max`),
    /// once each: the agent survived them, but the log must show them.
    fn report_limits(&mut self, sink: &Arc<dyn EventSink>) {
        for limit in self.limits_hit() {
            if !self.reported.contains(&limit) {
                self.reported.push(limit);
                sink.record(
                    LogKind::LimitExceeded,
                    Some(&self.agent),
                    json!({"limit": limit, "via": "cgroup"}),
                );
            }
        }
    }

    /// After stdout closed: reap (bounded), kill leftovers, and say why it ended.
    fn exit_status(&mut self, sink: &Arc<dyn EventSink>) -> InvocationStatus {
        let start = Instant::now();
        while !self.try_reap() && start.elapsed() < REAP_WITHIN {
            thread::sleep(Duration::from_millis(2));
        }
        self.kill_now();
        if let Some(hit) = self.sandbox.write_quota_exceeded() {
            return hit.status();
        }
        let hit = self
            .sandbox
            .cgroup
            .as_ref()
            .map(cgroup::AgentCgroup::limits_hit)
            .unwrap_or_default();
        let st = self.exit;
        if let Some(limit) = hit.first() {
            sink.record(
                LogKind::LimitExceeded,
                Some(&self.agent),
                json!({"limit": limit, "via": "cgroup", "exit": st.map(|s| s.to_string()),
                       "stderr": self.stderr_tail()}),
            );
            return InvocationStatus::LimitExceeded {
                limit: (*limit).to_string(),
            };
        }
        InvocationStatus::Exited {
            code: st.and_then(|s| s.code()),
            signal: st.and_then(|s| s.signal()),
        }
    }

    /// `shutdown()`: send `shutdown`, close stdin, wait `grace`, then kill. Returns whether it had to
    /// be killed.
    pub fn shutdown(&mut self, grace: Duration) -> bool {
        if let Ok(line) = codec::encode(AgentEvent::Shutdown {
            grace_ms: Some(grace.as_millis() as u64),
        }) {
            let _ = self.send(line);
        }
        self.close_stdin();
        self.signal_group(libc::SIGCONT);
        let start = Instant::now();
        while start.elapsed() < grace {
            if self.try_reap() {
                // The leader is gone; anything it left behind in the group is killed below.
                self.kill_now();
                return false;
            }
            thread::sleep(Duration::from_millis(2));
        }
        self.terminate(Duration::from_millis(50));
        true
    }

    /// Limits the kernel reports as hit so far.
    pub fn limits_hit(&self) -> Vec<&'static str> {
        self.sandbox
            .cgroup
            .as_ref()
            .map(cgroup::AgentCgroup::limits_hit)
            .unwrap_or_default()
    }
}

impl Drop for NativeProcess {
    fn drop(&mut self) {
        if self.exit.is_none() || !self.all_gone() {
            self.kill_now();
        }
    }
}
