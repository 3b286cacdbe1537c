//! The `huge_pages` check: each node's hugetlb pools against what arena
//! regions take from them under the default `HugePages::Auto` (hugetlb
//! pages when the node's pool has enough free for a region, else
//! transparent huge pages). A pure function of the topology and the
//! [`HugePages`] read by the system snapshot.

use super::check::Check;
use super::words::{memory_nodes, visible_gpu_nodes};
use crate::arena::fmt_bytes;
use crate::runtime::DEFAULT_REGION_BYTES;
use crate::system::{HugePages, SIZE_1G, SIZE_2M};
use crate::topology::Topology;

const NAME: &str = "huge_pages";

/// The nodes whose pools matter: those of the GPUs this process sees, or,
/// with none, every node with memory it may use; and how to say so.
fn nodes_that_matter(t: &Topology) -> (Vec<u32>, &'static str) {
    let gpu_nodes = visible_gpu_nodes(t);
    if !gpu_nodes.is_empty() {
        return (gpu_nodes, "each GPU's node");
    }
    (memory_nodes(t), "each node with memory")
}

/// `2 MiB: 800 free of 1024` (`, 3 surplus`), for one node's pools.
fn node_words(v: &HugePages, node: u32) -> String {
    let sizes: Vec<String> = v
        .pools
        .iter()
        .filter(|r| r.node == node)
        .filter_map(|r| r.counts.as_ref().ok().map(|c| (r.page_bytes, c)))
        .map(|(page, c)| {
            let mut s = format!("{} {} free of {}", fmt_bytes(page), c.free, c.total);
            if c.surplus > 0 {
                s.push_str(&format!(" (+{} surplus)", c.surplus));
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

/// What regions use without hugetlb pages, by the THP mode.
fn fallback(v: &HugePages) -> &'static str {
    match v.thp_enabled.as_deref() {
        Some("always" | "madvise") => "transparent huge pages",
        Some("never") => "4 KiB pages (THP is `never`)",
        _ => "transparent huge pages where the kernel has them",
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
pub(crate) fn huge_pages(t: &Topology, v: &HugePages) -> Check {
    let fallback = fallback(v);
    if let Some(e) = &v.error {
        return Check::warn(
            NAME,
            format!("{e}: the hugetlb pools cannot be read, so arena regions use {fallback}"),
            "check that /sys is mounted and readable (a container runtime may mask parts of it)",
        );
    }
    let bad: Vec<String> = v
        .pools
        .iter()
        .filter_map(|r| r.counts.as_ref().err().map(|e| e.to_string()))
        .collect();
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
    let need = region / SIZE_2M;
    let (nodes, whose) = nodes_that_matter(t);
    let per_node: Vec<String> = nodes.iter().map(|&n| node_words(v, n)).collect();
    let any_pool = v
        .pools
        .iter()
        .any(|r| r.total().unwrap_or(0) > 0 || r.surplus().unwrap_or(0) > 0);
    if !any_pool {
        return Check::ok(
            NAME,
            format!(
                "no hugetlb pool reserved on any node: arena regions use {fallback}. To give them hugetlb pages (made faster, never split or compacted), reserve a pool on {whose} as root: `echo N > /sys/devices/system/node/nodeX/hugepages/hugepages-2048kB/nr_hugepages` (N 2 MiB pages, {need} per {} region; read the file back, the kernel may find fewer), or `hugepagesz=1G hugepages=N` (or `hugepagesz=2M hugepages=X:N` per node) on the kernel command line; a container usually cannot change the pools, the host must",
                fmt_bytes(region)
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
    pools_against_need(v, &nodes, &per_node, need, fallback)
}

/// The verdict when pools exist: every node that matters has `need` free
/// 2 MiB pages (`ok`), or the nodes short of them (`warn`, with the pool
/// size to set on each).
fn pools_against_need(
    v: &HugePages,
    nodes: &[u32],
    per_node: &[String],
    need: u64,
    fallback: &str,
) -> Check {
    let region = DEFAULT_REGION_BYTES as u64;
    let free_2m = |n: u32| v.row(n, SIZE_2M).and_then(|r| r.free()).unwrap_or(0);
    let short: Vec<u32> = nodes
        .iter()
        .copied()
        .filter(|&n| free_2m(n) < need)
        .collect();
    let one_g = nodes.iter().any(|&n| {
        v.row(n, SIZE_1G)
            .is_some_and(|r| r.total().unwrap_or(0) > 0)
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
            let total = v.row(n, SIZE_2M).and_then(|r| r.total()).unwrap_or(0);
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
