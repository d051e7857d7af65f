//! Seed 003 §3.2's `attachments`: files that go with a non-interactive turn's prompt. A path is
//! relative to the turn's `cwd` or absolute; it must be a regular file of at most
//! [`MAX_BYTES`]; an image (PNG, JPEG, GIF, WebP, by its first bytes) goes to the model as an
//! image, anything else must be UTF-8 text and goes as text, wrapped in
//! `<attachment path="…">…</attachment>` so the model knows where it came from. Everything is
//! checked before a request is made or a process started: a bad attachment fails the turn with
//! its path and the reason, and nothing is sent.

use std::path::Path;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::error::{HarnessError, Result};

/// The largest attachment (providers cap images near this size).
pub const MAX_BYTES: u64 = 20 * 1024 * 1024;

/// What an attachment holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    Text(String),
    Image {
        media_type: &'static str,
        base64: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// As given in the request (what the model is told).
    pub name: String,
    pub content: Content,
}

impl Attachment {
    /// A text attachment as the model reads it.
    pub fn wrapped(&self, text: &str) -> String {
        format!("<attachment path=\"{}\">\n{text}\n</attachment>", self.name)
    }

    /// `data:` URL of an image (OpenAI's wires).
    fn data_url(media_type: &str, base64: &str) -> String {
        format!("data:{media_type};base64,{base64}")
    }

    /// Anthropic Messages content block.
    pub fn anthropic_block(&self) -> Value {
        match &self.content {
            Content::Text(t) => json!({"type": "text", "text": self.wrapped(t)}),
            Content::Image { media_type, base64 } => json!({"type": "image",
                "source": {"type": "base64", "media_type": media_type, "data": base64}}),
        }
    }

    /// OpenAI Responses input content part.
    pub fn responses_part(&self) -> Value {
        match &self.content {
            Content::Text(t) => json!({"type": "input_text", "text": self.wrapped(t)}),
            Content::Image { media_type, base64 } => {
                json!({"type": "input_image", "image_url": Self::data_url(media_type, base64)})
            }
        }
    }

    /// OpenAI chat completions content part.
    pub fn chat_part(&self) -> Value {
        match &self.content {
            Content::Text(t) => json!({"type": "text", "text": self.wrapped(t)}),
            Content::Image { media_type, base64 } => json!({"type": "image_url",
                "image_url": {"url": Self::data_url(media_type, base64)}}),
        }
    }
}

/// The image type its first bytes say, if any.
fn image_type(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if head.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if head.len() >= 12 && &head[..4] == b"RIFF" && &head[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// Reads and checks every attachment, in order.
///
/// # Errors
/// [`HarnessError::InvalidRequest`] naming the attachment: missing, not a regular file, too
/// large, or neither an image nor UTF-8 text.
pub fn load(cwd: &Path, names: &[String]) -> Result<Vec<Attachment>> {
    names.iter().map(|name| load_one(cwd, name)).collect()
}

fn load_one(cwd: &Path, name: &str) -> Result<Attachment> {
    let bad = |why: String| HarnessError::InvalidRequest(format!("attachment `{name}`: {why}"));
    let path = cwd.join(name);
    let meta = std::fs::metadata(&path).map_err(|e| bad(format!("{e}")))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    if meta.len() > MAX_BYTES {
        return Err(bad(format!(
            "{} bytes, more than the {MAX_BYTES} an attachment may have",
            meta.len()
        )));
    }
    let bytes = std::fs::read(&path).map_err(|e| bad(format!("{e}")))?;
    let content =
        match image_type(&bytes) {
            Some(media_type) => Content::Image {
                media_type,
                base64: base64::engine::general_purpose::STANDARD.encode(&bytes),
            },
            None => Content::Text(String::from_utf8(bytes).map_err(|_| {
                bad("neither an image (PNG, JPEG, GIF, WebP) nor UTF-8 text".into())
            })?),
        };
    Ok(Attachment {
        name: name.to_string(),
        content,
    })
}

/// For frontends whose prompt is text only (the CLI-driven `agent-sdk` and `pi-sdk`): the text
/// attachments before the prompt.
///
/// # Errors
/// An image: those reach the model through the API frontends only, and are refused rather than
/// silently dropped.
pub fn inline_into_prompt(prompt: &str, attachments: &[Attachment]) -> Result<String> {
    let mut out = String::new();
    for a in attachments {
        match &a.content {
            Content::Text(t) => {
                out.push_str(&a.wrapped(t));
                out.push_str("\n\n");
            }
            Content::Image { .. } => {
                return Err(HarnessError::InvalidRequest(format!(
                    "attachment `{}` is an image: this frontend's prompt is text; images reach \
                     the model through the anthropic-api, openai-responses and openai-chat \
                     frontends",
                    a.name
                )))
            }
        }
    }
    out.push_str(prompt);
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    #[test]
    fn images_and_text_are_told_apart_and_bad_ones_named() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        std::fs::write(ws.join("notes.md"), "# notes").unwrap();
        std::fs::write(ws.join("shot.png"), PNG).unwrap();
        std::fs::write(ws.join("blob.bin"), [0xff, 0xfe, 0x00, 0x81]).unwrap();
        let got = load(ws, &["notes.md".into(), "shot.png".into()]).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].content, Content::Text("# notes".into()));
        assert!(matches!(
            &got[1].content,
            Content::Image {
                media_type: "image/png",
                ..
            }
        ));
        assert_eq!(
            got[0].anthropic_block()["text"],
            "<attachment path=\"notes.md\">\n# notes\n</attachment>"
        );
        assert!(got[1].responses_part()["image_url"]
            .as_str()
            .is_some_and(|u| u.starts_with("data:image/png;base64,iVBORw0KGgo")));
        for (name, why) in [
            ("blob.bin", "neither an image"),
            ("missing.txt", "No such file"),
            (".", "not a regular file"),
        ] {
            let err = load(ws, &[name.into()]).unwrap_err().to_string();
            assert!(err.contains(name) && err.contains(why), "{name}: {err}");
        }
        let text = inline_into_prompt("go", &got[..1]).unwrap();
        assert!(text.starts_with("<attachment path=\"notes.md\">") && text.ends_with("\n\ngo"));
        assert!(inline_into_prompt("go", &got).is_err());
    }
}
