//! An agent that uses every kind of card `metash ui` draws (issue 15), for its browser test and
//! as a demo: a coloured log (`text/x-ansi`), a markdown report, a code block, then it asks for
//! `media.preview` and announces a chart it drew (a PNG artifact written to `out/`, so its
//! manifest declares `files.write:out`), asks for `codegen`, and says
//! what it was answered each time. With the prompt `wait FILE` it then reads FILE, waits until
//! its `files.read` grant is revoked, and reads FILE again (a revoked grant stops the next read).

use std::io;

use metash_agent::{Consent, Session};
use metash_protocol::AgentEvent;

/// A `width`×`height` RGB PNG (a diagonal gradient), stored uncompressed: small, valid, and no
/// image library needed.
fn png(width: u32, height: u32) -> Vec<u8> {
    fn crc32(bytes: &[u8]) -> u32 {
        let mut c = 0xffff_ffffu32;
        for &b in bytes {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
        }
        !c
    }
    fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
        out.extend((data.len() as u32).to_be_bytes());
        let mut body = kind.to_vec();
        body.extend(data);
        out.extend(&body);
        out.extend(crc32(&body).to_be_bytes());
    }
    let mut raw = Vec::new();
    for y in 0..height {
        raw.push(0); // no filter
        for x in 0..width {
            raw.extend([(x * 255 / width) as u8, (y * 255 / height) as u8, 160]);
        }
    }
    // zlib with stored blocks of at most 65,535 bytes, then Adler-32.
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65_535).collect();
    for (i, b) in blocks.iter().enumerate() {
        z.push(u8::from(i + 1 == blocks.len()));
        let n = b.len() as u16;
        z.extend(n.to_le_bytes());
        z.extend((!n).to_le_bytes());
        z.extend(*b);
    }
    let (mut a, mut s) = (1u32, 0u32);
    for &b in &raw {
        a = (a + u32::from(b)) % 65_521;
        s = (s + a) % 65_521;
    }
    z.extend(((s << 16) | a).to_be_bytes());
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = width.to_be_bytes().to_vec();
    ihdr.extend(height.to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &z);
    chunk(&mut out, b"IEND", &[]);
    out
}

fn answer(what: &str, c: &Consent) -> String {
    match c {
        Consent::Granted { .. } => format!("{what}: granted\n"),
        Consent::Refused { code, .. } => format!("{what}: refused {code}\n"),
    }
}

fn work<W: io::Write>(s: &mut Session<W>, prompt: &str) -> io::Result<()> {
    let ws = s.context().workspace.clone().unwrap_or_else(|| ".".into());
    let me = s.context().agent_id.clone();
    s.output(
        "text/x-ansi",
        "\u{1b}[1;32mok\u{1b}[0m build finished\n\u{1b}[33mwarn\u{1b}[0m 1 chart to review\n",
    )?;
    s.output(
        "text/markdown",
        "## Report\n\n- **chart** drawn from `data.csv`\n- see the preview below\n",
    )?;
    s.output(
        "text/x-rust",
        "fn main() {\n    // draw the chart\n    let n = 42;\n    println!(\"points: {n}\");\n}\n",
    )?;
    let preview = s.request_consent("media.preview", "show you the chart I drew", Some(600))?;
    s.output("text/plain", &answer("media.preview", &preview))?;
    let path = format!("{ws}/out/chart.png");
    std::fs::write(&path, png(96, 64))?;
    s.send(AgentEvent::Artifact {
        id: format!("chart-{me}.png"),
        kind: "image".into(),
        path,
        preview_hint: Some("image/png".into()),
    })?;
    let codegen = s.request_consent("codegen", "generate the parser for data.csv", None)?;
    s.output("text/plain", &answer("codegen", &codegen))?;
    if let Some(file) = prompt.strip_prefix("wait ") {
        let file = format!("{ws}/{}", file.trim());
        let read = |when: &str| match std::fs::read_to_string(&file) {
            Ok(t) => format!("read {when}: {}\n", t.trim()),
            Err(e) => format!("read {when}: refused ({e})\n"),
        };
        s.output("text/plain", &read("before"))?;
        s.output("text/plain", "waiting for files.read to be revoked\n")?;
        loop {
            match s.recv()? {
                Some(AgentEvent::ConsentRevoke { capability, .. })
                    if capability.starts_with("files.read") =>
                {
                    break
                }
                Some(_) => {}
                None => return Ok(()),
            }
        }
        s.output("text/plain", &read("after"))?;
    }
    s.output("text/plain", "done\n")
}

fn main() {
    let result = metash_agent::run(|session, input| {
        work(session, input.prompt.trim()).map_err(|e| e.to_string())
    });
    if let Err(e) = result {
        eprintln!("showcase agent: {e}");
        std::process::exit(1);
    }
}
