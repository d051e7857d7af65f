//! Looking for processes that should be gone.

/// Pids of live (not zombie) processes whose command line, args joined by spaces, contains
/// `needle`.
pub fn live_processes(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if state(pid) != 'Z'
            && String::from_utf8_lossy(&cmd)
                .replace('\0', " ")
                .contains(needle)
        {
            out.push(pid);
        }
    }
    out
}

/// Pids of live processes whose command line contains `needle` and whose working directory is
/// `dir` or under it: one test's processes, not another's running the same program at the same
/// time. (A process whose directory cannot be read is not counted: a test using this shows it
/// finds the process while it runs.)
pub fn live_processes_under(needle: &str, dir: &std::path::Path) -> Vec<i32> {
    live_processes(needle)
        .into_iter()
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(dir))
        })
        .collect()
}

/// Every regular file under `dir`, symlinks not followed (where a test looks for a leaked key).
pub fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() {
            out.extend(files_under(&p));
        } else if m.is_file() {
            out.push(p);
        }
    }
    out
}

/// The state letter of `pid` in `/proc/PID/stat` (`S` sleeping, `T` stopped, `Z` zombie…), `?`
/// when it is gone.
pub fn state(pid: i32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')')
        .next()
        .and_then(|r| r.trim_start().chars().next())
        .unwrap_or('?')
}
