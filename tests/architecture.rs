//! The library's shape, kept by a test: its top-level modules depend on
//! each other without a loop, and so do its files, the command line's and
//! the Python extension's (no two files import each other, directly or
//! around a circle);
//! `unsafe` appears only in the modules allowed to hold it (each block with
//! a `// SAFETY:` comment, which clippy checks), and the library does not
//! depend on the command line's crates.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

#[path = "architecture/files.rs"]
mod files;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// Files, relative to `src/`, that may contain `unsafe`.
const UNSAFE_ALLOWED: &[&str] = &[
    "platform/",
    "arena/region/",
    "arena/buf.rs",
    "arena/cache.rs",
    "loader/batch.rs",
    "loader/engine.rs",
    "staged/",
    "shared/",
    "storage/device.rs",
    "storage/write/",
    "storage/safetensors/save.rs",
    "measure/",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("src is readable") {
        let p = e.expect("a directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without its comments (doc links name modules too, but
/// are not dependencies).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level module a file belongs to (`lib` for lib.rs).
fn top_module(rel: &Path) -> String {
    let first = rel
        .components()
        .next()
        .expect("a path under src")
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    first.trim_end_matches(".rs").to_string()
}

/// The top-level modules a file's code names through `crate::`.
fn uses(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let tops: BTreeSet<String> = files
        .iter()
        .map(|f| top_module(f.strip_prefix(SRC).expect("under src")))
        .collect();
    for f in &files {
        let from = top_module(f.strip_prefix(SRC).expect("under src"));
        let text = std::fs::read_to_string(f).expect("a source file");
        let deps = g.entry(from.clone()).or_default();
        for to in uses(&code(&text)) {
            // Re-exports of the crate root's own names (`crate::Result`)
            // and macros are not modules.
            if to != from && tops.contains(&to) {
                deps.insert(to);
            }
        }
    }
    g
}

/// A cycle in `g`, if any, as the modules along it.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let start = path.iter().position(|p| p == n).unwrap_or(0);
                let mut c = path[start..].to_vec();
                c.push(n.to_string());
                return Some(c);
            }
            _ => {}
        }
        state.insert(n.to_string(), 1);
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if let Some(c) = visit(n, g, &mut state, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_module_graph_has_no_loop() {
    let g = graph();
    // Only the crate root, the umbrella error and the internals module
    // gather the domains; the domains sit below them.
    for (from, deps) in &g {
        if !["lib", "internals", "error", "measure"].contains(&from.as_str()) {
            for top in ["error", "internals", "measure"] {
                assert!(
                    !deps.contains(top),
                    "{from} depends on {top}, which sits above the domains"
                );
            }
        }
    }
    assert_eq!(find_cycle(&g), None, "module graph: {g:#?}");
}

#[test]
fn the_cycle_finder_finds_a_planted_cycle() {
    let mut g = graph();
    g.entry("platform".into())
        .or_default()
        .insert("topology".into());
    assert!(
        find_cycle(&g).is_some(),
        "topology uses platform; the reverse edge closes a loop"
    );
}

#[test]
fn unsafe_stays_in_the_platform_and_memory_modules() {
    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    for f in files {
        let rel = f
            .strip_prefix(SRC)
            .expect("under src")
            .to_string_lossy()
            .into_owned();
        let text = code(&std::fs::read_to_string(&f).expect("a source file"));
        let has_unsafe = text
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|w| w == "unsafe");
        if has_unsafe {
            assert!(
                UNSAFE_ALLOWED.iter().any(|a| rel.starts_with(a)),
                "src/{rel} uses unsafe outside the modules allowed to"
            );
        }
    }
}

#[test]
fn the_library_does_not_depend_on_the_command_line() {
    let manifest =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|s| s.split("\n[").next())
        .expect("a [dependencies] table");
    assert!(
        !deps.lines().any(|l| l.trim_start().starts_with("clap")),
        "the library depends on clap"
    );
}

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Import loops between files that changes in flight elsewhere remove:
/// each entry is the exact set of files of one loop. The lead empties it
/// as those changes land (a loop that is gone must leave the list: the
/// test says so); any other loop fails the test.
const KNOWN_FILE_LOOPS: &[&[&str]] = &[];

/// The crates whose files are checked: the library, the command line (its
/// library and binary roots, whichever exist) and the Python package's
/// extension module.
fn crate_roots() -> Vec<PathBuf> {
    [
        "src/lib.rs",
        "cli/src/lib.rs",
        "cli/src/main.rs",
        "python/src/lib.rs",
    ]
    .iter()
    .map(|r| Path::new(ROOT).join(r))
    .filter(|p| p.is_file())
    .collect()
}

/// The import loops between the files of the crate rooted at `root`.
fn file_loops(root: &Path, shown_from: &Path) -> Vec<Vec<String>> {
    files::loops(&files::Crate::read(root, shown_from).graph())
}

#[test]
fn no_two_files_import_each_other() {
    let roots = crate_roots();
    assert!(
        roots.len() >= 3,
        "the library, the command line and the Python extension are all read: {roots:?}"
    );
    let mut found: Vec<Vec<String>> = Vec::new();
    for root in roots {
        for l in file_loops(&root, Path::new(ROOT)) {
            if !found.contains(&l) {
                found.push(l);
            }
        }
    }
    let known: Vec<Vec<String>> = KNOWN_FILE_LOOPS
        .iter()
        .map(|l| l.iter().map(|f| f.to_string()).collect())
        .collect();
    let new: Vec<&Vec<String>> = found.iter().filter(|l| !known.contains(l)).collect();
    let gone: Vec<&Vec<String>> = known.iter().filter(|l| !found.contains(l)).collect();
    assert!(
        new.is_empty(),
        "files that import each other (directly or around a circle): {new:#?}"
    );
    assert!(
        gone.is_empty(),
        "these loops are gone: remove them from KNOWN_FILE_LOOPS: {gone:#?}"
    );
}

#[test]
fn the_file_loop_finder_finds_planted_loops_and_only_them() {
    let dir = tempfile::tempdir().unwrap();
    let write = |rel: &str, text: &str| {
        let p = dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    // A parent and its children use each other freely; `a` and `b` do
    // not, and `d` reaches `a` only through its inline tests.
    write("lib.rs", "mod a;\nmod b;\nmod c;\npub struct Shared;\n");
    write("a.rs", "use crate::b::f;\npub fn h() { f() }\n");
    write(
        "b.rs",
        "// crate::a::h in a comment is no use\npub fn f() { let _ = \"super::a::h\"; }\n",
    );
    write(
        "c/mod.rs",
        "mod d;\npub use d::D;\npub fn e() { d::D::new(); }\n",
    );
    write(
        "c/d.rs",
        "use super::super::Shared;\npub struct D;\n#[cfg(test)]\nmod tests {\n    use super::super::e;\n    #[test]\n    fn t() { crate::a::h() }\n}\n",
    );
    let root = dir.path().join("lib.rs");
    assert_eq!(file_loops(&root, dir.path()), Vec::<Vec<String>>::new());
    write("b.rs", "pub fn f() { super::a::h() }\n");
    assert_eq!(
        file_loops(&root, dir.path()),
        vec![vec!["a.rs".to_string(), "b.rs".into()]]
    );
    write(
        "a.rs",
        "use crate::{b::f, c::{self, e}};\npub fn h() { f(); e() }\n",
    );
    write("b.rs", "pub fn f() {}\n");
    assert_eq!(
        file_loops(&root, dir.path()),
        vec![vec!["a.rs".to_string(), "c/d.rs".into(), "c/mod.rs".into()]],
        "a -> c -> d -> a, through d's tests"
    );
}
