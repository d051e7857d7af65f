//! Which git configuration keys are executable: they name a program git (or a tool git starts,
//! such as git-lfs) may run, or they decide which programs and files run (an include, a hooks
//! directory, the work tree git writes). The list is documented in docs/orchestrator.md ("Git
//! trust"); a key not on it cannot make git run anything.

/// Whether `key` (as `git config --list` prints it) with `value` is executable configuration.
pub(crate) fn executable(key: &str, value: &str) -> bool {
    let key = key.to_ascii_lowercase();
    let Some((section, rest)) = key.split_once('.') else {
        return false;
    };
    let (sub, name) = match rest.rsplit_once('.') {
        Some((s, n)) => (Some(s), n),
        None => (None, rest),
    };
    match sub {
        None => plain(section, name),
        Some(sub) => with_subsection(section, sub, name, value),
    }
}

/// `section.name` keys.
fn plain(section: &str, name: &str) -> bool {
    matches!(
        (section, name),
        (
            "core",
            "fsmonitor"
                | "hookspath"
                | "sshcommand"
                | "editor"
                | "pager"
                | "askpass"
                | "gitproxy"
                | "alternaterefscommand"
                | "attributesfile"
                | "worktree"
                | "virtualfilesystem"
        ) | ("diff", "external" | "tool" | "guitool")
            | ("merge", "tool" | "guitool")
            | ("credential", "helper")
            | ("gpg", "program")
            | ("include", "path")
            | ("uploadpack", "packobjectshook")
            | ("sequence", "editor")
            | ("interactive", "difffilter")
            | ("imap", "tunnel")
            | ("web" | "help", "browser")
            | ("man", "viewer")
            | ("lfs", "standalonetransferagent")
            | ("extensions", "worktreeconfig")
            | ("init", "templatedir")
            | ("instaweb", "httpd")
            | ("alias" | "pager" | "protocol", _)
    ) || (section == "sendemail" && (name.ends_with("cmd") || name == "smtpserver"))
}

/// `section.subsection.name` keys.
fn with_subsection(section: &str, sub: &str, name: &str, value: &str) -> bool {
    match section {
        "filter" | "difftool" | "mergetool" | "guitool" | "alias" | "pager" | "protocol" => true,
        "diff" => matches!(name, "command" | "textconv"),
        "merge" => name == "driver",
        "credential" => name == "helper",
        "gpg" => matches!(name, "program" | "defaultkeycommand"),
        "includeif" => name == "path",
        "submodule" => name == "update",
        "trailer" => matches!(name, "command" | "cmd"),
        "browser" | "man" => matches!(name, "cmd" | "path"),
        "sendemail" => name.ends_with("cmd") || name == "smtpserver",
        "lfs" => sub.starts_with("customtransfer.") || sub.starts_with("extension."),
        // A transport helper (`ext::sh -c ...` runs a command; `x::` runs git-remote-x).
        "remote" => match name {
            "uploadpack" | "receivepack" | "vcs" => true,
            "url" | "pushurl" => value.contains("::"),
            _ => false,
        },
        "url" => sub.contains("::"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::executable;

    #[test]
    fn programs_are_executable_and_plain_settings_are_not() {
        for k in [
            "core.fsmonitor",
            "core.hooksPath",
            "filter.evil.clean",
            "filter.lfs.process",
            "filter.x.required",
            "diff.pdf.textconv",
            "diff.x.command",
            "merge.ours.driver",
            "credential.https://example.com.helper",
            "include.path",
            "includeIf.gitdir:/x/.path",
            "gpg.ssh.program",
            "uploadpack.packObjectsHook",
            "alias.st",
            "lfs.customtransfer.x.path",
            "submodule.m.update",
        ] {
            assert!(executable(k, "x"), "{k}");
        }
        for k in [
            "core.bare",
            "user.name",
            "diff.pdf.binary",
            "merge.renames",
            "remote.origin.url",
            "branch.main.remote",
            "core",
        ] {
            assert!(!executable(k, "https://example.com/r.git"), "{k}");
        }
        assert!(executable("remote.origin.url", "ext::sh -c evil"));
    }
}
