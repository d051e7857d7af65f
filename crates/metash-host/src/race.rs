//! A consent question asked at the terminal and, at the same time, waiting for any other client
//! (`metash ui`, `metash consent answer`, JSON-RPC): with `[host] consent_wait_seconds` set, an
//! interactive run posts its question as a durable record and prompts; whoever answers first
//! wins, through the same locked reply, and the terminal says when the answer came from
//! elsewhere. The terminal is read without blocking (poll on stdin), one byte at a time, so an
//! answer given elsewhere leaves no half-read line behind for the next question.

use std::io::Write;
use std::time::{Duration, Instant};

use metash_policy::{describe_question, parse_answer, Answer, ConsentPrompter, ConsentQuestion};
use metash_store::Store;

use crate::asks::{answer_of, post, reply};

/// How often the store is looked at while the terminal is quiet.
const POLL_MS: i32 = 100;

pub struct RacingPrompter {
    store: Store,
    wait: Duration,
}

impl RacingPrompter {
    pub fn new(store: Store, wait: Duration) -> Self {
        Self { store, wait }
    }
}

/// What one look at the terminal found.
enum Typed {
    Nothing,
    Line(String),
    /// End of input: only other clients can answer now.
    Closed,
}

/// Bytes typed so far; a whole line once one is complete.
fn read_terminal(partial: &mut Vec<u8>) -> Typed {
    let mut fd = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, for the duration of the call.
    let n = unsafe { libc::poll(&mut fd, 1, POLL_MS) };
    if n <= 0 {
        return Typed::Nothing;
    }
    loop {
        let mut b = [0u8; 1];
        // SAFETY: reads at most one byte into a one-byte buffer.
        let got = unsafe { libc::read(0, b.as_mut_ptr().cast(), 1) };
        if got <= 0 {
            return if partial.is_empty() {
                Typed::Closed
            } else {
                Typed::Line(String::from_utf8_lossy(&std::mem::take(partial)).into_owned())
            };
        }
        if b[0] == b'\n' {
            return Typed::Line(String::from_utf8_lossy(&std::mem::take(partial)).into_owned());
        }
        partial.push(b[0]);
        // More only if it is already there: never block on a half-typed line.
        let mut more = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: as above, with no wait.
        if unsafe { libc::poll(&mut more, 1, 0) } <= 0 {
            return Typed::Nothing;
        }
    }
}

fn word(a: Answer) -> String {
    match a {
        Answer::AllowOnce => "allow once".into(),
        Answer::AllowFor(s) => format!("allow for {s} s"),
        Answer::Deny => "deny".into(),
    }
}

impl ConsentPrompter for RacingPrompter {
    fn ask(&mut self, q: &ConsentQuestion) -> Answer {
        let mut err = std::io::stderr();
        let Ok(id) = post(&self.store, q, self.wait) else {
            let _ = writeln!(err, "metash: the question could not be recorded; denied");
            return Answer::Deny;
        };
        let suggested = q.duration_s.unwrap_or(600);
        // metash's record first, the agent's reason after it, escaped (see describe_question).
        let prompt = format!(
            "{}  [o] allow once  [s {suggested}] allow for N seconds  [d] deny  (or answer in \
             `metash ui` / `metash consent answer {id}`; denied in {} s) > ",
            describe_question(q),
            self.wait.as_secs()
        );
        let _ = write!(err, "{prompt}");
        let _ = err.flush();
        let until = Instant::now() + self.wait;
        let (mut partial, mut open) = (Vec::new(), true);
        while Instant::now() < until {
            if let Some(a) = answer_of(&self.store, &id) {
                let _ = writeln!(err, "\nmetash: answered elsewhere: {}", word(a));
                return a;
            }
            if !open {
                std::thread::sleep(Duration::from_millis(POLL_MS as u64));
                continue;
            }
            match read_terminal(&mut partial) {
                Typed::Nothing => {}
                Typed::Closed => open = false,
                Typed::Line(line) => match parse_answer(&line) {
                    // The first answer wins: if another client was first, theirs stands.
                    Some(a) => {
                        return match reply(&self.store, &id, a, "terminal") {
                            Ok(()) => a,
                            Err(_) => {
                                let a = answer_of(&self.store, &id).unwrap_or(Answer::Deny);
                                let _ =
                                    writeln!(err, "metash: answered elsewhere first: {}", word(a));
                                a
                            }
                        };
                    }
                    None => {
                        let _ = write!(err, "metash: answer `o`, `s SECONDS` or `d` > ");
                        let _ = err.flush();
                    }
                },
            }
        }
        let a = answer_of(&self.store, &id).unwrap_or(Answer::Deny);
        if a == Answer::Deny {
            let _ = writeln!(err, "\nmetash: no answer in time; denied");
        }
        a
    }

    fn name(&self) -> &'static str {
        "terminal or any client"
    }
}
