//! A client of a served project over real HTTP: logs in with the start token, keeps the cookie
//! and the page's CSRF token, and reads the live stream.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use metash_store::Store;

pub struct Ui {
    pub _dir: tempfile::TempDir,
    pub root: std::path::PathBuf,
    pub rt: tokio::runtime::Runtime,
    pub served: Option<metash_ui::Served>,
    pub addr: SocketAddr,
    pub cookie: String,
    pub csrf: String,
}

/// Exchanges the start URL's token for the session cookie (`name=value`), checking its flags.
pub fn login(addr: SocketAddr, url: &str) -> String {
    let path = url.split_once(&addr.to_string()).unwrap().1.to_string();
    let login = request(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(login.status, 303, "{}", login.head);
    let set = login
        .head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .expect("a session cookie")
        .to_string();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    set.split(';').next().unwrap().to_string()
}

/// The page's CSRF token.
pub fn csrf_of(page: &str) -> String {
    page.split("name=\"csrf\" content=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap()
        .to_string()
}

pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: String,
}

pub fn request(addr: SocketAddr, raw: &str) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut bytes = Vec::new();
    s.read_to_end(&mut bytes).unwrap();
    let out = String::from_utf8_lossy(&bytes).into_owned();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Reply {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

impl Ui {
    pub fn start() -> Self {
        Self::start_with(&metash_ui::UiOptions::default())
    }

    pub fn start_with(options: &metash_ui::UiOptions) -> Self {
        let super::Served {
            dir,
            root,
            rt,
            served,
        } = super::serve_new_project_with(options);
        let addr = served.addr;
        let cookie = login(addr, &served.url);
        let mut ui = Self {
            _dir: dir,
            root,
            rt,
            served: Some(served),
            addr,
            cookie,
            csrf: String::new(),
        };
        let page = ui.get("/");
        ui.csrf = csrf_of(&page.body);
        ui
    }

    pub fn store(&self) -> Store {
        Store::open(&self.root).unwrap()
    }

    pub fn get(&self, path: &str) -> Reply {
        request(
            self.addr,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: {}\r\nCookie: {}\r\nConnection: close\r\n\r\n",
                self.addr, self.cookie
            ),
        )
    }

    pub fn post_form(&self, path: &str, form: &str, extra: &str) -> Reply {
        request(
            self.addr,
            &format!(
                "POST {path} HTTP/1.1\r\nHost: {}\r\nCookie: {}\r\n{extra}Content-Type: \
                 application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: \
                 close\r\n\r\n{form}",
                self.addr,
                self.cookie,
                form.len()
            ),
        )
    }
}

impl Drop for Ui {
    fn drop(&mut self) {
        if let Some(s) = self.served.take() {
            self.rt.block_on(s.stop());
        }
    }
}

/// Reads `n` SSE events (id and data) from `/events`, sending `Last-Event-ID: last`.
pub fn read_events(ui: &Ui, last: Option<u64>, n: usize) -> Vec<(u64, serde_json::Value)> {
    read_events_at(ui.addr, &ui.cookie, last, n)
}

/// [`read_events`] for a server at `addr` with session `cookie`.
pub fn read_events_at(
    addr: SocketAddr,
    cookie: &str,
    last: Option<u64>,
    n: usize,
) -> Vec<(u64, serde_json::Value)> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let resume = last
        .map(|l| format!("Last-Event-ID: {l}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET /events HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\n{resume}Accept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let (mut out, mut id) = (Vec::new(), None);
    let until = Instant::now() + Duration::from_secs(10);
    let mut line = String::new();
    while out.len() < n && Instant::now() < until {
        line.clear();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        // Chunked framing lines (sizes) carry no "id:"/"data:" prefix and are skipped.
        if let Some(v) = line.trim_end().strip_prefix("id: ") {
            id = v.parse().ok();
        } else if let Some(v) = line.trim_end().strip_prefix("data: ") {
            out.push((id.take().unwrap(), serde_json::from_str(v).unwrap()));
        }
    }
    out
}
