//! The import graph between the files of a crate, read from its source.
//!
//! The crate's files are found the way the compiler finds them: from the
//! root file (`lib.rs`, `main.rs`) through each `mod NAME;`. In each file,
//! with comments, strings and character literals set aside, every `use`
//! tree and every path written in the code (`crate::a::b::f`,
//! `super::x::Y`, `child::g`) is resolved against the module tree to the
//! deepest module that has a file of its own; that file is what the path
//! depends on.
//!
//! A file's uses of the modules that enclose it are not counted: a child
//! uses its parent's shared types, which the parent declares for its
//! children (and re-exports of them). Every other use is, the parent's of
//! its children included, and a loop is a set of files each reachable
//! from every other (a strongly connected component of more than one
//! file).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path from the crate root (`[]` is the root itself).
type ModPath = Vec<String>;

/// A token of Rust source, as far as paths are concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Open,
    Close,
    Comma,
    Semi,
    Star,
    Other,
}

/// The length of the string, raw string or character literal starting at
/// `i`, if one does (`b"..."`, `r#"..."#`, `'x'`, `'\n'`; a lifetime is
/// not a literal).
fn literal_len(s: &str, i: usize) -> Option<usize> {
    let b = s.as_bytes();
    let mut j = i;
    if b[j] == b'b' {
        j += 1;
    }
    if j < b.len() && b[j] == b'r' && (b.get(j + 1) == Some(&b'"') || b.get(j + 1) == Some(&b'#')) {
        let hashes = b[j + 1..].iter().take_while(|&&c| c == b'#').count();
        let open = j + 1 + hashes;
        if b.get(open) != Some(&b'"') {
            return None;
        }
        let close = format!("\"{}", "#".repeat(hashes));
        let end = s[open + 1..].find(&close)? + open + 1 + close.len();
        return Some(end - i);
    }
    match b.get(j) {
        Some(b'"') => {
            let mut k = j + 1;
            while k < b.len() && b[k] != b'"' {
                k += if b[k] == b'\\' { 2 } else { 1 };
            }
            Some(k + 1 - i)
        }
        Some(b'\'') => {
            if b.get(j + 1) == Some(&b'\\') {
                let end = s[j + 3..].find('\'')? + j + 3;
                return Some(end + 1 - i);
            }
            let c = s[j + 1..].chars().next()?;
            (s.as_bytes().get(j + 1 + c.len_utf8()) == Some(&b'\''))
                .then_some(j + 2 + c.len_utf8() - i)
        }
        _ => None,
    }
}

/// The length of the comment starting at `i`, if one does (block comments
/// nest).
fn comment_len(s: &str, i: usize) -> Option<usize> {
    let rest = &s[i..];
    if rest.starts_with("//") {
        return Some(rest.find('\n').unwrap_or(rest.len()));
    }
    if !rest.starts_with("/*") {
        return None;
    }
    let (mut depth, mut k) = (0usize, 0usize);
    while k < rest.len() {
        if rest[k..].starts_with("/*") {
            depth += 1;
            k += 2;
        } else if rest[k..].starts_with("*/") {
            depth -= 1;
            k += 2;
            if depth == 0 {
                return Some(k);
            }
        } else {
            k += 1;
        }
    }
    Some(rest.len())
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The tokens of `s` that paths are made of; everything else is `Other`.
fn tokens(s: &str) -> Vec<Tok> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if let Some(n) = comment_len(s, i).or_else(|| literal_len(s, i)) {
            out.push(Tok::Other);
            i += n;
            continue;
        }
        let c = b[i];
        let start = if c == b'$' || (c == b'r' && b.get(i + 1) == Some(&b'#')) {
            i + if c == b'$' { 1 } else { 2 }
        } else {
            i
        };
        if start < b.len() && is_ident_start(b[start]) && (start == i || is_ident(b[start])) {
            let end = start + b[start..].iter().take_while(|&&c| is_ident(c)).count();
            let word = &s[start..end];
            out.push(Tok::Ident(if c == b'$' {
                format!("${word}")
            } else {
                word.to_string()
            }));
            i = end;
            continue;
        }
        let tok = match c {
            b':' if b.get(i + 1) == Some(&b':') => {
                i += 1;
                Tok::Sep
            }
            b'{' => Tok::Open,
            b'}' => Tok::Close,
            b',' => Tok::Comma,
            b';' => Tok::Semi,
            b'*' => Tok::Star,
            c if c.is_ascii_whitespace() => {
                i += 1;
                continue;
            }
            _ => Tok::Other,
        };
        out.push(tok);
        i += 1;
    }
    out
}

fn ident(t: Option<&Tok>) -> Option<&str> {
    match t {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

/// The paths of the `use` tree starting at `toks[*i]`, each with `prefix`
/// before it; `*i` ends past the tree.
fn use_tree(toks: &[Tok], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    while let Some(t) = toks.get(*i) {
        *i += 1;
        match t {
            Tok::Sep => {}
            Tok::Ident(s) => {
                path.push(s.clone());
                if toks.get(*i) == Some(&Tok::Sep) {
                    continue;
                }
                if ident(toks.get(*i)) == Some("as") {
                    *i += 2;
                }
                if path.last().is_some_and(|l| l == "self") && path.len() > 1 {
                    path.pop();
                }
                out.push(path);
                return;
            }
            Tok::Open => {
                while toks.get(*i).is_some_and(|t| *t != Tok::Close) {
                    use_tree(toks, i, &path, out);
                    if toks.get(*i) == Some(&Tok::Comma) {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            Tok::Star => {
                out.push(path);
                return;
            }
            _ => return,
        }
    }
}

/// What one file names: the `mod NAME;` it declares, and every path it
/// writes with the inline module (`mod tests { ... }`) it is written in.
#[derive(Debug, Default)]
struct Named {
    children: Vec<String>,
    paths: Vec<(ModPath, Vec<String>)>,
}

/// Reads `toks`: declarations, `use` trees and paths in the code.
fn named(toks: &[Tok]) -> Named {
    let mut n = Named::default();
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let here = || inline.iter().map(|(m, _)| m.clone()).collect::<ModPath>();
        match &toks[i] {
            Tok::Open => depth += 1,
            Tok::Close => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Ident(w) if w == "mod" => {
                if let Some(name) = ident(toks.get(i + 1)) {
                    match toks.get(i + 2) {
                        Some(Tok::Semi) => n.children.push(name.to_string()),
                        Some(Tok::Open) => inline.push((name.to_string(), depth + 1)),
                        _ => {}
                    }
                }
            }
            Tok::Ident(w) if w == "use" => {
                let (at, mut found) = (here(), Vec::new());
                i += 1;
                use_tree(toks, &mut i, &[], &mut found);
                n.paths.extend(found.into_iter().map(|p| (at.clone(), p)));
                continue;
            }
            Tok::Ident(w)
                if toks.get(i + 1) == Some(&Tok::Sep) && (i == 0 || toks[i - 1] != Tok::Sep) =>
            {
                let mut path = vec![w.clone()];
                while toks.get(i + 1) == Some(&Tok::Sep) {
                    match ident(toks.get(i + 2)) {
                        Some(s) => path.push(s.to_string()),
                        None => break,
                    }
                    i += 2;
                }
                n.paths.push((here(), path));
            }
            _ => {}
        }
        i += 1;
    }
    n
}

/// A crate's files and the modules they hold.
pub(crate) struct Crate {
    /// Where the crate's paths are shown from (the workspace).
    shown_from: PathBuf,
    /// Each module that has a file of its own, with the file.
    modules: BTreeMap<ModPath, PathBuf>,
    /// What each file names.
    named: BTreeMap<PathBuf, (ModPath, Named)>,
}

impl Crate {
    /// The crate whose root file is `root` (`src/lib.rs`); files are shown
    /// relative to `shown_from`.
    pub(crate) fn read(root: &Path, shown_from: &Path) -> Self {
        let mut c = Crate {
            shown_from: shown_from.to_path_buf(),
            modules: BTreeMap::new(),
            named: BTreeMap::new(),
        };
        let dir = root
            .parent()
            .expect("a root file in a folder")
            .to_path_buf();
        let mut queue = vec![(root.to_path_buf(), ModPath::new(), dir)];
        while let Some((file, module, dir)) = queue.pop() {
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let n = named(&tokens(&text));
            for child in &n.children {
                let (own, nested) = (dir.join(format!("{child}.rs")), dir.join(child));
                let child_file = if own.is_file() {
                    own
                } else {
                    nested.join("mod.rs")
                };
                let mut m = module.clone();
                m.push(child.clone());
                queue.push((child_file, m, nested));
            }
            c.modules.insert(module.clone(), file.clone());
            c.named.insert(file, (module, n));
        }
        c
    }

    /// The module a path written in `at` names, down to the deepest one
    /// with a file; `None` for other crates and local names.
    fn resolve(&self, at: &[String], path: &[String]) -> Option<ModPath> {
        let first = path.first()?;
        let (mut base, rest): (ModPath, &[String]) = match first.as_str() {
            "crate" | "$crate" => (Vec::new(), &path[1..]),
            "self" => (at.to_vec(), &path[1..]),
            "super" => {
                let ups = path.iter().take_while(|s| *s == "super").count();
                let keep = at.len().checked_sub(ups)?;
                (at[..keep].to_vec(), &path[ups..])
            }
            _ => {
                let mut child = at.to_vec();
                child.push(first.clone());
                if !self.modules.contains_key(&child) {
                    return None;
                }
                (at.to_vec(), path)
            }
        };
        base.extend(rest.iter().cloned());
        (0..=base.len())
            .rev()
            .map(|n| base[..n].to_vec())
            .find(|m| self.modules.contains_key(m))
    }

    fn shown(&self, file: &Path) -> String {
        file.strip_prefix(&self.shown_from)
            .unwrap_or(file)
            .display()
            .to_string()
    }

    /// Each file with the files it depends on (but the files of the
    /// modules enclosing it).
    pub(crate) fn graph(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut g = BTreeMap::new();
        for (file, (module, n)) in &self.named {
            let deps: &mut BTreeSet<String> = g.entry(self.shown(file)).or_default();
            for (inline, path) in &n.paths {
                let mut at = module.clone();
                at.extend(inline.iter().cloned());
                let Some(target) = self.resolve(&at, path) else {
                    continue;
                };
                if module.starts_with(&target) {
                    continue;
                }
                deps.insert(self.shown(&self.modules[&target]));
            }
        }
        g
    }
}

/// The loops of `g`: each set of two or more files that reach each other,
/// sorted.
pub(crate) fn loops(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for m in g.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    todo.push(m.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> = g.keys().map(|k| (k, reach(k))).collect();
    let mut out: BTreeSet<Vec<String>> = BTreeSet::new();
    for (a, from_a) in &reached {
        let group: Vec<String> = from_a
            .iter()
            .filter(|b| *b != *a && reached.get(b).is_some_and(|r| r.contains(*a)))
            .chain(std::iter::once(*a))
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if group.len() > 1 {
            out.insert(group);
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_strings_and_lifetimes_are_not_paths() {
        let t = tokens(
            "use a::{b, c::d as e}; // crate::x\n/* crate::y /* nested */ crate::z */ \
             let s = \"crate::q\"; let r = r#\"crate::\"w\"#; fn f<'a>(x: &'a str) -> char { '{' } \
             crate::real::path();",
        );
        let n = named(&t);
        let paths: Vec<Vec<String>> = n.paths.into_iter().map(|(_, p)| p).collect();
        let want: Vec<Vec<String>> = vec![
            vec!["a".into(), "b".into()],
            vec!["a".into(), "c".into(), "d".into()],
            vec!["crate".into(), "real".into(), "path".into()],
        ];
        assert_eq!(paths, want);
    }
}
