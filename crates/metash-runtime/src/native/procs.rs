//! Finding processes by process group through `/proc`: how the runtime (and the tests) prove that
//! nothing an agent started survives it.

use std::fs;

/// Live (non-zombie) members of process group `pgid`.
pub fn group_members(pgid: i32) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if let Some((state, pgrp)) = stat(pid) {
            if pgrp == pgid && state != 'Z' && state != 'X' {
                out.push(pid);
            }
        }
    }
    out
}

/// `(state, pgrp)` of `pid` from `/proc/<pid>/stat`.
pub fn stat(pid: i32) -> Option<(char, i32)> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let mut it = rest.split_whitespace();
    let state = it.next()?.chars().next()?;
    let _ppid = it.next()?;
    let pgrp = it.next()?.parse().ok()?;
    Some((state, pgrp))
}

/// Whether `pid` exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|(s, _)| s != 'Z' && s != 'X')
}
