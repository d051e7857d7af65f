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

/// The live children of `pid`, by scanning `/proc` (no `children` file needed).
pub fn children(pid: i32) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .filter(|&p| parent(p) == Some(pid) && alive(p))
        .collect()
}

/// The parent of `pid`, from `/proc/<pid>/stat`.
fn parent(pid: i32) -> Option<i32> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s[s.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The PID namespace `pid` is in (`pid:[inode]`).
pub fn pid_namespace(pid: i32) -> Option<String> {
    fs::read_link(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|p| p.display().to_string())
}

/// The process that runs an agent's program, from the pid its host spawned: that process itself,
/// or, where the sandbox made a PID namespace (`super::pidns`), the namespace's pid 2: the
/// spawned process's child when the spawned process is the namespace's init (a native agent,
/// `super::vspawn`), its grandchild when it waits outside (a confined CLI: its child is the init).
pub fn program(pid: i32) -> i32 {
    let inner = if inner_pid(pid) == Some(1) {
        Some(pid)
    } else {
        let outer = pid_namespace(pid);
        children(pid)
            .into_iter()
            .find(|&c| pid_namespace(c).is_some_and(|ns| Some(&ns) != outer.as_ref()))
    };
    // The program is pid 2 there (orphans the init adopted are children of it too).
    inner
        .and_then(|init| {
            children(init)
                .into_iter()
                .find(|&c| inner_pid(c) == Some(2))
        })
        .unwrap_or(pid)
}

/// `pid`'s number in its innermost PID namespace (the last field of `NSpid`).
fn inner_pid(pid: i32) -> Option<i32> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// Live processes in the PID namespace `ns` (host pids).
pub fn namespace_members(ns: &str) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .filter(|&p| pid_namespace(p).as_deref() == Some(ns) && alive(p))
        .collect()
}
