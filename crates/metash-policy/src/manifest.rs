//! `manifest.toml` schema v0.1 (seed 002 section 1), parsed from `toml_edit`'s span-keeping document
//! so that every error names the file, line, column and field, says what was expected, and suggests
//! the nearest valid name for an unknown field. The parser collects every error it can find in one
//! pass, so a person fixes a manifest in one go rather than one error per run.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use metash_protocol::manifest::{Resources, UiHints};
use metash_protocol::{Hook, Manifest, SandboxKind, MANIFEST_SCHEMA_VERSIONS};
use toml_edit::{Item, Value};

use crate::capability::{oauth_scope_capability, Capability};
use crate::quantity;
use crate::suggest;

/// Top-level fields of schema v0.1, in the seed's order.
pub const TOP_FIELDS: &[&str] = &[
    "schema_version",
    "name",
    "version",
    "entry",
    "sandbox",
    "capabilities",
    "oauth_scopes",
    "resources",
    "ui",
    "hooks",
];

/// The most entries a list field (`capabilities`, `oauth_scopes`, `ui.hints`) may hold. Real
/// agents declare a handful; thousands would flood the consent prompt and the ledger, so such a
/// manifest is refused with one clear error instead of one per entry.
pub const MAX_LIST_ENTRIES: usize = 256;

const REQUIRED: &[&str] = &["schema_version", "name", "version", "entry", "sandbox"];
const RESOURCE_FIELDS: &[&str] = &["cpu", "mem"];
const UI_FIELDS: &[&str] = &["hints"];

/// One problem in one manifest, located.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub path: PathBuf,
    /// 1-based.
    pub line: usize,
    /// 1-based, in characters.
    pub column: usize,
    /// The field's dotted path (`resources.cpu`, `capabilities[2]`); `None` for TOML syntax errors.
    pub field: Option<String>,
    /// What was expected and what was found.
    pub message: String,
    /// The nearest valid name, for unknown fields.
    pub suggestion: Option<String>,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.path.display(), self.line, self.column)?;
        match &self.field {
            Some(field) => write!(f, "field `{field}`: {}", self.message)?,
            None => write!(f, "invalid TOML: {}", self.message)?,
        }
        if let Some(s) = &self.suggestion {
            write!(f, " (did you mean `{s}`?)")?;
        }
        Ok(())
    }
}

/// Every problem found in a manifest (never empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

/// Reads and parses the manifest at `path` (any file name, any directory).
///
/// # Errors
/// I/O errors, or every diagnostic (a file that is not UTF-8 is one diagnostic at 1:1).
pub fn load(path: &Path) -> crate::Result<(Manifest, Vec<u8>)> {
    let bytes = std::fs::read(path).map_err(|e| crate::PolicyError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        Diagnostics(vec![Diagnostic {
            path: path.to_path_buf(),
            line: 1,
            column: 1,
            field: None,
            message: format!("not UTF-8 ({e})"),
            suggestion: None,
        }])
    })?;
    let m = parse(path, text)?;
    Ok((m, bytes))
}

/// Byte offset to 1-based (line, column in chars).
pub fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(src.len());
    let mut at = offset;
    while !src.is_char_boundary(at) {
        at -= 1;
    }
    let before = &src[..at];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    (line, before[line_start..].chars().count() + 1)
}

/// Parses and validates one manifest. `path` is only used in messages.
///
/// # Errors
/// All the diagnostics found.
pub fn parse(path: &Path, src: &str) -> Result<Manifest, Diagnostics> {
    let mut p = Parser {
        path,
        src,
        diags: Vec::new(),
    };
    let doc = match toml_edit::Document::parse(src) {
        Ok(doc) => doc,
        Err(e) => {
            let offset = e.span().map(|r| r.start).unwrap_or(0);
            let msg = e.message().trim().replace('\n', " ");
            p.push_at(offset, None, msg, None);
            return Err(Diagnostics(p.diags));
        }
    };
    let manifest = p.manifest(doc.as_table());
    if p.diags.is_empty() {
        if let Some(m) = manifest {
            return Ok(m);
        }
    }
    if p.diags.is_empty() {
        p.push_at(0, None, "the manifest could not be read".into(), None);
    }
    p.diags.sort_by_key(|d| (d.line, d.column));
    Err(Diagnostics(p.diags))
}

/// (key, key span, value) of one table entry.
type Entry<'a> = (&'a str, Option<Range<usize>>, Node<'a>);
/// A quantity parser of [`quantity`].
type Quantity = fn(&str) -> Result<u64, String>;

/// A value in the document with its span: the parts of `toml_edit` that differ between tables and
/// inline tables, hidden.
#[derive(Clone, Copy)]
enum Node<'a> {
    Item(&'a Item),
    Value(&'a Value),
}

impl<'a> Node<'a> {
    fn span(self) -> Option<Range<usize>> {
        match self {
            Node::Item(i) => i.span(),
            Node::Value(v) => v.span(),
        }
    }

    fn value(self) -> Option<&'a Value> {
        match self {
            Node::Item(i) => i.as_value(),
            Node::Value(v) => Some(v),
        }
    }

    fn type_name(self) -> &'static str {
        match self {
            Node::Item(Item::Table(_)) => "a table",
            Node::Item(Item::ArrayOfTables(_)) => "an array of tables",
            Node::Item(Item::None) => "nothing",
            _ => match self.value() {
                Some(Value::String(_)) => "a string",
                Some(Value::Integer(_)) => "an integer",
                Some(Value::Float(_)) => "a float",
                Some(Value::Boolean(_)) => "a boolean",
                Some(Value::Datetime(_)) => "a date-time",
                Some(Value::Array(_)) => "an array",
                Some(Value::InlineTable(_)) => "a table",
                None => "nothing",
            },
        }
    }

    /// (key, key span, value) of a table or inline table.
    fn entries(self) -> Option<Vec<Entry<'a>>> {
        match self {
            Node::Item(Item::Table(t)) => Some(
                t.iter()
                    .map(|(k, v)| (k, t.key(k).and_then(|k| k.span()), Node::Item(v)))
                    .collect(),
            ),
            _ => match self.value() {
                Some(Value::InlineTable(t)) => Some(
                    t.iter()
                        .map(|(k, v)| (k, t.key(k).and_then(|k| k.span()), Node::Value(v)))
                        .collect(),
                ),
                _ => None,
            },
        }
    }
}

struct Parser<'a> {
    path: &'a Path,
    src: &'a str,
    diags: Vec<Diagnostic>,
}

impl Parser<'_> {
    fn push_at(
        &mut self,
        offset: usize,
        field: Option<&str>,
        message: String,
        suggestion: Option<&str>,
    ) {
        let (line, column) = line_col(self.src, offset);
        self.diags.push(Diagnostic {
            path: self.path.to_path_buf(),
            line,
            column,
            field: field.map(str::to_string),
            message,
            suggestion: suggestion.map(str::to_string),
        });
    }

    /// Reports at the value, else its key, else the start of the file.
    fn push(
        &mut self,
        node: Node<'_>,
        key_span: &Option<Range<usize>>,
        field: &str,
        message: String,
    ) {
        let offset = node
            .span()
            .or_else(|| key_span.clone())
            .map(|r| r.start)
            .unwrap_or(0);
        self.push_at(offset, Some(field), message, None);
    }

    fn unknown(
        &mut self,
        key: &str,
        key_span: &Option<Range<usize>>,
        prefix: &str,
        valid: &[&str],
    ) {
        let field = format!("{prefix}{key}");
        let names: Vec<String> = valid.iter().map(|v| format!("`{v}`")).collect();
        let message = format!("unknown field; expected one of {}", names.join(", "));
        let suggestion = suggest::nearest(key, valid).map(|s| format!("{prefix}{s}"));
        let offset = key_span.as_ref().map(|r| r.start).unwrap_or(0);
        self.push_at(offset, Some(&field), message, suggestion.as_deref());
    }

    fn string(&mut self, node: Node<'_>, ks: &Option<Range<usize>>, field: &str) -> Option<String> {
        match node.value() {
            Some(Value::String(s)) => Some(s.value().clone()),
            _ => {
                let found = node.type_name();
                self.push(node, ks, field, format!("expected a string, found {found}"));
                None
            }
        }
    }

    /// A string that must not be empty or only spaces.
    fn text(&mut self, node: Node<'_>, ks: &Option<Range<usize>>, field: &str) -> Option<String> {
        let s = self.string(node, ks, field)?;
        if s.trim().is_empty() {
            self.push(node, ks, field, "expected a non-empty string".into());
            return None;
        }
        Some(s)
    }

    /// An array of strings, each checked by `check` (which says what it expected).
    fn strings(
        &mut self,
        node: Node<'_>,
        ks: &Option<Range<usize>>,
        field: &str,
        check: impl Fn(&str) -> Result<(), String>,
    ) -> Option<Vec<String>> {
        let Some(Value::Array(arr)) = node.value() else {
            let found = node.type_name();
            self.push(
                node,
                ks,
                field,
                format!("expected an array of strings, found {found}"),
            );
            return None;
        };
        if arr.len() > MAX_LIST_ENTRIES {
            self.push(
                node,
                ks,
                field,
                format!(
                    "holds {} entries; a manifest may declare at most {MAX_LIST_ENTRIES}",
                    arr.len()
                ),
            );
            return None;
        }
        let mut out = Vec::new();
        let mut ok = true;
        for (i, v) in arr.iter().enumerate() {
            let f = format!("{field}[{i}]");
            match v {
                Value::String(s) => match check(s.value()) {
                    Ok(()) => out.push(s.value().clone()),
                    Err(msg) => {
                        self.push(Node::Value(v), ks, &f, msg);
                        ok = false;
                    }
                },
                _ => {
                    let found = Node::Value(v).type_name();
                    self.push(
                        Node::Value(v),
                        ks,
                        &f,
                        format!("expected a string, found {found}"),
                    );
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }

    fn manifest(&mut self, root: &toml_edit::Table) -> Option<Manifest> {
        let mut schema_version = None;
        let mut name = None;
        let mut version = None;
        let mut entry = None;
        let mut sandbox = None;
        let mut capabilities = Some(Vec::new());
        let mut oauth_scopes = Some(Vec::new());
        let mut resources = Some(Resources::default());
        let mut ui = Some(UiHints::default());
        let mut hooks = Some(Vec::new());
        for (key, item) in root.iter() {
            let ks = root.key(key).and_then(|k| k.span());
            let node = Node::Item(item);
            match key {
                "schema_version" => schema_version = self.schema_version(node, &ks),
                "name" => name = self.text(node, &ks, key),
                "version" => version = self.version(node, &ks),
                "entry" => entry = self.entry(node, &ks),
                "sandbox" => sandbox = self.sandbox(node, &ks),
                "capabilities" => {
                    capabilities = self.strings(node, &ks, key, |s| {
                        s.parse::<Capability>().map(|_| ()).map_err(|e| {
                            format!("expected a capability such as `files.read` or `network:api.github.com`: {e}")
                        })
                    })
                }
                "oauth_scopes" => {
                    oauth_scopes =
                        self.strings(node, &ks, key, |s| oauth_scope_capability(s).map(|_| ()))
                }
                "resources" => resources = self.resources(node, &ks),
                "ui" => ui = self.ui(node, &ks),
                "hooks" => {
                    hooks = self
                        .strings(node, &ks, key, |s| match s {
                            "shutdown" => Ok(()),
                            _ => Err(format!("expected a hook name: \"shutdown\", found \"{s}\"")),
                        })
                        .map(|names| names.iter().map(|_| Hook::Shutdown).collect());
                }
                other => self.unknown(other, &ks, "", TOP_FIELDS),
            }
        }
        for field in REQUIRED {
            if !root.contains_key(field) {
                let hint = if *field == "schema_version" {
                    format!(
                        "missing required field; expected `schema_version = \"{}\"` (run `metash agents migrate` to add it)",
                        MANIFEST_SCHEMA_VERSIONS.last().copied().unwrap_or("0.1")
                    )
                } else {
                    "missing required field".to_string()
                };
                self.push_at(0, Some(field), hint, None);
            }
        }
        Some(Manifest {
            schema_version: schema_version?,
            name: name?,
            version: version?,
            entry: entry?,
            sandbox: sandbox?,
            capabilities: capabilities?,
            oauth_scopes: oauth_scopes?,
            resources: resources?,
            ui: ui?,
            hooks: hooks?,
        })
    }

    fn schema_version(&mut self, node: Node<'_>, ks: &Option<Range<usize>>) -> Option<String> {
        let v = self.string(node, ks, "schema_version")?;
        if MANIFEST_SCHEMA_VERSIONS.contains(&v.as_str()) {
            return Some(v);
        }
        let supported: Vec<String> = MANIFEST_SCHEMA_VERSIONS
            .iter()
            .map(|v| format!("\"{v}\""))
            .collect();
        self.push(
            node,
            ks,
            "schema_version",
            format!(
                "unsupported schema version \"{v}\"; this build supports {}",
                supported.join(", ")
            ),
        );
        None
    }

    fn version(&mut self, node: Node<'_>, ks: &Option<Range<usize>>) -> Option<String> {
        let v = self.string(node, ks, "version")?;
        if is_semver(&v) {
            return Some(v);
        }
        self.push(
            node,
            ks,
            "version",
            format!("expected a semantic version such as \"0.1.0\", found \"{v}\""),
        );
        None
    }

    fn entry(&mut self, node: Node<'_>, ks: &Option<Range<usize>>) -> Option<String> {
        let v = self.text(node, ks, "entry")?;
        if v.contains('\0') {
            self.push(
                node,
                ks,
                "entry",
                "expected a file path, found a NUL character".into(),
            );
            return None;
        }
        Some(v)
    }

    fn sandbox(&mut self, node: Node<'_>, ks: &Option<Range<usize>>) -> Option<SandboxKind> {
        match self.string(node, ks, "sandbox")?.as_str() {
            "wasm" => Some(SandboxKind::Wasm),
            "native" => Some(SandboxKind::Native),
            other => {
                let suggestion = suggest::nearest(other, &["wasm", "native"]);
                let (line, column) = line_col(self.src, node.span().map(|r| r.start).unwrap_or(0));
                self.diags.push(Diagnostic {
                    path: self.path.to_path_buf(),
                    line,
                    column,
                    field: Some("sandbox".into()),
                    message: format!("expected \"wasm\" or \"native\", found \"{other}\""),
                    suggestion: suggestion.map(str::to_string),
                });
                None
            }
        }
    }

    fn table_entries<'n>(
        &mut self,
        node: Node<'n>,
        ks: &Option<Range<usize>>,
        field: &str,
    ) -> Option<Vec<Entry<'n>>> {
        let entries = node.entries();
        if entries.is_none() {
            let found = node.type_name();
            self.push(node, ks, field, format!("expected a table, found {found}"));
        }
        entries
    }

    fn resources(&mut self, node: Node<'_>, ks: &Option<Range<usize>>) -> Option<Resources> {
        let mut out = Resources::default();
        let mut ok = true;
        for (key, kspan, v) in self.table_entries(node, ks, "resources")? {
            let field = format!("resources.{key}");
            let (slot, check): (&mut Option<String>, Quantity) = match key {
                "cpu" => (&mut out.cpu, quantity::cpu_millis),
                "mem" => (&mut out.mem, quantity::mem_bytes),
                other => {
                    self.unknown(other, &kspan, "resources.", RESOURCE_FIELDS);
                    ok = false;
                    continue;
                }
            };
            match self.string(v, &kspan, &field) {
                Some(s) => match check(&s) {
                    Ok(_) => *slot = Some(s),
                    Err(msg) => {
                        self.push(v, &kspan, &field, format!("expected {msg}"));
                        ok = false;
                    }
                },
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    fn ui(&mut self, node: Node<'_>, ks: &Option<Range<usize>>) -> Option<UiHints> {
        let mut out = UiHints::default();
        let mut ok = true;
        for (key, kspan, v) in self.table_entries(node, ks, "ui")? {
            if key != "hints" {
                self.unknown(key, &kspan, "ui.", UI_FIELDS);
                ok = false;
                continue;
            }
            match self.strings(v, &kspan, "ui.hints", |s| {
                let good = !s.is_empty()
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
                if good {
                    Ok(())
                } else {
                    Err(format!("expected a hint name such as \"streaming\", \"diff\" or \"preview\", found \"{s}\""))
                }
            }) {
                Some(h) => out.hints = h,
                None => ok = false,
            }
        }
        ok.then_some(out)
    }
}

/// `MAJOR.MINOR.PATCH` with optional `-pre` and `+build` parts.
fn is_semver(v: &str) -> bool {
    let core = v.split(['-', '+']).next().unwrap_or("");
    let rest = &v[core.len()..];
    let nums: Vec<&str> = core.split('.').collect();
    let ident_ok = rest.is_empty()
        || (rest.len() > 1
            && rest[1..]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+')));
    nums.len() == 3
        && nums
            .iter()
            .all(|n| !n.is_empty() && n.len() < 20 && n.bytes().all(|b| b.is_ascii_digit()))
        && ident_ok
}

/// The capabilities a manifest declares, parsed: `capabilities`, plus `oauth_scopes` as `oauth:`
/// capabilities, plus `native` for `sandbox = "native"`. Entries that do not parse are skipped (a
/// manifest that passed [`parse`] has none).
pub fn declared(manifest: &Manifest) -> Vec<Capability> {
    let mut out: Vec<Capability> = manifest
        .capabilities
        .iter()
        .filter_map(|c| c.parse().ok())
        .chain(
            manifest
                .oauth_scopes
                .iter()
                .filter_map(|s| oauth_scope_capability(s).ok()),
        )
        .collect();
    if manifest.sandbox == SandboxKind::Native {
        out.push(Capability::new(crate::capability::Category::Native, None));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_chars() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        assert_eq!(line_col("é\nx", 3), (2, 1));
        assert_eq!(line_col("x", 99), (1, 2));
    }

    #[test]
    fn semver() {
        assert!(is_semver("0.1.0"));
        assert!(is_semver("1.2.3-beta.1+abc"));
        assert!(!is_semver("1.2"));
        assert!(!is_semver("v1.2.3"));
        assert!(!is_semver("1.2.3-"));
    }
}
