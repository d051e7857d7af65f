//! Text an agent wrote, made safe to print on a person's terminal (issue 31).
//!
//! A terminal obeys bytes, not intent: an agent's output, checkpoint message, consent reason or
//! task title that carries `ESC ] 52 ; c ; …` writes the user's clipboard, `ESC ] 0 ; …` sets
//! the window title, `ESC ] 8 ; …` draws a link whose target is not its text, `\r` + `ESC [ 2K`
//! erases the line metash just drew so the agent can draw a harmless one instead, the one-byte
//! C1 CSI (U+009B) does what `ESC [` does on terminals that honour C1, and a bidirectional
//! override (U+202E) shows text in an order other than the one it has. Every place metash
//! prints agent-supplied text on a terminal passes it through [`sanitize_for_terminal`] (or
//! [`sanitize_line`] for a one-line field) so these show as visible escapes (`\x1b`,
//! `\u{202e}`) and do nothing. `--json` output is left alone: JSON is for programs, and its
//! escaping already covers C0. `--raw` (where offered) prints the agent's bytes as they are.
//!
//! What is escaped: C0 controls but newline and tab (`\r` included), DEL, the C1 controls
//! U+0080..U+009F, and the bidirectional marks, embeddings, overrides and isolates (U+061C,
//! U+200E, U+200F, U+202A..U+202E, U+2066..U+2069). A backslash is left as it is, so the
//! escaped form can be told from the same characters typed by the agent only by context; what
//! matters is that nothing reaches the terminal as a control.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether a newline may stay a newline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lines {
    /// Multi-line text (an agent's output, a checkpoint message): newlines and tabs stay.
    Keep,
    /// A field shown on one line (a title, an option, a consent reason): a newline would let
    /// the agent draw a line of its own that looks like metash's, so it is escaped too.
    Escape,
}

/// `text` with every terminal control in it shown as a visible escape; newlines and tabs
/// kept. Borrowed (no copy) when there is nothing to escape, which is the common case.
pub fn sanitize_for_terminal(text: &str) -> Cow<'_, str> {
    sanitize(text, Lines::Keep)
}

/// As [`sanitize_for_terminal`], for text shown on one line: newlines are escaped too (`\n`).
pub fn sanitize_line(text: &str) -> Cow<'_, str> {
    sanitize(text, Lines::Escape)
}

fn sanitize(text: &str, lines: Lines) -> Cow<'_, str> {
    let Some(first) = text.find(|c| must_escape(c, lines)) else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len() + 16);
    out.push_str(&text[..first]);
    for c in text[first..].chars() {
        if must_escape(c, lines) {
            escape(c, &mut out);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Whether `c` could act on a terminal, or reorder what is shown, instead of being shown.
fn must_escape(c: char, lines: Lines) -> bool {
    match c {
        '\t' => false,
        '\n' => lines == Lines::Escape,
        '\u{0}'..='\u{1f}' | '\u{7f}' | '\u{80}'..='\u{9f}' => true,
        _ => is_bidi_control(c),
    }
}

/// The bidirectional formatting characters (Unicode's `Bidi_Control` property).
fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
    )
}

/// The visible form: `\n`, `\r`, `\t` by name, other C0 and DEL as `\xNN`, the rest as
/// `\u{NNNN}` (Rust's own spelling, lower-case hex).
fn escape(c: char, out: &mut String) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{0}'..='\u{7f}' => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        _ => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        let text = "résumé: 3 files\n\tdone ✓ (日本語, עברית) C:\\path";
        assert!(matches!(sanitize_for_terminal(text), Cow::Borrowed(t) if t == text));
        assert!(matches!(
            sanitize_line("one line"),
            Cow::Borrowed("one line")
        ));
    }

    #[test]
    fn c0_controls_show_but_newline_and_tab_stay() {
        assert_eq!(sanitize_for_terminal("a\x1b[31mb"), "a\\x1b[31mb");
        assert_eq!(
            sanitize_for_terminal("bell\x07 nul\0"),
            "bell\\x07 nul\\x00"
        );
        assert_eq!(sanitize_for_terminal("a\nb\tc"), "a\nb\tc");
        assert_eq!(
            sanitize_for_terminal("\x08\x0b\x0c\x1f"),
            "\\x08\\x0b\\x0c\\x1f"
        );
    }

    #[test]
    fn carriage_return_and_erase_line_are_shown() {
        assert_eq!(
            sanitize_for_terminal("real\r\x1b[2Kfake"),
            "real\\r\\x1b[2Kfake"
        );
    }

    #[test]
    fn osc_sequences_are_inert() {
        let osc52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07";
        assert_eq!(
            sanitize_for_terminal(osc52),
            "\\x1b]52;c;ZWNobyBwd25lZA==\\x07"
        );
        let osc0 = "\x1b]0;title\x1b\\";
        assert_eq!(sanitize_for_terminal(osc0), "\\x1b]0;title\\x1b\\");
        let osc8 = "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\";
        let shown = sanitize_for_terminal(osc8);
        assert!(!shown.contains('\x1b'), "{shown}");
        assert!(shown.contains("\\x1b]8;;https://evil.example/"), "{shown}");
    }

    #[test]
    fn del_and_c1_controls_are_shown() {
        assert_eq!(sanitize_for_terminal("a\x7fb"), "a\\x7fb");
        assert_eq!(sanitize_for_terminal("\u{9b}2K"), "\\u{9b}2K");
        assert_eq!(
            sanitize_for_terminal("\u{80}\u{85}\u{9f}"),
            "\\u{80}\\u{85}\\u{9f}"
        );
        // Just outside the C1 range: shown as it is.
        assert_eq!(sanitize_for_terminal("\u{a0}é"), "\u{a0}é");
    }

    #[test]
    fn bidirectional_controls_are_shown() {
        assert_eq!(
            sanitize_for_terminal("allow \u{202e}txt.exe"),
            "allow \\u{202e}txt.exe"
        );
        for c in [
            '\u{061c}', '\u{200e}', '\u{200f}', '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}',
            '\u{202e}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
        ] {
            let shown = sanitize_for_terminal(&c.to_string()).into_owned();
            assert_eq!(shown, format!("\\u{{{:x}}}", c as u32));
        }
        // Neighbours that are not controls stay.
        assert_eq!(
            sanitize_for_terminal("\u{200d}\u{2070}"),
            "\u{200d}\u{2070}"
        );
    }

    #[test]
    fn one_line_fields_escape_newlines_too() {
        assert_eq!(
            sanitize_line("harmless\nmetash: agent x asks for `nothing`"),
            "harmless\\nmetash: agent x asks for `nothing`"
        );
        assert_eq!(sanitize_line("a\tb\r"), "a\tb\\r");
    }
}
