//! `metash agents migrate`: upgrades a manifest written before versioning (no `schema_version`) to
//! schema v0.1, changing nothing else: comments, order, spacing and line endings are kept byte for
//! byte. The new line goes after a leading comment block that is separated by a blank line (the
//! file's header), else at the very top, so it never splits a comment from the key it documents.
//! `toml_edit` checks the input parses before and that the output parses after.

use std::path::{Path, PathBuf};

use metash_protocol::MANIFEST_SCHEMA_VERSIONS;

use crate::manifest::{line_col, Diagnostic, Diagnostics};

/// One change a migration makes (or would make).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// 1-based line in the migrated file.
    pub line: usize,
    pub description: String,
    /// The text added.
    pub added: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    pub path: PathBuf,
    /// Empty when the manifest is already versioned.
    pub changes: Vec<Change>,
    /// The migrated text (the input when there are no changes).
    pub output: String,
}

/// The version migrations write.
pub fn target_version() -> &'static str {
    MANIFEST_SCHEMA_VERSIONS.last().copied().unwrap_or("0.1")
}

/// Computes the migration of `src` (read from `path`). Writes nothing.
///
/// # Errors
/// The TOML syntax error, located, when `src` does not parse.
pub fn migrate(path: &Path, src: &str) -> Result<Migration, Diagnostics> {
    let version = target_version();
    add_version_key(
        path,
        src,
        &format!("schema_version = \"{version}\""),
        &format!("added `schema_version = \"{version}\"` (the manifest predates versioning)"),
    )
}

/// Adds the top-level line `added` (`schema_version = …`) to a TOML file that has no
/// `schema_version`, keeping everything else byte for byte; no change when it has one. Shared by
/// manifests and `config.toml`.
///
/// # Errors
/// The TOML syntax error, located, when `src` does not parse.
pub fn add_version_key(
    path: &Path,
    src: &str,
    added: &str,
    description: &str,
) -> Result<Migration, Diagnostics> {
    let doc = toml_edit::Document::parse(src).map_err(|e| {
        let (line, column) = line_col(src, e.span().map(|r| r.start).unwrap_or(0));
        Diagnostics(vec![Diagnostic {
            path: path.to_path_buf(),
            line,
            column,
            field: None,
            message: e.message().trim().replace('\n', " "),
            suggestion: None,
        }])
    })?;
    if doc.as_table().contains_key("schema_version") {
        return Ok(Migration {
            path: path.to_path_buf(),
            changes: Vec::new(),
            output: src.to_string(),
        });
    }
    let eol = if src.contains("\r\n") { "\r\n" } else { "\n" };
    let added = added.to_string();
    let offset = insertion_offset(src);
    let mut output = String::with_capacity(src.len() + added.len() + 2);
    output.push_str(&src[..offset]);
    if offset > 0 && !src[..offset].ends_with('\n') {
        output.push_str(eol);
    }
    output.push_str(&added);
    output.push_str(eol);
    output.push_str(&src[offset..]);
    let line = line_col(&output, offset).0;
    if toml_edit::Document::parse(output.as_str()).is_err() {
        return Err(Diagnostics(vec![Diagnostic {
            path: path.to_path_buf(),
            line,
            column: 1,
            field: Some("schema_version".into()),
            message: "could not be added without breaking the file; add it by hand".into(),
            suggestion: None,
        }]));
    }
    Ok(Migration {
        path: path.to_path_buf(),
        changes: vec![Change {
            line,
            description: description.to_string(),
            added,
        }],
        output,
    })
}

/// Byte offset of the line to insert before: after a leading block of comment lines that ends in a
/// blank line, else 0.
fn insertion_offset(src: &str) -> usize {
    let mut offset = 0;
    let mut saw_comment = false;
    for line in src.split_inclusive('\n') {
        let t = line.trim();
        if t.starts_with('#') {
            saw_comment = true;
            offset += line.len();
        } else if t.is_empty() && saw_comment {
            return offset + line.len();
        } else {
            return 0;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_after_a_header_block_only() {
        assert_eq!(insertion_offset("# h\n\nname = 1\n"), 5);
        assert_eq!(insertion_offset("# about name\nname = 1\n"), 0);
        assert_eq!(insertion_offset("name = 1\n"), 0);
        assert_eq!(insertion_offset(""), 0);
    }

    #[test]
    fn keeps_crlf() {
        let m = migrate(Path::new("m.toml"), "# h\r\n\r\nname = \"x\"\r\n");
        let out = m.map(|m| m.output).unwrap_or_default();
        assert_eq!(
            out,
            "# h\r\n\r\nschema_version = \"0.1\"\r\nname = \"x\"\r\n"
        );
    }
}
