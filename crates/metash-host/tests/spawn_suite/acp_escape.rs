//! Issue 34: the escape probes of the coding-CLI tests (`cli_sandbox`), from inside a real ACP
//! agent's tool calls. Each agent (claude-code-acp, codex-acp) runs one turn as a
//! `frontend = "acp"` role whose loopback model asks for the probes one shell call at a time: the
//! work succeeds; a file outside the project, `../`, a write outside, `~/.ssh`, the host's
//! environment and memory, listening, connecting to a host port or Unix socket, `.meta/` are all
//! denied. Then the same escapes through ACP's own file methods (`fs/read_text_file`,
//! `fs/write_text_file`, which metash serves outside the sandbox, `acp_fs.rs`) by
//! claude-code-acp's file tools: every one refused, the one write inside landed, the secret in
//! no request and no file.

use std::path::{Path, PathBuf};

use metash_host::{SpawnRequest, Spawner};
use metash_protocol::AgentStatus;
use metash_testkit::acp::AcpAgent;
use metash_testkit::anthropic::{sse_text, sse_tool_use, ModelServer};
use serde_json::json;

use super::cli_sandbox::{check_probes, cli_host, Outside};
use super::common::Project;

const SECRET: &str = "ACP-FS-SECRET-5e1d";

/// The agent at its install path, or a skip (a failure under CI) saying why it cannot run here.
fn ready(agent: AcpAgent, test: &str) -> Option<PathBuf> {
    let bin = agent.installed(test)?;
    if let Some(why) = super::common::native_unavailable() {
        metash_testkit::skip(test, &why);
        return None;
    }
    Some(bin)
}

fn shell_probes(agent: AcpAgent, test: &str) {
    let Some(bin) = ready(agent, test) else {
        return;
    };
    let cli = agent.wire();
    let p = Project::new();
    let outside = Outside::new();
    let probes = outside.probes(p.path());
    let commands: Vec<String> = probes.iter().map(|(_, c, _)| c.clone()).collect();
    let server = ModelServer::start(move |c| {
        let body = c.text();
        if !body.contains("Do the probes.") {
            return cli.text("ok");
        }
        let done = cli.results(&body);
        match commands.get(done) {
            Some(cmd) => cli.shell(done, &body, cmd),
            None => cli.text("all probes ran"),
        }
    });
    p.config(&agent.role("coder", &bin, &server.base));
    let host = cli_host(&p);
    let mut req = SpawnRequest::new("coder", "You are a test.", "Do the probes.");
    req.options.timeout_seconds = Some(300.0);
    let r = host.spawn_agent(&req).expect("spawn");
    assert_eq!(r.status, AgentStatus::Success, "{}: {r:?}", agent.name());
    assert!(r.data.contains("all probes ran"), "{}", r.data);
    assert!(p
        .log_data("agent_started")
        .iter()
        .any(|s| s["frontend"] == "acp"));
    check_probes(&p, &outside, &probes);
}

#[test]
fn acp_claude_code_shell_works_in_its_workspace_and_every_escape_is_denied() {
    shell_probes(
        AcpAgent::ClaudeCode,
        "acp_claude_code_shell_works_in_its_workspace_and_every_escape_is_denied",
    );
}

#[test]
fn acp_codex_shell_works_in_its_workspace_and_every_escape_is_denied() {
    shell_probes(
        AcpAgent::Codex,
        "acp_codex_shell_works_in_its_workspace_and_every_escape_is_denied",
    );
}

/// What the file probes aim at, outside the worktree and in its metadata.
struct Targets {
    _dir: tempfile::TempDir,
    secret: PathBuf,
    parent_file: PathBuf,
    write_outside: PathBuf,
    ssh: PathBuf,
}

impl Targets {
    fn new(ws: &Path) -> Self {
        let dir = tempfile::tempdir().expect("outside");
        let root = dir.path().canonicalize().expect("outside");
        let secret = root.join("secret.txt");
        std::fs::write(&secret, SECRET).expect("secret");
        let parent_file = ws
            .parent()
            .expect("parent")
            .join(format!("metash-acp-parent-{}.txt", std::process::id()));
        std::fs::write(&parent_file, SECRET).expect("parent file");
        // A stand-in for `~/.ssh` (the real one is not touched): a key file outside the project.
        let ssh = root.join(".ssh/id_ed25519");
        std::fs::create_dir_all(root.join(".ssh")).expect("ssh");
        std::fs::write(&ssh, SECRET).expect("ssh key");
        // A link inside the worktree to the secret outside.
        std::os::unix::fs::symlink(&secret, ws.join("link-out.txt")).expect("symlink");
        Self {
            write_outside: root.join("written-through-acp.txt"),
            _dir: dir,
            secret,
            parent_file,
            ssh,
        }
    }

    /// (name, tool, input) in order; the first (a write inside) must land, every other fail.
    fn probes(&self, ws: &Path) -> Vec<(&'static str, &'static str, serde_json::Value)> {
        let read = |p: PathBuf| json!({"file_path": p});
        let write = |p: PathBuf| json!({"file_path": p, "content": "planted\n"});
        let parent = self.parent_file.file_name().expect("name");
        vec![
            (
                "work",
                "mcp__acp__Write",
                json!({"file_path": ws.join("inside.txt"), "content": "inside\n"}),
            ),
            ("outside_file", "mcp__acp__Read", read(self.secret.clone())),
            ("dotdot", "mcp__acp__Read", read(ws.join("..").join(parent))),
            (
                "write_outside",
                "mcp__acp__Write",
                write(self.write_outside.clone()),
            ),
            ("ssh", "mcp__acp__Read", read(self.ssh.clone())),
            ("symlink", "mcp__acp__Read", read(ws.join("link-out.txt"))),
            (
                "meta_read",
                "mcp__acp__Read",
                read(ws.join(".meta/events.jsonl")),
            ),
            (
                "meta_write",
                "mcp__acp__Write",
                write(ws.join(".meta/planted")),
            ),
        ]
    }
}

impl Drop for Targets {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.parent_file);
    }
}

/// The text of the last tool result in a Messages API request.
fn last_result(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    v["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .rfind(|b| b["type"] == "tool_result")
        .map(|b| b.to_string())
        .unwrap_or_default()
}

#[test]
fn acp_file_methods_refuse_every_escape_from_claude_code_acps_file_tools() {
    let test = "acp_file_methods_refuse_every_escape_from_claude_code_acps_file_tools";
    let Some(bin) = ready(AcpAgent::ClaudeCode, test) else {
        return;
    };
    let p = Project::new();
    let ws = p.path().canonicalize().expect("workspace");
    let targets = Targets::new(&ws);
    let probes = targets.probes(&ws);
    let script = probes.clone();
    let server = ModelServer::start(move |c| {
        let body = c.text();
        if !body.contains("Do the file probes.") {
            return sse_text("ok");
        }
        let done = AcpAgent::ClaudeCode.wire().results(&body);
        match script.get(done) {
            Some((_, tool, input)) => sse_tool_use(&format!("toolu_{done}"), tool, input),
            None => sse_text("file probes done"),
        }
    });
    p.config(&AcpAgent::ClaudeCode.role("coder", &bin, &server.base));
    let host = cli_host(&p);
    let mut req = SpawnRequest::new("coder", "You are a test.", "Do the file probes.");
    req.options.timeout_seconds = Some(180.0);
    let r = host.spawn_agent(&req).expect("spawn");
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert!(r.data.contains("file probes done"), "{}", r.data);
    check_file_probes(&p, &ws, &targets, &probes, &server);
}

/// Every probe ran (the model heard each result), the write inside landed through ACP and every
/// other one was refused by metash, with nothing of the secret anywhere.
fn check_file_probes(
    p: &Project,
    ws: &Path,
    targets: &Targets,
    probes: &[(&'static str, &'static str, serde_json::Value)],
    server: &ModelServer,
) {
    let posts = server.posts();
    let cli = AcpAgent::ClaudeCode.wire();
    for (i, (name, ..)) in probes.iter().enumerate() {
        let heard = posts
            .iter()
            .map(|c| c.text())
            .find(|b| b.contains("Do the file probes.") && cli.results(b) == i + 1)
            .unwrap_or_else(|| panic!("probe {name} did not run"));
        let out = last_result(&heard);
        eprintln!("fs probe {name}: {out}");
        assert!(!out.contains(SECRET), "probe {name} read the secret: {out}");
        if i == 0 {
            continue;
        }
        // The refusal is metash's (acp_fs.rs), or the agent's own before it asked.
        assert!(
            [
                "metash refused",
                "is refused",
                "are refused",
                "symlinks are not followed",
                "outside the worktree",
            ]
            .iter()
            .any(|m| out.contains(m)),
            "probe {name} must be refused by metash: {out}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(ws.join("inside.txt")).expect("the write inside landed"),
        "inside\n"
    );
    assert!(!targets.write_outside.exists(), "a write outside landed");
    assert!(
        !ws.join(".meta/planted").exists(),
        "a write into .meta landed"
    );
    assert_eq!(
        std::fs::read_to_string(&targets.secret).expect("secret"),
        SECRET
    );
    // One tool_call and one tool_result line per probe.
    let calls = p.log_data("tool_call");
    let results = p.log_data("tool_result");
    assert_eq!(calls.len(), probes.len(), "{calls:#?}");
    for c in &calls {
        assert_eq!(
            results.iter().filter(|r| r["id"] == c["id"]).count(),
            1,
            "{c}: {results:#?}"
        );
    }
    for c in &posts {
        assert!(!c.text().contains(SECRET), "the secret reached the model");
    }
    for f in metash_testkit::procs::files_under(p.path()) {
        if f.ends_with("link-out.txt") {
            continue;
        }
        let text = std::fs::read(&f).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&text).contains(SECRET),
            "{} holds the secret",
            f.display()
        );
    }
}
