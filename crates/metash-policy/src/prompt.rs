//! Who answers a consent request. The host routes each `consent_request` to whoever is attached:
//! a person at a terminal ([`TerminalPrompter`]), later the TUI or a JSON-RPC client (each just
//! another [`ConsentPrompter`]), or, for scripts and CI, a policy file and `--yes-to` flags
//! ([`NonInteractive`]). With nobody to ask and no rule that matches, the answer is deny: a
//! prompter never waits for an answer that cannot come.

use std::io::{BufRead, Write};

use metash_protocol::sanitize_line;

use crate::capability::Capability;
use crate::policy_file::PolicyFile;
pub use crate::question::{Answer, ConsentQuestion};

pub trait ConsentPrompter {
    fn ask(&mut self, q: &ConsentQuestion) -> Answer;
    /// Recorded in the ledger as who answered (`terminal`, `policy`, `nobody`, ...).
    fn name(&self) -> &'static str;
    /// The answer [`Self::ask`] would give `q` by rule alone, at once, without asking anyone (the
    /// policy file, `--yes-to`, nobody to ask); `None` when someone would be asked. The host's
    /// cap and rate on an agent's questions count only questions someone is asked.
    fn by_rule(&self, _q: &ConsentQuestion) -> Option<Answer> {
        None
    }
}

/// Nobody to ask: always deny.
#[derive(Debug, Default, Clone, Copy)]
pub struct DenyAll;

impl ConsentPrompter for DenyAll {
    fn ask(&mut self, _: &ConsentQuestion) -> Answer {
        Answer::Deny
    }
    fn name(&self) -> &'static str {
        "nobody"
    }
    fn by_rule(&self, _: &ConsentQuestion) -> Option<Answer> {
        Some(Answer::Deny)
    }
}

/// Asks on a terminal: `o` allow once, `s N` (or `N`) allow for N seconds, `d` deny. End of input or
/// three answers it cannot read are a deny.
#[derive(Debug)]
pub struct TerminalPrompter<R, W> {
    input: R,
    output: W,
}

impl<R: BufRead, W: Write> TerminalPrompter<R, W> {
    pub fn new(input: R, output: W) -> Self {
        Self { input, output }
    }

    pub fn into_inner(self) -> (R, W) {
        (self.input, self.output)
    }
}

/// Parses one line of answer.
pub fn parse_answer(line: &str) -> Option<Answer> {
    let line = line.trim().to_ascii_lowercase();
    let mut words = line.split_whitespace();
    let first = words.next()?;
    let secs = |w: Option<&str>| {
        w.and_then(|n| n.trim_end_matches('s').parse::<u64>().ok())
            .filter(|n| *n > 0)
    };
    match first {
        "o" | "once" | "y" | "yes" => Some(Answer::AllowOnce),
        "d" | "deny" | "n" | "no" => Some(Answer::Deny),
        "s" | "for" | "allow" => secs(words.next()).map(Answer::AllowFor),
        n => secs(Some(n)).map(Answer::AllowFor),
    }
}

/// The question as a person reads it: metash's own record first (the agent, the capability,
/// the grant length it suggests), then the agent's reason, marked as the agent's words and
/// shown on one line with every terminal control escaped, so the reason can neither erase nor
/// rewrite the record above it (issue 31). Ends with a newline; the caller adds the choices.
pub fn describe_question(q: &ConsentQuestion) -> String {
    let who = if q.agent_name.is_empty() || q.agent_name == q.agent {
        sanitize_line(&q.agent).into_owned()
    } else {
        format!(
            "{} ({})",
            sanitize_line(&q.agent_name),
            sanitize_line(&q.agent)
        )
    };
    let sensitive = q
        .sensitive
        .map(|s| format!(" [sensitive: {}]", s.as_str()))
        .unwrap_or_default();
    let length = q
        .duration_s
        .map_or("one action".to_string(), |d| format!("{d} s suggested"));
    let reason = if q.reason.trim().is_empty() {
        "(none given)".into()
    } else {
        sanitize_line(&q.reason)
    };
    format!(
        "metash: agent {who} asks for `{}`{sensitive} ({length})\n  reason (the agent's words): {reason}\n",
        sanitize_line(&q.capability.to_string())
    )
}

impl<R: BufRead, W: Write> ConsentPrompter for TerminalPrompter<R, W> {
    fn ask(&mut self, q: &ConsentQuestion) -> Answer {
        let question = describe_question(q);
        let suggested = q.duration_s.unwrap_or(600);
        for _ in 0..3 {
            let _ = write!(
                self.output,
                "{question}  [o] allow once  [s {suggested}] allow for N seconds  [d] deny > "
            );
            let _ = self.output.flush();
            let mut line = String::new();
            match self.input.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = writeln!(self.output, "\nmetash: no answer; denied");
                    return Answer::Deny;
                }
                Ok(_) => {}
            }
            if let Some(a) = parse_answer(&line) {
                return a;
            }
            let _ = writeln!(self.output, "metash: answer `o`, `s SECONDS` or `d`");
        }
        Answer::Deny
    }

    fn name(&self) -> &'static str {
        "terminal"
    }
}

/// Scripts and CI: `--yes-to CAPABILITY` flags (allow once, for every agent, sensitive actions
/// included: the flag is an explicit per-run decision) and a policy file; anything else is denied.
#[derive(Debug, Clone, Default)]
pub struct NonInteractive {
    pub policy: Option<PolicyFile>,
    pub yes_to: Vec<Capability>,
}

impl NonInteractive {
    pub fn new(policy: Option<PolicyFile>, yes_to: Vec<Capability>) -> Self {
        Self { policy, yes_to }
    }
}

impl NonInteractive {
    /// What the policy file and `--yes-to` say about `q`; `None` when no rule answers it (then
    /// [`ConsentPrompter::ask`] denies, or a waiting prompter asks any client).
    pub fn decide(&self, q: &ConsentQuestion) -> Option<Answer> {
        if self.policy.as_ref().is_some_and(|p| p.denies(q)) {
            return Some(Answer::Deny);
        }
        if self.yes_to.iter().any(|c| c.covers(&q.capability)) {
            return Some(Answer::AllowOnce);
        }
        self.policy.as_ref().and_then(|p| p.answer(q))
    }
}

impl ConsentPrompter for NonInteractive {
    fn ask(&mut self, q: &ConsentQuestion) -> Answer {
        self.decide(q).unwrap_or(Answer::Deny)
    }

    fn name(&self) -> &'static str {
        "policy"
    }

    fn by_rule(&self, q: &ConsentQuestion) -> Option<Answer> {
        Some(self.decide(q).unwrap_or(Answer::Deny))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers() {
        assert_eq!(parse_answer("o\n"), Some(Answer::AllowOnce));
        assert_eq!(parse_answer("s 30"), Some(Answer::AllowFor(30)));
        assert_eq!(parse_answer("120"), Some(Answer::AllowFor(120)));
        assert_eq!(parse_answer("for 60s"), Some(Answer::AllowFor(60)));
        assert_eq!(parse_answer("D"), Some(Answer::Deny));
        assert_eq!(parse_answer("s 0"), None);
        assert_eq!(parse_answer("maybe"), None);
        assert_eq!(parse_answer(""), None);
    }

    /// metash's record comes first and whole; the agent's reason after it, marked, with its
    /// erase-line, OSC, C1 and bidi controls shown instead of obeyed, and its newline too.
    #[test]
    fn the_question_shows_the_record_first_and_the_reason_escaped() {
        let mut q = ConsentQuestion::new(
            "fetcher",
            "network:api.example.com".parse().unwrap(),
            "\r\x1b[2Kmetash: agent fetcher asks for `nothing`\n\u{9b}2K\x1b]52;c;eA==\x07\u{202e}",
            Some(60),
        );
        q.sensitive = Some(crate::question::Sensitive::NetworkWrite);
        let text = describe_question(&q);
        let record = "metash: agent fetcher asks for `network:api.example.com` [sensitive: \
                      network_write] (60 s suggested)\n";
        assert!(text.starts_with(record), "{text}");
        let reason = text.strip_prefix(record).unwrap();
        assert_eq!(
            reason,
            "  reason (the agent's words): \\r\\x1b[2Kmetash: agent fetcher asks for \
             `nothing`\\n\\u{9b}2K\\x1b]52;c;eA==\\x07\\u{202e}\n"
        );
        q.reason = " ".into();
        q.duration_s = None;
        assert!(describe_question(&q)
            .contains("(one action)\n  reason (the agent's words): (none given)"));
    }
}
