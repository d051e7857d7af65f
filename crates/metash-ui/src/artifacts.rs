//! Artifacts as previews (seed 002 §3 `media.preview`: "request rendering of images/video"). An
//! artifact is shown in the page only when it is an image or a video of a known type, and the
//! agent that saved it holds a live `media.preview` grant at the moment it is asked for: a
//! revoked or expired grant stops the next view. Anything else (HTML, SVG, scripts, unknown
//! types) is never served into the UI's origin: an agent's file must not run as the UI.
//!
//! A preview is served with its type from the allowlist (never sniffed), `nosniff`, and a
//! Content-Security-Policy that sandboxes it, so even a file that lies about its type cannot run.

use std::path::PathBuf;
use std::sync::Mutex;

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use metash_policy::consent;
use metash_policy::Category;
use metash_store::Store;
use serde::Serialize;

use crate::app::App;
use crate::owners::Owners;

/// The media types a preview may have, by file extension.
const MEDIA: &[(&str, &str)] = &[
    ("png", "image/png"),
    ("jpg", "image/jpeg"),
    ("jpeg", "image/jpeg"),
    ("gif", "image/gif"),
    ("webp", "image/webp"),
    ("avif", "image/avif"),
    ("mp4", "video/mp4"),
    ("webm", "video/webm"),
    ("ogv", "video/ogg"),
];

/// What the page may show for one artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Preview {
    pub id: String,
    /// The agent that saved it.
    pub agent: Option<String>,
    /// `image/png`, … when it may be shown.
    pub content_type: Option<String>,
    /// Why not, when it may not.
    pub refused: Option<String>,
    #[serde(skip)]
    pub path: Option<PathBuf>,
}

/// The media type of an artifact name, if it is one a preview may have.
pub fn media_type(id: &str) -> Option<&'static str> {
    let ext = id.rsplit_once('.')?.1.to_ascii_lowercase();
    MEDIA.iter().find(|(e, _)| *e == ext).map(|(_, t)| *t)
}

/// Whether `agent` holds a live `media.preview` grant now.
fn may_preview(store: &Store, agent: &str) -> metash_policy::Result<bool> {
    let now = store.now();
    Ok(consent::load_for(store, agent)?
        .iter()
        .any(|g| g.capability.category == Category::MediaPreview && g.active_at(now)))
}

/// Decides whether artifact `id` may be previewed now, and why not.
///
/// # Errors
/// The log or the grants cannot be read.
pub fn preview(store: &Store, owners: &Mutex<Owners>, id: &str) -> crate::Result<Preview> {
    let mut p = Preview {
        id: id.to_string(),
        agent: None,
        content_type: None,
        refused: None,
        path: None,
    };
    if metash_store::names::check(id, "artifact name").is_err() {
        p.refused = Some("not an artifact name".into());
        return Ok(p);
    }
    let path = store.artifacts().dir().join(id);
    if !path.is_file() {
        p.refused = Some("no such artifact (removed by retention, or never saved)".into());
        return Ok(p);
    }
    p.agent = owners
        .lock()
        .map_err(|_| crate::UiError::Refused("the artifact index is unusable".into()))?
        .lookup(store, id)?;
    let Some(ty) = media_type(id) else {
        p.refused = Some("only images and videos are previewed".into());
        return Ok(p);
    };
    match &p.agent {
        Some(agent) if may_preview(store, agent)? => {
            p.content_type = Some(ty.to_string());
            p.path = Some(path);
        }
        Some(agent) => {
            p.refused = Some(format!(
                "{agent} does not hold media.preview: previews of its artifacts are not shown"
            ));
        }
        None => p.refused = Some("no agent saved it".into()),
    }
    Ok(p)
}

/// `GET /preview/{id}`: whether the page may show it, and why not (JSON for the script).
pub(crate) async fn preview_info(State(app): State<App>, UrlPath(id): UrlPath<String>) -> Response {
    match preview(&app.store, &app.owners, &id) {
        Ok(p) => (
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_string(&p).unwrap_or_default(),
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `GET /artifact/{id}`: the bytes of a previewable artifact, sandboxed; 403 with the reason
/// otherwise.
pub(crate) async fn artifact(State(app): State<App>, UrlPath(id): UrlPath<String>) -> Response {
    let p = match preview(&app.store, &app.owners, &id) {
        Ok(p) => p,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let (Some(ty), Some(path)) = (p.content_type, p.path) else {
        let why = p.refused.unwrap_or_else(|| "not previewable".into());
        return (
            StatusCode::FORBIDDEN,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            why,
        )
            .into_response();
    };
    match tokio::fs::read(&path).await {
        Ok(bytes) => (
            [
                (header::CONTENT_TYPE, ty),
                // A file that lies about its type is still never run in the UI's origin.
                (
                    header::CONTENT_SECURITY_POLICY,
                    "default-src 'none'; sandbox".to_string(),
                ),
                (header::CONTENT_DISPOSITION, "inline".to_string()),
                (header::CACHE_CONTROL, "no-store".to_string()),
            ],
            bytes,
        )
            .into_response(),
        Err(e) => (StatusCode::NOT_FOUND, format!("{id}: {e}")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_images_and_videos_have_a_media_type() {
        assert_eq!(media_type("chart.PNG"), Some("image/png"));
        assert_eq!(media_type("clip.webm"), Some("video/webm"));
        for active in ["page.html", "logo.svg", "x.js", "noext", "a.png.html"] {
            assert_eq!(media_type(active), None, "{active}");
        }
    }
}
