//! The `huge_pages` check and the pools section of the report: each NUMA
//! node's hugetlb pools (total, free and surplus pages of each size) and the
//! transparent huge page mode, and what arena regions get from them under
//! the default `HugePages::Auto` (hugetlb pages when the node's pool has
//! enough free for a region, else transparent huge pages).
//!
//! [`HugePagesView::read`] reads sysfs under a root (`/` on this machine),
//! so tests use fake trees of machines with several nodes; the check is a
//! pure function of the view and the topology.

use std::path::Path;

use serde::Serialize;

use super::system::selected;
use super::Check;
use numapin::internals::{fmt_bytes, hugetlb};
use numapin::runtime::DEFAULT_REGION_BYTES;
use numapin::topology::Topology;

const NAME: &str = "huge_pages";

/// One node's pool of one page size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct PoolRow {
    /// The node.
    pub(crate) node: u32,
    /// Bytes per page.
    pub(crate) page_bytes: u64,
    /// Pages in the pool (`nr_hugepages`), `None` when unreadable.
    pub(crate) total: Option<u64>,
    /// Pages nobody has faulted in (`free_hugepages`).
    pub(crate) free: Option<u64>,
    /// Pages beyond the pool under overcommit (`surplus_hugepages`).
    pub(crate) surplus: Option<u64>,
    /// Why the counts could not be read (the file and the problem).
    pub(crate) error: Option<String>,
}

/// The huge page settings of this machine, as the check reads them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct HugePagesView {
    /// The THP mode (`always`, `madvise`, `never`), `None` when unreadable.
    pub(crate) thp_enabled: Option<String>,
    /// The THP defrag mode, `None` when unreadable.
    pub(crate) thp_defrag: Option<String>,
    /// Whether the kernel has `MADV_POPULATE_WRITE` (Linux 5.14), without
    /// which `HugePages::Auto` never takes hugetlb pages.
    pub(crate) madv_populate_write: bool,
    /// Every node's pool of every size, by node then size.
    pub(crate) pools: Vec<PoolRow>,
    /// Why the nodes could not be listed.
    pub(crate) error: Option<String>,
}

impl HugePagesView {
    /// Reads the pools and the THP files under `root`.
    pub(crate) fn read(root: &Path, madv_populate_write: bool) -> Self {
        let (enabled, defrag) = hugetlb::thp_files(root);
        let word = |t: Option<String>| t.as_deref().and_then(selected).map(str::to_string);
        let (pools, error) = match hugetlb::node_pools(root) {
            Ok(p) => (
                p.into_iter()
                    .map(|p| match p.counts {
                        Ok(c) => PoolRow {
                            node: p.node,
                            page_bytes: p.page_bytes,
                            total: Some(c.total),
                            free: Some(c.free),
                            surplus: Some(c.surplus),
                            error: None,
                        },
                        Err(e) => PoolRow {
                            node: p.node,
                            page_bytes: p.page_bytes,
                            total: None,
                            free: None,
                            surplus: None,
                            error: Some(e.to_string()),
                        },
                    })
                    .collect(),
                None,
            ),
            Err(e) => (
                Vec::new(),
                Some(format!(
                    "cannot list {}: {e}",
                    root.join("sys/devices/system/node").display()
                )),
            ),
        };
        HugePagesView {
            thp_enabled: word(enabled),
            thp_defrag: word(defrag),
            madv_populate_write,
            pools,
            error,
        }
    }

    fn row(&self, node: u32, page_bytes: u64) -> Option<&PoolRow> {
        self.pools
            .iter()
            .find(|r| r.node == node && r.page_bytes == page_bytes)
    }

    /// The section of the text report: the THP mode, then one line per
    /// node and page size.
    pub(crate) fn render(&self) -> String {
        let mut out = format!(
            "huge pages: THP enabled {}, defrag {}; hugetlb pools per node:\n",
            self.thp_enabled.as_deref().unwrap_or("not readable"),
            self.thp_defrag.as_deref().unwrap_or("not readable")
        );
        if let Some(e) = &self.error {
            out.push_str(&format!("  {e}\n"));
            return out;
        }
        if self.pools.is_empty() {
            out.push_str("  none (no node has a hugepages folder)\n");
            return out;
        }
        let mut t =
            numapin::internals::table::Table::new(["NODE", "PAGE", "TOTAL", "FREE", "SURPLUS"]);
        let n = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
        for r in &self.pools {
            let mut row = vec![
                r.node.to_string(),
                fmt_bytes(r.page_bytes),
                n(r.total),
                n(r.free),
                n(r.surplus),
            ];
            if let Some(e) = &r.error {
                row.push(e.clone());
            }
            t.row(row);
        }
        for line in t.render().lines() {
            out.push_str(&format!("  {line}\n"));
        }
        out
    }
}

/// The nodes whose pools matter: those of the GPUs this process sees, or,
/// with none, every node with memory it may use; and how to say so.
fn nodes_that_matter(t: &Topology) -> (Vec<u32>, &'static str) {
    let mut gpu_nodes: Vec<u32> = t
        .gpus
        .iter()
        .filter(|g| g.cuda_ordinal.is_some())
        .filter_map(|g| g.numa_node)
        .collect();
    gpu_nodes.sort_unstable();
    gpu_nodes.dedup();
    if !gpu_nodes.is_empty() {
        return (gpu_nodes, "each GPU's node");
    }
    let nodes = t
        .numa_nodes
        .iter()
        .filter(|n| n.memory_bytes > 0)
        .filter(|n| t.allowed.numa_nodes.is_empty() || t.allowed.numa_nodes.contains(&n.os_index))
        .map(|n| n.os_index)
        .collect();
    (nodes, "each node with memory")
}

/// `2 MiB: 800 free of 1024` (`, 3 surplus`), for one node's pools.
fn node_words(v: &HugePagesView, node: u32) -> String {
    let sizes: Vec<String> = v
        .pools
        .iter()
        .filter(|r| r.node == node && r.error.is_none())
        .map(|r| {
            let mut s = format!(
                "{} {} free of {}",
                fmt_bytes(r.page_bytes),
                r.free.unwrap_or(0),
                r.total.unwrap_or(0)
            );
            if r.surplus.unwrap_or(0) > 0 {
                s.push_str(&format!(" (+{} surplus)", r.surplus.unwrap_or(0)));
            }
            s
        })
        .collect();
    if sizes.is_empty() {
        format!("node {node}: no pool")
    } else {
        format!("node {node}: {}", sizes.join(", "))
    }
}

/// Huge pages for arena regions (`huge_pages`).
///
/// `ok` when no node has a hugetlb pool (regions use transparent huge
/// pages, as they always did; the evidence says how to reserve a pool) or
/// when every node that matters (each visible GPU's node, else every node
/// with memory) has enough free 2 MiB pages for one default region; `warn`
/// when a pool exists but some of those nodes have too few free pages (their
/// regions quietly use transparent huge pages while others get hugetlb
/// pages), when the kernel lacks `MADV_POPULATE_WRITE`, or when the pools
/// cannot be read.
pub(crate) fn huge_pages(t: &Topology, v: &HugePagesView) -> Check {
    let fallback = match v.thp_enabled.as_deref() {
        Some("always" | "madvise") => "transparent huge pages",
        Some("never") => "4 KiB pages (THP is `never`)",
        _ => "transparent huge pages where the kernel has them",
    };
    if let Some(e) = &v.error {
        return Check::warn(
            NAME,
            format!("{e}: the hugetlb pools cannot be read, so arena regions use {fallback}"),
            "check that /sys is mounted and readable (a container runtime may mask parts of it)",
        );
    }
    let bad: Vec<&str> = v.pools.iter().filter_map(|r| r.error.as_deref()).collect();
    if !bad.is_empty() {
        return Check::warn(
            NAME,
            format!(
                "{}: regions on those nodes use {fallback} (HugePages::Auto) or fail (HugePages::Hugetlb2M, Hugetlb1G)",
                bad.join("; ")
            ),
            "check the files named (a kernel or container that hides or changes /sys)",
        );
    }
    let region = DEFAULT_REGION_BYTES as u64;
    let need = region / hugetlb::SIZE_2M;
    let (nodes, whose) = nodes_that_matter(t);
    let per_node: Vec<String> = nodes.iter().map(|&n| node_words(v, n)).collect();
    let reserve_how = format!(
        "reserve a pool on {whose} as root: `echo N > /sys/devices/system/node/nodeX/hugepages/hugepages-2048kB/nr_hugepages` (N 2 MiB pages, {need} per {} region; read the file back, the kernel may find fewer), or `hugepagesz=1G hugepages=N` (or `hugepagesz=2M hugepages=X:N` per node) on the kernel command line; a container usually cannot change the pools, the host must",
        fmt_bytes(region)
    );
    let any_pool = v
        .pools
        .iter()
        .any(|r| r.total.unwrap_or(0) > 0 || r.surplus.unwrap_or(0) > 0);
    if !any_pool {
        return Check::ok(
            NAME,
            format!(
                "no hugetlb pool reserved on any node: arena regions use {fallback}. To give them hugetlb pages (made faster, never split or compacted), {reserve_how}"
            ),
        );
    }
    if !v.madv_populate_write {
        return Check::warn(
            NAME,
            format!(
                "{}; but this kernel has no MADV_POPULATE_WRITE (Linux 5.14), so HugePages::Auto regions use {fallback}",
                per_node.join("; ")
            ),
            "run Linux 5.14 or later; or ask for HugePages::Hugetlb2M explicitly (its pages are touched after a check of the pool: a process taking them in between ends this one with SIGBUS)",
        );
    }
    let free_2m = |n: u32| {
        v.row(n, hugetlb::SIZE_2M)
            .map_or(0, |r| r.free.unwrap_or(0))
    };
    let short: Vec<u32> = nodes
        .iter()
        .copied()
        .filter(|&n| free_2m(n) < need)
        .collect();
    let one_g = nodes.iter().any(|&n| {
        v.row(n, hugetlb::SIZE_1G)
            .is_some_and(|r| r.total.unwrap_or(0) > 0)
    });
    let one_g_note = if one_g {
        " (1 GiB pages serve only regions that are multiples of 1 GiB: RuntimeConfig::region_bytes of 1 GiB, or HugePages::Hugetlb1G)"
    } else {
        ""
    };
    if short.is_empty() {
        return Check::ok(
            NAME,
            format!(
                "{}: HugePages::Auto regions of {} take 2 MiB hugetlb pages ({need} per region) while the pools last, then {fallback}{one_g_note}",
                per_node.join("; "),
                fmt_bytes(region)
            ),
        );
    }
    let fixes: Vec<String> = short
        .iter()
        .map(|&n| {
            let total = v
                .row(n, hugetlb::SIZE_2M)
                .map_or(0, |r| r.total.unwrap_or(0));
            format!(
                "`echo {} > /sys/devices/system/node/node{n}/hugepages/hugepages-2048kB/nr_hugepages`",
                total + need - free_2m(n)
            )
        })
        .collect();
    let short_words: Vec<String> = short.iter().map(|n| format!("node {n}")).collect();
    Check::warn(
        NAME,
        format!(
            "{}: {} {} fewer than {need} free 2 MiB pages, one default {} region, so regions there use {fallback} (HugePages::Auto) or fail (HugePages::Hugetlb2M) while other nodes get hugetlb pages{one_g_note}",
            per_node.join("; "),
            short_words.join(", "),
            if short.len() == 1 { "has" } else { "have" },
            fmt_bytes(region)
        ),
        format!(
            "reserve pages as root: {} (read the file back: the kernel may find fewer free blocks); or at boot, `hugepagesz=2M hugepages=X:N` per node on the kernel command line; a container usually cannot change the pools",
            fixes.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::checks::tests::{gpu, machine};
    use crate::doctor::Verdict::{Ok as Pass, Warn};

    /// A fake sysfs tree: `pools` as `(node, page kB, total, free,
    /// surplus)`, THP in `madvise` mode.
    fn tree(pools: &[(u32, u64, &str, &str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let write = |p: String, c: &str| {
            let p = d.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, c).unwrap();
        };
        write(
            "sys/kernel/mm/transparent_hugepage/enabled".into(),
            "always [madvise] never\n",
        );
        write(
            "sys/kernel/mm/transparent_hugepage/defrag".into(),
            "always defer defer+madvise [madvise] never\n",
        );
        for &(node, kb, total, free, surplus) in pools {
            let dir = format!("sys/devices/system/node/node{node}/hugepages/hugepages-{kb}kB");
            write(format!("{dir}/nr_hugepages"), total);
            write(format!("{dir}/free_hugepages"), free);
            write(format!("{dir}/surplus_hugepages"), surplus);
        }
        d
    }

    fn four_nodes_two_gpus() -> Topology {
        let mut t = machine(4);
        gpu(&mut t, Some(1));
        gpu(&mut t, Some(3));
        t
    }

    #[test]
    fn no_pool_is_ok_and_says_how_to_reserve_one() {
        let r = tree(&[(0, 2048, "0", "0", "0"), (0, 1048576, "0", "0", "0")]);
        let v = HugePagesView::read(r.path(), true);
        assert_eq!(v.thp_enabled.as_deref(), Some("madvise"));
        assert_eq!(v.pools.len(), 2);
        let c = huge_pages(&machine(1), &v);
        assert_eq!(c.verdict, Pass);
        crate::doctor::assert_contains_all(
            &c.evidence,
            &[
                "no hugetlb pool reserved on any node: arena regions use transparent huge pages",
                "/sys/devices/system/node/nodeX/hugepages/hugepages-2048kB/nr_hugepages",
                "hugepagesz=1G hugepages=N",
                "container usually cannot",
                "each node with memory",
            ],
        );
        let text = v.render();
        assert!(
            text.starts_with("huge pages: THP enabled madvise, defrag madvise"),
            "{text}"
        );
        assert!(text.contains("  NODE  PAGE   TOTAL  FREE  SURPLUS\n  0     2 MiB  0      0     0\n  0     1 GiB  0      0     0\n"), "{text}");
    }

    #[test]
    fn pools_on_every_gpu_node_are_ok() {
        let r = tree(&[
            (0, 2048, "0", "0", "0"),
            (1, 2048, "512", "500", "0"),
            (2, 2048, "0", "0", "0"),
            (3, 2048, "256", "128", "2"),
            (3, 1048576, "4", "4", "0"),
        ]);
        let v = HugePagesView::read(r.path(), true);
        let c = huge_pages(&four_nodes_two_gpus(), &v);
        assert_eq!(c.verdict, Pass, "{c:?}");
        crate::doctor::assert_contains_all(
            &c.evidence,
            &[
                "node 1: 2 MiB 500 free of 512; node 3: 2 MiB 128 free of 256 (+2 surplus), 1 GiB 4 free of 4",
                "take 2 MiB hugetlb pages (128 per region)",
                "1 GiB pages serve only regions that are multiples of 1 GiB",
            ],
        );
        // JSON: one object per node and size.
        let j = serde_json::to_value(&v).unwrap();
        assert_eq!(j["pools"].as_array().unwrap().len(), 5);
        assert_eq!(
            j["pools"][3],
            serde_json::json!({"node": 3, "page_bytes": 2097152, "total": 256, "free": 128, "surplus": 2, "error": null})
        );
        assert_eq!(j["thp_defrag"], "madvise");
    }

    #[test]
    fn a_gpu_node_short_of_pages_warns_with_the_pool_size_to_set() {
        let r = tree(&[
            (0, 2048, "1024", "1024", "0"),
            (1, 2048, "100", "40", "0"),
            (3, 2048, "0", "0", "0"),
        ]);
        let v = HugePagesView::read(r.path(), true);
        let c = huge_pages(&four_nodes_two_gpus(), &v);
        assert_eq!(c.verdict, Warn, "{c:?}");
        assert!(
            c.evidence
                .contains("node 1, node 3 have fewer than 128 free 2 MiB pages"),
            "{}",
            c.evidence
        );
        let fix = c.fix.unwrap();
        crate::doctor::assert_contains_all(
            &fix,
            &[
                "`echo 188 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages`",
                "`echo 128 > /sys/devices/system/node/node3/hugepages/hugepages-2048kB/nr_hugepages`",
            ],
        );
        // An old kernel: pools, but Auto does not take them.
        let c = huge_pages(
            &four_nodes_two_gpus(),
            &HugePagesView::read(r.path(), false),
        );
        assert_eq!(c.verdict, Warn);
        assert!(c.evidence.contains("MADV_POPULATE_WRITE"), "{}", c.evidence);
    }

    #[test]
    fn missing_folders_and_garbage_warn_or_pass_never_panic() {
        // No node folder at all.
        let r = tempfile::tempdir().unwrap();
        let v = HugePagesView::read(r.path(), true);
        assert!(v.error.is_some());
        assert_eq!(
            (v.thp_enabled.as_deref(), v.thp_defrag.as_deref()),
            (None, None)
        );
        let c = huge_pages(&machine(1), &v);
        assert_eq!(c.verdict, Warn);
        assert!(c.evidence.contains("cannot list"), "{}", c.evidence);
        assert!(v.render().contains("cannot list"));
        // Nodes without hugepages folders (no hugetlb in the kernel).
        std::fs::create_dir_all(r.path().join("sys/devices/system/node/node0")).unwrap();
        let v = HugePagesView::read(r.path(), true);
        assert_eq!((v.error.as_deref(), v.pools.len()), (None, 0));
        assert_eq!(huge_pages(&machine(1), &v).verdict, Pass);
        assert!(v.render().contains("none (no node has a hugepages folder)"));
        // Garbage in a file: named, with the node's row shown as unknown.
        let r = tree(&[(0, 2048, "many", "0", "0"), (1, 2048, "8", "8", "0")]);
        let v = HugePagesView::read(r.path(), true);
        let c = huge_pages(&machine(2), &v);
        assert_eq!(c.verdict, Warn);
        assert!(
            c.evidence
                .contains("node0/hugepages/hugepages-2048kB/nr_hugepages holds \"many\""),
            "{}",
            c.evidence
        );
        let text = v.render();
        assert!(text.contains("  0     2 MiB  ?      ?     ?"), "{text}");
        assert!(text.contains("  1     2 MiB  8      8     0"), "{text}");
    }
}
