//! A crate's module tree, read from its source the way rustc finds it (from `lib.rs`, `main.rs`
//! and `bin/*.rs`, following `mod NAME;` and `#[path]`), with each module's references to other
//! modules of the crate (`use crate::…`, `super::…`, `self::…`, grouped `use` trees, and paths
//! written inline in code) and each function's length. Code under `#[cfg(test)]` is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::lex::{tokens, Kind, Tok};

/// A module's path inside its crate (`[]` is the crate root).
pub type ModPath = Vec<String>;

/// One reference from a module to a path of the same crate.
#[derive(Debug, Clone)]
pub struct Ref {
    pub from: ModPath,
    /// The path as written, `crate`/`super`/`self` resolved: from the crate root.
    pub to: Vec<String>,
    pub file: PathBuf,
    pub line: usize,
}

/// A function with a body, outside test code.
#[derive(Debug, Clone)]
pub struct FnLen {
    pub file: PathBuf,
    pub name: String,
    pub line: usize,
    /// From the line of `fn` to the line of its closing brace, both included.
    pub lines: usize,
}

/// One crate root's modules (with the file each lives in), references and functions.
#[derive(Debug, Default)]
pub struct Crate {
    pub modules: BTreeMap<ModPath, PathBuf>,
    pub refs: Vec<Ref>,
    pub fns: Vec<FnLen>,
}

/// Reads a file; `None` when it is not there.
pub type Read<'a> = &'a dyn Fn(&Path) -> Option<String>;

/// The crate whose root file is `root` (`src/lib.rs`, `src/main.rs`, `src/bin/x.rs`).
pub fn load(root: &Path, read: Read<'_>) -> Crate {
    let mut krate = Crate::default();
    let dir = root.parent().map(Path::to_path_buf).unwrap_or_default();
    load_file(&mut krate, root, Vec::new(), &dir, read);
    krate
}

fn load_file(krate: &mut Crate, file: &Path, module: ModPath, dir: &Path, read: Read<'_>) {
    let Some(src) = read(file) else { return };
    krate.modules.insert(module.clone(), file.to_path_buf());
    let toks = tokens(&src);
    let mut scan = Scan { krate, file, read };
    scan.region(&toks, &module, dir);
}

struct Scan<'k, 'r> {
    krate: &'k mut Crate,
    file: &'k Path,
    read: Read<'r>,
}

/// Index just past the bracket matching the one at `open` (or the end).
fn matching(t: &[Tok], open: usize) -> usize {
    let mut depth = 0i64;
    for (k, tok) in t.iter().enumerate().skip(open) {
        if tok.kind != Kind::Punct {
            continue;
        }
        match tok.text.as_str() {
            "{" | "(" | "[" => depth += 1,
            "}" | ")" | "]" => {
                depth -= 1;
                if depth == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    t.len()
}

/// Index just past the item starting at `i`: its `;` or its braced body, whichever comes first
/// outside brackets.
fn item_end(t: &[Tok], i: usize) -> usize {
    let mut k = i;
    while k < t.len() {
        match t[k].text.as_str() {
            _ if t[k].kind != Kind::Punct => k += 1,
            ";" => return k + 1,
            "{" => return matching(t, k),
            "(" | "[" => k = matching(t, k),
            _ => k += 1,
        }
    }
    t.len()
}

impl Scan<'_, '_> {
    /// The tokens of one module (a file, or an inline `mod NAME { … }`), whose children's files
    /// are under `dir`.
    fn region(&mut self, t: &[Tok], module: &ModPath, dir: &Path) {
        let (mut test, mut path_attr): (bool, Option<String>) = (false, None);
        let mut i = 0;
        while i < t.len() {
            if t[i].is("#") {
                let inner = t.get(i + 1).is_some_and(|x| x.is("!"));
                let open = i + 1 + usize::from(inner);
                if t.get(open).is_some_and(|x| x.is("[")) {
                    let end = matching(t, open);
                    let attr = &t[open + 1..end.saturating_sub(1)];
                    let words: Vec<&str> = attr.iter().map(|x| x.text.as_str()).collect();
                    // `#![cfg(test)]` would be a whole test module: none is written so.
                    test |= !inner && words == ["cfg", "(", "test", ")"];
                    if words.len() == 3 && words[0] == "path" && words[1] == "=" {
                        path_attr = Some(words[2].trim_matches('"').to_string());
                    }
                    i = end;
                    continue;
                }
            }
            if std::mem::take(&mut test) {
                i = item_end(t, i);
                path_attr = None;
                continue;
            }
            i = self.token(t, i, module, dir, &mut path_attr);
        }
    }

    /// Reads what starts at `t[i]`; the index to go on from.
    fn token(
        &mut self,
        t: &[Tok],
        i: usize,
        module: &ModPath,
        dir: &Path,
        path_attr: &mut Option<String>,
    ) -> usize {
        let next = t.get(i + 1);
        match t[i].ident() {
            Some("mod") if next.and_then(Tok::ident).is_some() => {
                let name = t[i + 1].text.clone();
                let mut child = module.clone();
                child.push(name.clone());
                let attr = path_attr.take();
                if t.get(i + 2).is_some_and(|x| x.is("{")) {
                    let end = matching(t, i + 2);
                    self.region(&t[i + 3..end.saturating_sub(1)], &child, &dir.join(&name));
                    self.krate.modules.insert(child, self.file.to_path_buf());
                    return end;
                }
                self.child_file(child, &name, dir, attr);
                i + 2
            }
            Some("use") => {
                let end = item_end(t, i);
                let mut paths = Vec::new();
                let mut pos = i + 1;
                use_tree(&t[..end], &mut pos, Vec::new(), &mut paths);
                for p in paths {
                    self.reference(module, &p, t[i].line);
                }
                end
            }
            Some("crate" | "super" | "self") if next.is_some_and(|x| x.is("::")) => {
                let mut segs = vec![t[i].text.clone()];
                let mut k = i + 1;
                while t.get(k).is_some_and(|x| x.is("::")) {
                    match t.get(k + 1).and_then(Tok::ident) {
                        Some(s) => segs.push(s.to_string()),
                        None => break,
                    }
                    k += 2;
                }
                self.reference(module, &segs, t[i].line);
                k
            }
            Some("fn") if next.and_then(Tok::ident).is_some() => {
                self.function(t, i);
                i + 1
            }
            _ => {
                if t[i].is(";") || t[i].is("{") || t[i].is("}") {
                    *path_attr = None;
                }
                i + 1
            }
        }
    }

    /// `mod NAME;`: NAME.rs or NAME/mod.rs under `dir`, or the `#[path]` given.
    fn child_file(&mut self, child: ModPath, name: &str, dir: &Path, attr: Option<String>) {
        let candidates = match attr {
            Some(p) => vec![self.file.parent().unwrap_or(dir).join(p)],
            None => vec![
                dir.join(format!("{name}.rs")),
                dir.join(name).join("mod.rs"),
            ],
        };
        for file in candidates {
            if (self.read)(&file).is_some() {
                let is_mod_rs = file.file_name().is_some_and(|f| f == "mod.rs");
                let child_dir = match (is_mod_rs, file.parent()) {
                    (true, Some(p)) => p.to_path_buf(),
                    _ => dir.join(name),
                };
                load_file(self.krate, &file, child, &child_dir, self.read);
                return;
            }
        }
    }

    /// A function's length, when it has a body.
    fn function(&mut self, t: &[Tok], i: usize) {
        let mut k = i + 2;
        while k < t.len() {
            match t[k].text.as_str() {
                _ if t[k].kind != Kind::Punct => k += 1,
                ";" => return,
                "(" | "[" => k = matching(t, k),
                "{" => {
                    let end = matching(t, k);
                    let last = t.get(end.saturating_sub(1)).map_or(t[i].line, |x| x.line);
                    self.krate.fns.push(FnLen {
                        file: self.file.to_path_buf(),
                        name: t[i + 1].text.clone(),
                        line: t[i].line,
                        lines: last + 1 - t[i].line,
                    });
                    return;
                }
                _ => k += 1,
            }
        }
    }

    /// Records `segs` (as written in `module`) when it names a path of this crate.
    fn reference(&mut self, module: &ModPath, segs: &[String], line: usize) {
        let Some(to) = absolute(module, segs) else {
            return;
        };
        self.krate.refs.push(Ref {
            from: module.clone(),
            to,
            file: self.file.to_path_buf(),
            line,
        });
    }
}

/// `segs` from the crate root, when it starts with `crate`, `super` or `self`.
fn absolute(module: &ModPath, segs: &[String]) -> Option<Vec<String>> {
    let mut base = match segs.first()?.as_str() {
        "crate" => Vec::new(),
        "super" | "self" => module.clone(),
        _ => return None,
    };
    let mut rest = &segs[usize::from(segs[0] != "super")..];
    while let Some((first, tail)) = rest.split_first() {
        match first.as_str() {
            "super" => {
                base.pop()?;
            }
            "self" => {}
            _ => break,
        }
        rest = tail;
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The paths a `use` tree names, each with its prefix (`use a::{b, c::{d, e as f}, g::*}` names
/// `a::b`, `a::c::d`, `a::c::e`, `a::g`); `self` in a group names the prefix.
fn use_tree(t: &[Tok], pos: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut segs = prefix;
    while let Some(tok) = t.get(*pos) {
        if tok.is("::") {
            *pos += 1;
        } else if tok.is("{") {
            *pos += 1;
            while let Some(x) = t.get(*pos) {
                if x.is("}") {
                    *pos += 1;
                    break;
                }
                if x.is(",") {
                    *pos += 1;
                    continue;
                }
                let before = *pos;
                use_tree(t, pos, segs.clone(), out);
                if *pos == before {
                    *pos += 1;
                }
            }
            return;
        } else if tok.is("*") {
            *pos += 1;
            out.push(segs);
            return;
        } else if let Some(id) = tok.ident() {
            segs.push(id.to_string());
            *pos += 1;
            if !t.get(*pos).is_some_and(|x| x.is("::")) {
                if t.get(*pos).is_some_and(|x| x.is("as")) {
                    *pos += 2;
                }
                if segs.len() > 1 && segs.last().is_some_and(|s| s == "self") {
                    segs.pop();
                }
                out.push(segs);
                return;
            }
        } else {
            return;
        }
    }
}

impl Crate {
    /// The module a crate path lands in: its longest prefix that is a module.
    pub fn module_of(&self, path: &[String]) -> ModPath {
        (0..=path.len())
            .rev()
            .map(|k| path[..k].to_vec())
            .find(|p| self.modules.contains_key(p))
            .unwrap_or_default()
    }

    /// Edges between modules neither of which contains the other, each with the first place
    /// that makes it.
    pub fn edges(&self) -> BTreeMap<(ModPath, ModPath), (PathBuf, usize)> {
        let mut out = BTreeMap::new();
        for r in &self.refs {
            let to = self.module_of(&r.to);
            if to.starts_with(&r.from) || r.from.starts_with(&to) {
                continue;
            }
            out.entry((r.from.clone(), to))
                .or_insert_with(|| (r.file.clone(), r.line));
        }
        out
    }

    /// The cycles among [`Crate::edges`]: for every module on one, the shortest cycle through
    /// it, each cycle once (rotated to start at its least module).
    pub fn cycles(&self) -> Vec<Vec<ModPath>> {
        let edges = self.edges();
        let mut next: BTreeMap<&ModPath, BTreeSet<&ModPath>> = BTreeMap::new();
        for (a, b) in edges.keys() {
            next.entry(a).or_default().insert(b);
        }
        let mut seen: BTreeSet<Vec<ModPath>> = BTreeSet::new();
        let mut out = Vec::new();
        for start in next.keys() {
            if let Some(cycle) = shortest_cycle(&next, start) {
                let k = (0..cycle.len()).min_by_key(|&k| &cycle[k]).unwrap_or(0);
                let canon: Vec<ModPath> = cycle[k..].iter().chain(&cycle[..k]).cloned().collect();
                if seen.insert(canon.clone()) {
                    out.push(canon);
                }
            }
        }
        out
    }
}

/// The shortest path from `start` back to itself (breadth first), without the repeated end.
fn shortest_cycle(
    next: &BTreeMap<&ModPath, BTreeSet<&ModPath>>,
    start: &ModPath,
) -> Option<Vec<ModPath>> {
    let mut came_from: BTreeMap<&ModPath, &ModPath> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(at) = queue.pop_front() {
        for &to in next.get(at).into_iter().flatten() {
            if to == start {
                let mut path = vec![at.clone()];
                let mut k = at;
                while k != start {
                    k = came_from[&k];
                    path.push(k.clone());
                }
                path.reverse();
                return Some(path);
            }
            if let std::collections::btree_map::Entry::Vacant(e) = came_from.entry(to) {
                e.insert(at);
                queue.push_back(to);
            }
        }
    }
    None
}
