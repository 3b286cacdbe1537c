//! The text report: one line per check, verdict first, its fix under it;
//! the huge page pools; what did not run; the counts.

use numapin::doctor::{Check, Verdict};
use numapin::system::HugePages;
use numapin::text::{fmt_bytes, Table};

use super::report::Report;

/// `memlock`, `pcie_link (GPU 0)`, `pin_probe (node 1)`.
fn subject(c: &Check) -> String {
    match c.subject.label() {
        Some(l) => format!("{} ({l})", c.name),
        None => c.name.to_string(),
    }
}

/// The whole report as text.
pub(super) fn render(r: &Report) -> String {
    let mut out = String::new();
    if r.source == "live" {
        out.push_str("numapin doctor: this machine\n\n");
    } else {
        out.push_str(&format!(
            "numapin doctor: {} (a saved machine: only the checks of its topology)\n\n",
            r.source
        ));
    }
    let width = r.checks.iter().map(|c| subject(c).len()).max().unwrap_or(0);
    for c in &r.checks {
        let v = match c.verdict {
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
            _ => "ok",
        };
        out.push_str(&format!("{v:<4}  {:<width$}  {}\n", subject(c), c.evidence));
        if let Some(fix) = &c.fix {
            out.push_str(&format!("      {:<width$}  fix: {fix}\n", ""));
        }
    }
    if let Some(h) = r.huge_pages {
        out.push('\n');
        out.push_str(&pools(h));
    }
    if !r.not_run.is_empty() {
        let names: Vec<&str> = r.not_run.iter().map(|n| n.name).collect();
        out.push_str(&format!(
            "\nnot run: {} ({})\n",
            names.join(", "),
            r.not_run[0].reason
        ));
    }
    let s = &r.summary;
    out.push_str(&format!(
        "\n{} checks: {} ok, {} warn, {} fail\n",
        r.checks.len(),
        s.ok,
        s.warn,
        s.fail
    ));
    out
}

/// The huge pages section: the THP mode, then one line per node and page
/// size.
fn pools(h: &HugePages) -> String {
    let mut out = format!(
        "huge pages: THP enabled {}, defrag {}; hugetlb pools per node:\n",
        h.thp_enabled.as_deref().unwrap_or("not readable"),
        h.thp_defrag.as_deref().unwrap_or("not readable")
    );
    if let Some(e) = &h.error {
        out.push_str(&format!("  {e}\n"));
        return out;
    }
    if h.pools.is_empty() {
        out.push_str("  none (no node has a hugepages folder)\n");
        return out;
    }
    let mut t = Table::new(["NODE", "PAGE", "TOTAL", "FREE", "SURPLUS"]);
    let n = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
    for r in &h.pools {
        let mut row = vec![
            r.node.to_string(),
            fmt_bytes(r.page_bytes),
            n(r.total()),
            n(r.free()),
            n(r.surplus()),
        ];
        if let Err(e) = &r.counts {
            row.push(e.to_string());
        }
        t.row(row);
    }
    for line in t.render().lines() {
        out.push_str(&format!("  {line}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake root holding `files` (path, contents).
    fn root(files: &[(String, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (p, c) in files {
            let p = d.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, c).unwrap();
        }
        d
    }

    /// THP in `madvise` mode and 2 MiB pools of `(node, nr_hugepages)`,
    /// all free.
    fn tree(pools: &[(u32, &'static str)]) -> tempfile::TempDir {
        let mut files = vec![
            (
                "sys/kernel/mm/transparent_hugepage/enabled".to_string(),
                "[madvise] never",
            ),
            (
                "sys/kernel/mm/transparent_hugepage/defrag".to_string(),
                "[madvise] never",
            ),
        ];
        for &(node, total) in pools {
            let dir = format!("sys/devices/system/node/node{node}/hugepages/hugepages-2048kB");
            for (f, v) in [("nr", total), ("free", total), ("surplus", "0")] {
                files.push((format!("{dir}/{f}_hugepages"), v));
            }
        }
        root(&files)
    }

    fn read(root: &std::path::Path) -> HugePages {
        let thp = numapin::system::Thp::read_under(root);
        HugePages::read_under(root, &thp, true)
    }

    #[test]
    fn pools_are_a_table_per_node_and_size() {
        let r = tree(&[(0, "0"), (1, "512")]);
        let text = pools(&read(r.path()));
        assert_eq!(
            text,
            "huge pages: THP enabled madvise, defrag madvise; hugetlb pools per node:\n  NODE  PAGE   TOTAL  FREE  SURPLUS\n  0     2 MiB  0      0     0\n  1     2 MiB  512    512   0\n"
        );
    }

    #[test]
    fn unreadable_pools_say_why() {
        let r = tempfile::tempdir().unwrap();
        let text = pools(&read(r.path()));
        assert!(
            text.starts_with(
                "huge pages: THP enabled not readable, defrag not readable; hugetlb pools per node:\n  cannot list "
            ),
            "{text}"
        );
        std::fs::create_dir_all(r.path().join("sys/devices/system/node/node0")).unwrap();
        assert!(pools(&read(r.path())).ends_with("  none (no node has a hugepages folder)\n"));
        // Garbage in a file: the row shows unknown counts and the problem.
        let r = tree(&[(0, "many"), (1, "8")]);
        let text = pools(&read(r.path()));
        assert!(
            text.contains("  0     2 MiB  ?      ?     ?        "),
            "{text}"
        );
        assert!(
            text.contains("holds \"many\", not a page count\n"),
            "{text}"
        );
        assert!(text.contains("  1     2 MiB  8      8     0\n"), "{text}");
    }
}
