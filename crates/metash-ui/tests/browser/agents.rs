//! What the browser test does to its project besides writing records: real native agents run
//! under metash's sandbox (the `showcase` example of `metash-agent`, whose questions wait for
//! the page), a task with a change in its git worktree, a flood of output.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use metash_host::SpawnRequest;
use metash_host::{Host, HostOptions, Spawner, Terminal};
use metash_protocol::{AgentResponse, LogKind};
use metash_store::Store;
use serde_json::json;

use super::common::{git, paced};

/// Registers `name` as a native agent running `exe`.
pub fn register(root: &Path, name: &str, exe: &Path, caps: &[&str], hints: &[&str]) {
    let dir = root.join(".meta/agents").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let q = |v: &[&str]| {
        v.iter()
            .map(|c| format!("{c:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    std::fs::write(
        dir.join("manifest.toml"),
        format!(
            "schema_version = \"0.1\"\nname = \"{name}\"\nversion = \"0.1.0\"\nentry = {exe:?}\n\
             sandbox = \"native\"\ncapabilities = [{}]\nresources.mem = \"256Mi\"\n\
             ui.hints = [{}]\n",
            q(caps),
            q(hints)
        ),
    )
    .unwrap();
}

fn policy(root: &Path) -> metash_policy::Policy {
    let registry = metash_policy::Registry::discover(&metash_policy::AgentDirs::new(root, None));
    metash_policy::Policy::new(Store::open(root).unwrap(), registry)
}

/// Grants `cap` to `agent` for ten minutes, as a person would before the run.
pub fn grant(root: &Path, agent: &str, cap: &str) {
    policy(root)
        .grant(agent, &cap.parse().unwrap(), 600, false, "test")
        .unwrap();
}

/// Spawns `agent` with `prompt` on a thread, in a host whose unanswered questions wait (60 s)
/// for any client: the page answers them.
pub fn spawn(root: &Path, agent: &str, prompt: &str) -> JoinHandle<AgentResponse> {
    std::fs::write(
        root.join(".meta/config.toml"),
        "[host]\nconsent_wait_seconds = 60\n",
    )
    .unwrap();
    let (root, agent, prompt) = (root.to_path_buf(), agent.to_string(), prompt.to_string());
    std::thread::spawn(move || {
        let host = Host::open(
            &root,
            HostOptions {
                terminal: Terminal::Silent,
                ..HostOptions::default()
            },
        )
        .unwrap();
        host.spawn_agent(&SpawnRequest::new(&agent, "", &prompt))
            .unwrap()
    })
}

/// Task `api` at work: the project is a repository, the task's worktree (made as the loop makes
/// it) holds an uncommitted change, and the book says where its attempt started.
pub fn task_at_work(root: &Path, store: &Store) -> PathBuf {
    git(root, &["init", "-q", "-b", "main"]);
    std::fs::write(root.join(".gitignore"), ".meta/\n").unwrap();
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(
        root.join("src/api.rs"),
        "pub fn routes() -> Vec<&'static str> {\n    vec![\"/health\"]\n}\n",
    )
    .unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-q", "-m", "base"]);
    let head = git(root, &["rev-parse", "HEAD"]);
    let wt = root.join(".meta/worktrees/api");
    let wt_s = wt.to_string_lossy().to_string();
    git(
        root,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "metash/task/api",
            &wt_s,
            "HEAD",
        ],
    );
    std::fs::write(
        wt.join("src/api.rs"),
        "pub fn routes() -> Vec<&'static str> {\n    vec![\"/health\", \"/users\"]\n}\n\n\
         pub fn users() -> &'static str {\n    \"<b>users</b>\"\n}\n",
    )
    .unwrap();
    store
        .update_state(
            "variables.metash.running.api",
            json!({"attempt": 1, "head": head, "since": metash_store::log::now()}),
        )
        .unwrap();
    wt
}

/// `n` output chunks of agent `flood`, numbered `#i;`, about 1,000 a second (so a flood of
/// 3,000 spans a few of the test's 1 s streams).
pub fn flood(store: &Store, from: usize, n: usize) {
    paced(n, 1000, |k| {
        let i = from + k;
        store
            .append(
                LogKind::AgentEvent,
                Some("flood"),
                json!({"type": "output", "agent_id": "flood", "chunk_id": format!("f:{i}"),
                       "content_type": "text/plain", "data": format!("#{i};")}),
            )
            .unwrap();
    });
}

/// What the agents test does at each of `agents.mjs`'s steps.
pub struct Steps {
    pub root: PathBuf,
    pub store: Store,
    /// The `showcase` example agent's binary.
    pub showcase: PathBuf,
    pub running: Option<JoinHandle<AgentResponse>>,
}

impl Steps {
    pub fn act(&mut self, step: &str) {
        let (root, store) = (&self.root, &self.store);
        match step {
            "painter" => {
                let caps = ["files.read", "files.write:out", "media.preview", "codegen"];
                register(
                    root,
                    "painter",
                    &self.showcase,
                    &caps,
                    &["streaming", "preview"],
                );
                std::fs::create_dir_all(root.join("out")).unwrap();
                grant(root, "painter", "files.read");
                grant(root, "painter", "files.write:out");
                std::fs::write(root.join("notes.txt"), "the notes\n").unwrap();
                self.running = Some(spawn(root, "painter", "wait notes.txt"));
            }
            "painter-done" => self.painter_done(),
            "sketcher" => {
                let caps = ["files.read", "files.write:out"];
                register(root, "sketcher", &self.showcase, &caps, &["preview"]);
                for cap in caps {
                    grant(root, "sketcher", cap);
                }
                self.running = Some(spawn(root, "sketcher", "draw"));
            }
            "sketcher-done" => {
                let r = self.running.take().unwrap().join().unwrap();
                assert!(r.data.contains("media.preview: refused"), "{}", r.data);
            }
            "diff" => {
                store
                    .update_state(
                        "plan",
                        json!({"currentTaskIdx": 0, "tasks": [
                            {"id": "api", "title": "REST endpoints", "status": "pending"}]}),
                    )
                    .unwrap();
                task_at_work(root, store);
            }
            "commented" => {
                let c = metash_orchestrator::review::waiting(store, "api").unwrap();
                assert_eq!(c.len(), 1, "{c:?}");
                assert_eq!((c[0].file.as_str(), c[0].line), ("src/api.rs", 2));
                assert_eq!(c[0].text, "use a constant for the paths");
            }
            "flood" => flood(store, 0, 3000),
            other => panic!("unknown step {other}"),
        }
    }

    /// The painter went on after each answer and was told of each denial; each question was
    /// answered once, from the page.
    fn painter_done(&mut self) {
        let r = self.running.take().unwrap().join().unwrap();
        assert_eq!(r.status, metash_protocol::AgentStatus::Success, "{r:?}");
        for said in [
            "media.preview: granted",
            "codegen: refused consent_denied",
            "read before: the notes",
            "read after: refused",
        ] {
            assert!(r.data.contains(said), "{said}: {}", r.data);
        }
        let answers: Vec<_> = super::common::replies(&self.store)
            .iter()
            .map(|r| r.data["answer"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            answers,
            ["allow_once", "deny", "deny", "allow_for", "deny"],
            "native, media.preview, codegen at the spawn, then the agent's own media.preview and \
             codegen: each answered once, from the page"
        );
    }
}
