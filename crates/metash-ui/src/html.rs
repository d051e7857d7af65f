//! Escaping text for HTML: the one function every page, card and graph goes through, kept here
//! below them all so that the page builders ([`crate::pages`]) and what they embed
//! ([`crate::dag`], [`crate::diffview`], [`crate::projects`]) need not import each other.

/// HTML-escapes text for element content and quoted attributes.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
