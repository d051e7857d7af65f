//! The three roles of metash's example project (`examples/greetings`), without a model: they read
//! the request block the orchestrator puts at the end of every prompt (`docs/orchestrator.md`) and
//! answer deterministically, so `metash run` shows the whole loop on a fresh machine:
//!
//! - the **planner** first asks which language the greetings use (a `decision_required`
//!   checkpoint), then plans with the answer (from `resume_data`, or from the decisions the prompt
//!   lists): phase 1 `hello` and `bye` (independent, so they run in parallel) and `readme` (after
//!   both); phase 2 `shout` (after `hello`); then it reports the project done;
//! - the **executor** writes each task's file in its worktree; its first attempt at `bye` forgets
//!   the final `!`, so the verifier has something to find (a gap, then a fix);
//! - the **verifier** checks each task's file and returns a JSON verdict with findings.
//!
//! Tasks it does not know (generated plans in tests) get `tasks/<id>.txt` holding their title.
//! A context that holds a ```` ```plan ```` block (`{"phases": [[task, …], …]}`) is planned as it
//! says, phase by phase, without the language question: how tests give the whole stack a plan of
//! their own (hundreds of tasks for the workers' fault test).
//! The logic is plain functions so tests and benchmarks can run it in-process.

use std::path::Path;

mod resolve;

pub use resolve::{keep_both, resolve_conflicts, resolve_request};

use metash_protocol::CheckpointReason;
use serde_json::{json, Value};

/// What an agent answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Output(String),
    Checkpoint {
        reason: CheckpointReason,
        message: String,
        options: Vec<String>,
        resume_id: Option<String>,
    },
    Error(String),
}

/// The id of the planner's question, so its answer is recognised among the decisions.
pub const LANGUAGE_QUESTION: &str = "greeting-language";

/// The request block: the last ```` ```json ```` fence of the prompt.
pub fn request(prompt: &str) -> Option<Value> {
    let end = prompt.rfind("```")?;
    let start = prompt[..end].rfind("```json")?;
    serde_json::from_str(prompt[start + 7..end].trim()).ok()
}

fn language(req: &Value, resume: Option<&Value>) -> Option<String> {
    if let Some(answer) = resume
        .and_then(|r| r.get("user_input"))
        .and_then(Value::as_str)
    {
        return Some(answer.to_ascii_lowercase());
    }
    req.get("decisions")?
        .as_array()?
        .iter()
        .find(|d| {
            d.get("id").and_then(Value::as_str) == Some(LANGUAGE_QUESTION)
                || d.get("question")
                    .and_then(Value::as_str)
                    .is_some_and(|q| q.contains("language"))
        })
        .and_then(|d| d.get("answer"))
        .and_then(Value::as_str)
        .map(str::to_ascii_lowercase)
}

/// The plan a context gives in a ```` ```plan ```` block, if it gives one.
fn given_plan(prompt: &str) -> Option<Value> {
    let start = prompt.find("```plan\n")? + "```plan\n".len();
    let end = start + prompt[start..].find("```")?;
    serde_json::from_str(&prompt[start..end]).ok()
}

/// The planner.
pub fn planner(prompt: &str, resume: Option<&Value>) -> Reply {
    let Some(req) = request(prompt) else {
        return Reply::Error("the prompt holds no request block".into());
    };
    if let Some(plan) = given_plan(prompt) {
        let phase = req.get("phase").and_then(Value::as_u64).unwrap_or(1);
        let tasks = usize::try_from(phase.saturating_sub(1))
            .ok()
            .and_then(|i| plan.get("phases")?.get(i).cloned())
            .unwrap_or_else(|| json!([]));
        let done = tasks.as_array().is_none_or(Vec::is_empty);
        return Reply::Output(format!(
            "Here is the plan for phase {phase}, as the context gives it:\n```json\n{}\n```",
            json!({"tasks": tasks, "done": done})
        ));
    }
    if language(&req, resume).is_none() {
        return Reply::Checkpoint {
            reason: CheckpointReason::DecisionRequired,
            message: "Which language should the greetings use?".into(),
            options: vec!["english".into(), "french".into()],
            resume_id: Some(LANGUAGE_QUESTION.into()),
        };
    }
    let phase = req.get("phase").and_then(Value::as_u64).unwrap_or(1);
    let tasks = match phase {
        1 => json!([
            {"id": "hello", "title": "Write hello.txt, the greeting", "dependencies": []},
            {"id": "bye", "title": "Write bye.txt, the farewell", "dependencies": []},
            {"id": "readme", "title": "Write README.md listing both", "dependencies": ["hello", "bye"]}
        ]),
        2 => json!([
            {"id": "shout", "title": "Write shout.txt, the greeting in capitals", "dependencies": ["hello"]}
        ]),
        _ => json!([]),
    };
    let done = tasks.as_array().is_some_and(Vec::is_empty);
    Reply::Output(format!(
        "Here is the plan for phase {phase}:\n```json\n{}\n```",
        json!({"tasks": tasks, "done": done})
    ))
}

fn texts(lang: &str) -> (&'static str, &'static str) {
    if lang == "french" {
        ("Bonjour, le monde !", "Au revoir !")
    } else {
        ("Hello, world!", "Goodbye!")
    }
}

fn task_id(req: &Value) -> Option<String> {
    req.get("task")?.get("id")?.as_str().map(str::to_string)
}

/// What the executor and the verifier both read first: the request, its task, the language.
struct Task {
    req: Value,
    id: String,
    lang: String,
    hello: &'static str,
    bye: &'static str,
}

impl Task {
    fn read(prompt: &str, resume: Option<&Value>) -> Result<Self, Reply> {
        let req = request(prompt)
            .ok_or_else(|| Reply::Error("the prompt holds no request block".into()))?;
        let id = task_id(&req).ok_or_else(|| Reply::Error("the request names no task".into()))?;
        let lang = language(&req, resume).unwrap_or_else(|| "english".into());
        let (hello, bye) = texts(&lang);
        Ok(Self {
            req,
            id,
            lang,
            hello,
            bye,
        })
    }
}

fn read(ws: &Path, name: &str) -> String {
    std::fs::read_to_string(ws.join(name)).unwrap_or_default()
}

/// The executor, working in `workspace` (its task's worktree).
pub fn executor(prompt: &str, resume: Option<&Value>, workspace: &Path) -> Reply {
    if let Some(files) = request(prompt).as_ref().and_then(resolve_request) {
        return resolve_conflicts(workspace, &files);
    }
    Task::read(prompt, resume).map_or_else(|refusal| refusal, |t| t.execute(workspace))
}

/// The verifier, looking at `workspace` (the task's worktree).
pub fn verifier(prompt: &str, resume: Option<&Value>, workspace: &Path) -> Reply {
    Task::read(prompt, resume).map_or_else(|refusal| refusal, |t| t.verify(workspace))
}

impl Task {
    fn execute(&self, workspace: &Path) -> Reply {
        let (hello, bye) = (self.hello, self.bye);
        let fixing = self
            .req
            .get("findings")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        let (file, content) = match self.id.as_str() {
            "hello" => ("hello.txt".to_string(), format!("{hello}\n")),
            // The first draft forgets the final `!`: the verifier catches it.
            "bye" if !fixing => (
                "bye.txt".to_string(),
                format!("{}\n", bye.trim_end_matches('!').trim_end()),
            ),
            "bye" => ("bye.txt".to_string(), format!("{bye}\n")),
            "readme" => (
                "README.md".to_string(),
                format!(
                    "# Greetings ({})\n\n- hello.txt: {}\n- bye.txt: {}\n",
                    self.lang,
                    read(workspace, "hello.txt").trim(),
                    read(workspace, "bye.txt").trim()
                ),
            ),
            "shout" => (
                "shout.txt".to_string(),
                format!("{}\n", read(workspace, "hello.txt").trim().to_uppercase()),
            ),
            other => {
                let title = self
                    .req
                    .get("task")
                    .and_then(|t| t.get("title"))
                    .and_then(Value::as_str)
                    .unwrap_or(other);
                (format!("tasks/{other}.txt"), format!("{title}\n"))
            }
        };
        let path = workspace.join(&file);
        if let Some(parent) = path.parent() {
            if let Err(e) = std::fs::create_dir_all(parent) {
                return Reply::Error(format!("{file}: {e}"));
            }
        }
        if let Err(e) = std::fs::write(&path, &content) {
            return Reply::Error(format!("{file}: {e}"));
        }
        Reply::Output(json!({"summary": format!("wrote {file}")}).to_string())
    }

    fn verify(&self, workspace: &Path) -> Reply {
        let (hello, bye) = (self.hello, self.bye);
        let mut findings = Vec::new();
        let mut expect = |file: &str, want: &str| {
            let got = read(workspace, file);
            if got.trim() != want.trim() {
                findings.push(format!(
                    "{file}: expected {:?}, found {:?}",
                    want.trim(),
                    got.trim()
                ));
            }
        };
        match self.id.as_str() {
            "hello" => expect("hello.txt", hello),
            "bye" => {
                let got = read(workspace, "bye.txt");
                if !got.trim_end().ends_with('!') {
                    findings.push(format!(
                        "bye.txt: the farewell must end with '!' (found {:?})",
                        got.trim()
                    ));
                } else {
                    expect("bye.txt", bye);
                }
            }
            "readme" => {
                let got = read(workspace, "README.md");
                for want in [hello, bye] {
                    if !got.contains(want) {
                        findings.push(format!("README.md does not quote {want:?}"));
                    }
                }
            }
            "shout" => expect("shout.txt", &hello.to_uppercase()),
            other => {
                if read(workspace, &format!("tasks/{other}.txt"))
                    .trim()
                    .is_empty()
                {
                    findings.push(format!("tasks/{other}.txt is missing or empty"));
                }
            }
        }
        Reply::Output(json!({"pass": findings.is_empty(), "findings": findings}).to_string())
    }
}

/// Runs `handler` as a metash agent on stdin/stdout (the bins' `main`).
pub fn serve(handler: fn(&str, Option<&Value>, &Path) -> Reply) -> std::io::Result<()> {
    metash_agent::run(|session, input| {
        let ctx = session.context().clone();
        let resume = ctx
            .config
            .get("resume_data")
            .filter(|v| !v.is_null())
            .cloned();
        let ws = ctx.workspace.clone().unwrap_or_else(|| ".".into());
        match handler(&input.prompt, resume.as_ref(), Path::new(&ws)) {
            Reply::Output(text) => session
                .output("text/plain", &text)
                .map_err(|e| e.to_string()),
            Reply::Error(e) => Err(e),
            Reply::Checkpoint {
                reason,
                message,
                options,
                resume_id,
            } => session
                .send(metash_protocol::AgentEvent::Checkpoint {
                    reason,
                    message,
                    options,
                    resume_id,
                })
                .map_err(|e| e.to_string()),
        }
    })
}
