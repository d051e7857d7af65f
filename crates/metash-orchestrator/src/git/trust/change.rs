//! What changed between two snapshots of the repository's executable git configuration, each
//! change named by file and key, and shown so that a terminal cannot be driven by it: a planted
//! value is agent-written text, and may hold escape sequences (OSC 52, a cleared line, a forged
//! prompt) meant for the person reading the report.
//!
//! This module imports nothing of the crate, so the crate's error type can carry its changes.

use std::collections::BTreeMap;
use std::fmt;

/// How an item changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    Added,
    Removed,
    Changed,
}

/// One changed key of a config file, or one changed file (a hook, `info/attributes`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Change {
    pub kind: ChangeKind,
    /// The file, relative to the project when inside it (`.git/config`, `.git/hooks/pre-commit`).
    pub file: String,
    /// The config key (`filter.evil.clean`); `None` when the change is the file itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The value before (several values of one key, one per line; a file's digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new: Option<String>,
}

impl Change {
    /// `file: key` or `file`, printable.
    pub fn what(&self) -> String {
        match &self.key {
            Some(k) => format!("{}: {}", printable(&self.file), printable(k)),
            None => printable(&self.file),
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<String>| printable(v.as_deref().unwrap_or(""));
        match self.kind {
            ChangeKind::Added => write!(f, "{} added: {}", self.what(), show(&self.new)),
            ChangeKind::Removed => write!(f, "{} removed (was: {})", self.what(), show(&self.old)),
            ChangeKind::Changed => write!(
                f,
                "{} changed: {} (was: {})",
                self.what(),
                show(&self.new),
                show(&self.old)
            ),
        }
    }
}

/// Longest value shown in full; longer ones are cut (the JSON form keeps them whole).
const SHOWN: usize = 300;

/// `text` with every control character, and every character that reorders or hides text
/// (bidirectional overrides, zero-width marks), as a visible `\u{..}` escape, and cut to a
/// readable length.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(SHOWN + 8));
    for (n, c) in text.chars().enumerate() {
        if n >= SHOWN {
            out.push('…');
            break;
        }
        if c.is_control() || hides_text(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// Format characters that make a terminal show something else than the bytes say.
fn hides_text(c: char) -> bool {
    matches!(c,
        '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

/// Config keys and their values, by file.
pub type ConfigMap = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// Every difference between `old` and `new`: per config file and key, then per file.
pub fn diff(
    old_config: &ConfigMap,
    new_config: &ConfigMap,
    old_files: &BTreeMap<String, String>,
    new_files: &BTreeMap<String, String>,
) -> Vec<Change> {
    let empty = BTreeMap::new();
    let mut changes = Vec::new();
    let files: std::collections::BTreeSet<&String> =
        old_config.keys().chain(new_config.keys()).collect();
    for file in files {
        let (o, n) = (
            old_config.get(file).unwrap_or(&empty),
            new_config.get(file).unwrap_or(&empty),
        );
        let joined = |v: &Vec<String>| v.join("\n");
        changes.extend(
            compare(o, n, |v| joined(v)).map(|(kind, key, old, new)| Change {
                kind,
                file: file.clone(),
                key: Some(key.clone()),
                old,
                new,
            }),
        );
    }
    changes.extend(
        compare(old_files, new_files, String::clone).map(|(kind, file, old, new)| Change {
            kind,
            file: file.clone(),
            key: None,
            old,
            new,
        }),
    );
    changes
}

/// The entries of two maps that differ, as `(kind, key, old, new)`.
fn compare<'m, V: PartialEq>(
    old: &'m BTreeMap<String, V>,
    new: &'m BTreeMap<String, V>,
    show: impl Fn(&V) -> String + 'm,
) -> impl Iterator<Item = (ChangeKind, &'m String, Option<String>, Option<String>)> + 'm {
    let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    keys.into_iter()
        .filter_map(move |k| match (old.get(k), new.get(k)) {
            (None, Some(n)) => Some((ChangeKind::Added, k, None, Some(show(n)))),
            (Some(o), None) => Some((ChangeKind::Removed, k, Some(show(o)), None)),
            (Some(o), Some(n)) if o != n => {
                Some((ChangeKind::Changed, k, Some(show(o)), Some(show(n))))
            }
            _ => None,
        })
}

/// The message of a refusal: each change, and what a person does about it.
pub fn refusal(changes: &[Change]) -> String {
    let mut text = String::from(
        "the repository's executable git configuration changed since metash last checked it \
         (.meta/git-trust.json), and metash runs no git command on it until a person has looked:",
    );
    for c in changes {
        text.push_str("\n  ");
        text.push_str(&c.to_string());
    }
    text.push_str(
        "\nif you made these changes, accept them with `metash git trust` (it shows them again and \
         asks); if not, remove them: your own `git status`, `git diff` and `git commit` in this \
         project would run them too",
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_overrides_are_shown_not_sent() {
        assert_eq!(
            printable("a\u{1b}]52;c;eA==\u{7}b"),
            "a\\u{1b}]52;c;eA==\\u{7}b"
        );
        assert_eq!(printable("x\u{202e}y\n"), "x\\u{202e}y\\u{a}");
        assert_eq!(printable("plain: é"), "plain: é");
        assert!(printable(&"z".repeat(1000)).ends_with('…'));
    }

    #[test]
    fn each_key_and_file_is_named() {
        let mut old = ConfigMap::new();
        old.entry(".git/config".into())
            .or_default()
            .insert("core.fsmonitor".into(), vec!["a".into()]);
        let mut new = ConfigMap::new();
        let c = new.entry(".git/config".into()).or_default();
        c.insert("core.fsmonitor".into(), vec!["b".into()]);
        c.insert("filter.x.clean".into(), vec!["sh".into()]);
        let files = BTreeMap::from([(".git/hooks/pre-commit".to_string(), "h".to_string())]);
        let d = diff(&old, &new, &files, &BTreeMap::new());
        let shown: Vec<String> = d.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                ".git/config: core.fsmonitor changed: b (was: a)",
                ".git/config: filter.x.clean added: sh",
                ".git/hooks/pre-commit removed (was: h)",
            ]
        );
    }
}
