//! POSIX shell quoting for `displayCommand`, which is for people to copy and paste; `argv` stays
//! the authoritative form.

/// Quotes one word so a POSIX shell reads it back unchanged.
pub fn quote_word(word: &str) -> String {
    let safe = !word.is_empty()
        && word.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'-' | b'_' | b'.' | b'/' | b':' | b'=' | b',' | b'+' | b'@' | b'%'
                )
        });
    if safe {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', r#"'\''"#))
}

/// `env K=V ... argv...` as one shell line, with the `cd` first so it runs from the right place.
pub fn display_command(
    cwd: &str,
    env: &std::collections::BTreeMap<String, String>,
    argv: &[String],
) -> String {
    let mut parts = vec!["cd".to_string(), quote_word(cwd), "&&".to_string()];
    if !env.is_empty() {
        parts.push("env".to_string());
        parts.extend(env.iter().map(|(k, v)| format!("{k}={}", quote_word(v))));
    }
    parts.extend(argv.iter().map(|a| quote_word(a)));
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_what_a_shell_would_split_or_expand() {
        assert_eq!(quote_word("plain-arg"), "plain-arg");
        assert_eq!(quote_word(""), "''");
        assert_eq!(quote_word("two words"), "'two words'");
        assert_eq!(quote_word("it's"), r#"'it'\''s'"#);
        assert_eq!(quote_word("$HOME"), "'$HOME'");
        assert_eq!(quote_word("a\nb"), "'a\nb'");
    }
}
