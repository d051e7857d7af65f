//! Seed 002 section 2's capability categories: the closed set every layer names (the policy
//! parses and decides, the runtime enforces, the host grants). The grammar of scopes and what
//! covers what stay in `metash-policy`.

/// A capability category. `native` is declared by `sandbox = "native"`, not listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    FilesRead,
    FilesWrite,
    Network,
    MediaPreview,
    Codegen,
    Memory,
    ProcessSpawn,
    Native,
    Oauth,
}

impl Category {
    pub const ALL: &'static [Category] = &[
        Category::FilesRead,
        Category::FilesWrite,
        Category::Network,
        Category::MediaPreview,
        Category::Codegen,
        Category::Memory,
        Category::ProcessSpawn,
        Category::Native,
        Category::Oauth,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Category::FilesRead => "files.read",
            Category::FilesWrite => "files.write",
            Category::Network => "network",
            Category::MediaPreview => "media.preview",
            Category::Codegen => "codegen",
            Category::Memory => "memory",
            Category::ProcessSpawn => "process.spawn",
            Category::Native => "native",
            Category::Oauth => "oauth",
        }
    }

    /// Every category's name, for error messages.
    pub fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|c| c.as_str()).collect()
    }
}
