//! The `huge_pages` check from fake sysfs trees of machines with several
//! nodes.

use super::{assert_contains_all, gpu, machine};
use crate::doctor::huge_pages::huge_pages;
use crate::doctor::Verdict::{Ok as Pass, Warn};
use crate::system::{HugePages, Thp};
use crate::topology::Topology;

/// Reads the pools and the THP mode under `root`.
fn read(root: &std::path::Path, madv_populate_write: bool) -> HugePages {
    HugePages::read_under(root, &Thp::read_under(root), madv_populate_write)
}

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
    let v = read(r.path(), true);
    assert_eq!(v.thp_enabled.as_deref(), Some("madvise"));
    assert_eq!(v.pools.len(), 2);
    let c = huge_pages(&machine(1), &v);
    assert_eq!(c.verdict, Pass);
    assert_contains_all(
        &c.evidence,
        &[
            "no hugetlb pool reserved on any node: arena regions use transparent huge pages",
            "/sys/devices/system/node/nodeX/hugepages/hugepages-2048kB/nr_hugepages",
            "hugepagesz=1G hugepages=N",
            "container usually cannot",
            "each node with memory",
        ],
    );
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
    let v = read(r.path(), true);
    let c = huge_pages(&four_nodes_two_gpus(), &v);
    assert_eq!(c.verdict, Pass, "{c:?}");
    assert_contains_all(
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
    let v = read(r.path(), true);
    let c = huge_pages(&four_nodes_two_gpus(), &v);
    assert_eq!(c.verdict, Warn, "{c:?}");
    assert!(
        c.evidence
            .contains("node 1, node 3 have fewer than 128 free 2 MiB pages"),
        "{}",
        c.evidence
    );
    let fix = c.fix.unwrap();
    assert_contains_all(
        &fix,
        &[
            "`echo 188 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages`",
            "`echo 128 > /sys/devices/system/node/node3/hugepages/hugepages-2048kB/nr_hugepages`",
        ],
    );
    // An old kernel: pools, but Auto does not take them.
    let c = huge_pages(&four_nodes_two_gpus(), &read(r.path(), false));
    assert_eq!(c.verdict, Warn);
    assert!(c.evidence.contains("MADV_POPULATE_WRITE"), "{}", c.evidence);
}

#[test]
fn missing_folders_and_garbage_warn_or_pass_never_panic() {
    // No node folder at all.
    let r = tempfile::tempdir().unwrap();
    let v = read(r.path(), true);
    assert!(v.error.is_some());
    assert_eq!(
        (v.thp_enabled.as_deref(), v.thp_defrag.as_deref()),
        (None, None)
    );
    let c = huge_pages(&machine(1), &v);
    assert_eq!(c.verdict, Warn);
    assert!(c.evidence.contains("cannot list"), "{}", c.evidence);
    // Nodes without hugepages folders (no hugetlb in the kernel).
    std::fs::create_dir_all(r.path().join("sys/devices/system/node/node0")).unwrap();
    let v = read(r.path(), true);
    assert_eq!((v.error.is_none(), v.pools.len()), (true, 0));
    assert_eq!(huge_pages(&machine(1), &v).verdict, Pass);
    // Garbage in a file: named, with the node's row shown as unknown.
    let r = tree(&[(0, 2048, "many", "0", "0"), (1, 2048, "8", "8", "0")]);
    let v = read(r.path(), true);
    let c = huge_pages(&machine(2), &v);
    assert_eq!(c.verdict, Warn);
    assert!(
        c.evidence
            .contains("node0/hugepages/hugepages-2048kB/nr_hugepages holds \"many\""),
        "{}",
        c.evidence
    );
    assert_eq!(v.pools[0].total(), None);
    assert_eq!(v.pools[1].free(), Some(8));
}
