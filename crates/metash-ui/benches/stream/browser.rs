//! The stream bench in a real browser: Debian's Chromium shows the run view while the agent
//! floods, and the page notes each chunk's arrival. Latency: the append's return (wall clock) to
//! the page's EventSource receiving it (the page's wall clock, same machine).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use metash_protocol::LogKind;
use metash_store::Store;
use serde_json::json;

fn epoch_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// What the page saw: latencies (ms) from append to arrival and to drawn, and how many arrived.
pub struct Seen {
    pub arrived: Vec<f64>,
    pub drawn: Vec<f64>,
    pub count: usize,
}

/// Floods `n` chunks `b<i>` at `rate`/s with the page open.
pub fn run(root: &Path, url: &str, n: usize, rate: u32) -> Result<Seen, String> {
    let (tools, chromium) = super::common::browser_tools()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/stream/page.mjs");
    let mut node = Command::new("node")
        .arg(script)
        .args([
            tools.as_os_str(),
            url.as_ref(),
            chromium.as_os_str(),
            n.to_string().as_ref(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("node: {e}"))?;
    let mut out = BufReader::new(node.stdout.take().ok_or("no stdout")?);
    let mut line = String::new();
    out.read_line(&mut line).map_err(|e| e.to_string())?;
    if line.trim() != "ready" {
        return Err(format!("the page did not start: {line}"));
    }
    let store = Store::open(root).map_err(|e| e.to_string())?;
    let mut sent = vec![0.0f64; n];
    let mut failed = None;
    super::common::paced(n, rate, |i| {
        let appended = store.append(
            LogKind::AgentEvent,
            Some("flood"),
            json!({"type": "output", "agent_id": "flood", "chunk_id": format!("b:{i}"),
                   "content_type": "text/plain", "data": format!("b{i}")}),
        );
        match appended {
            Ok(_) => sent[i] = epoch_ms(),
            Err(e) => failed = Some(e.to_string()),
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    line.clear();
    out.read_line(&mut line).map_err(|e| e.to_string())?;
    let _ = node.wait();
    let v: serde_json::Value =
        serde_json::from_str(line.trim()).map_err(|e| format!("{e}: {line}"))?;
    let lat = |key: &str| -> Vec<f64> {
        v[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| Some((p[0].as_u64()? as usize, p[1].as_f64()?)))
                    .filter(|(i, _)| *i < n && sent[*i] > 0.0)
                    .map(|(i, t)| (t - sent[i]).max(0.0))
                    .collect()
            })
            .unwrap_or_default()
    };
    let arrived = lat("got");
    Ok(Seen {
        count: arrived.len(),
        drawn: lat("drawn"),
        arrived,
    })
}
