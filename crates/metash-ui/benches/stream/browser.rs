//! The stream bench in a real browser: Debian's Chromium shows the run view while the agent
//! floods, and the page notes each chunk's arrival. Latency: the append's return (wall clock) to
//! the page's EventSource receiving it (the page's wall clock, same machine).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use metash_protocol::LogKind;
use metash_store::Store;
use serde_json::json;

/// Chromium and the driver, or why not.
pub fn prerequisites() -> Result<(PathBuf, PathBuf), String> {
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools");
    if !tools
        .join("node_modules/playwright-core/package.json")
        .is_file()
    {
        return Err("playwright-core is not installed under .tools (scripts/setup)".into());
    }
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or("Debian's chromium is not installed (scripts/setup)")?;
    Ok((tools, chromium))
}

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
    let (tools, chromium) = prerequisites()?;
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
    let gap = Duration::from_secs(1) / rate;
    let start = Instant::now();
    for (i, at) in sent.iter_mut().enumerate() {
        let due = start + gap * i as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        store
            .append(
                LogKind::AgentEvent,
                Some("flood"),
                json!({"type": "output", "agent_id": "flood", "chunk_id": format!("b:{i}"),
                       "content_type": "text/plain", "data": format!("b{i}")}),
            )
            .map_err(|e| e.to_string())?;
        *at = epoch_ms();
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
