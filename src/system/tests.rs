//! The snapshot of this machine, the readers under fake roots, and the
//! parsers of the kernel's files.

use proptest::prelude::*;

use super::kernel::{iommu_params, selected_word};
use super::this_process::parse_policy;
use super::*;
use crate::platform::fake_root;

fn empty_topology() -> Topology {
    Topology {
        schema_version: 1,
        source: "test".into(),
        packages: vec![],
        numa_nodes: vec![],
        gpus: vec![],
        allowed: Default::default(),
        warnings: vec![],
        cores: vec![],
        caches: vec![],
        cuda: Default::default(),
        nics: vec![],
        storage: vec![],
    }
}

#[test]
fn reads_this_machine() {
    let s = SystemSnapshot::read(
        &empty_topology(),
        &SnapshotOptions::default().with_cuda(false),
    );
    assert_eq!(s.cuda_driver, CudaDriver::NotLoaded);
    let l = s.memlock.as_ref().unwrap();
    assert!(l.soft <= l.hard);
    // Tests run with the default policy unless someone wrapped them in
    // numactl; either way the call works.
    assert!(s.mempolicy.is_ok(), "{:?}", s.mempolicy);
    assert!(s.iommu.cmdline.is_some());
    assert_eq!(s.numa_calls.len(), NUMA_CALLS.len());
    assert!(s.numa_call("mbind").is_some() && s.numa_call("open").is_none());
    assert!(s.security.seccomp.is_some(), "{:?}", s.security);
    // CAP_IPC_LOCK from the same status file as the capability set.
    assert_eq!(
        s.cap_ipc_lock(),
        s.security.has_cap(CAP_IPC_LOCK) == Some(true)
    );
}

/// Everything read from files comes from under the root given.
#[test]
fn files_are_read_under_the_root() {
    let root = fake_root(&[
        (
            "proc/cmdline",
            "BOOT_IMAGE=/vmlinuz intel_iommu=on iommu=pt\n",
        ),
        ("proc/sys/kernel/numa_balancing", "1\n"),
        (
            "proc/self/status",
            "Seccomp:\t2\nCapEff:\t0000000000800000\n",
        ),
        ("proc/self/cgroup", "0::/docker/abc\n"),
        (".dockerenv", ""),
        ("sys/class/iommu/dmar0/x", ""),
        (
            "sys/kernel/mm/transparent_hugepage/enabled",
            "[always] madvise never\n",
        ),
        (
            "sys/kernel/mm/transparent_hugepage/defrag",
            "always defer [defer+madvise] madvise never\n",
        ),
        (
            "sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages",
            "4\n",
        ),
        (
            "sys/devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages",
            "3\n",
        ),
        (
            "sys/devices/system/node/node0/hugepages/hugepages-2048kB/surplus_hugepages",
            "0\n",
        ),
    ]);
    let opts = SnapshotOptions::default()
        .with_cuda(false)
        .with_root(root.path().to_path_buf());
    let s = SystemSnapshot::read(&empty_topology(), &opts);
    assert_eq!(s.numa_balancing.as_deref(), Some("1\n"));
    assert_eq!(s.security.seccomp, Some(2));
    assert_eq!(s.cap_sys_nice(), Some(true));
    assert!(!s.cap_ipc_lock());
    assert!(s.container.dockerenv);
    assert_eq!(s.container.cgroup_runtimes, ["docker"]);
    assert_eq!(s.iommu.units.as_deref(), Some(&["dmar0".to_string()][..]));
    assert_eq!(s.iommu.params(), [("intel_iommu", "on"), ("iommu", "pt")]);
    assert_eq!(s.thp.enabled_mode(), Some("always"));
    assert_eq!(s.thp.defrag_mode(), Some("defer+madvise"));
    assert_eq!(s.huge_pages.thp_enabled.as_deref(), Some("always"));
    let row = s.huge_pages.row(0, SIZE_2M).unwrap();
    assert_eq!(
        (row.total(), row.free(), row.surplus()),
        (Some(4), Some(3), Some(0))
    );
    assert!(s.cgroup.tightest().is_none());
}

#[test]
fn an_empty_root_reads_as_unknown_never_as_an_error() {
    let root = tempfile::tempdir().unwrap();
    let opts = SnapshotOptions::default()
        .with_cuda(false)
        .with_root(root.path().to_path_buf());
    let s = SystemSnapshot::read(&empty_topology(), &opts);
    assert_eq!(s.security, SecurityStatus::default());
    assert_eq!(s.cap_sys_nice(), None);
    assert_eq!(s.thp, Thp::default());
    assert_eq!(s.numa_balancing, None);
    assert_eq!(s.iommu.cmdline, None);
    assert!(s.iommu.params().is_empty());
    let e = s.huge_pages.error.as_ref().unwrap();
    assert!(e.to_string().starts_with("cannot list "), "{e}");
    assert!(e.path.ends_with("sys/devices/system/node"));
    assert!(!s.container.likely());
}

#[test]
fn huge_page_rows_serialize_flat() {
    let root = fake_root(&[
        (
            "sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages",
            "many\n",
        ),
        (
            "sys/devices/system/node/node1/hugepages/hugepages-2048kB/free_hugepages",
            "0\n",
        ),
        (
            "sys/devices/system/node/node1/hugepages/hugepages-2048kB/surplus_hugepages",
            "0\n",
        ),
    ]);
    let h = HugePages::read_under(root.path(), &Thp::default(), true);
    let j = serde_json::to_value(&h).unwrap();
    assert_eq!(j["thp_enabled"], serde_json::Value::Null);
    assert_eq!(j["madv_populate_write"], true);
    let row = &j["pools"][0];
    assert_eq!(
        (row["node"].as_u64(), row["page_bytes"].as_u64()),
        (Some(1), Some(SIZE_2M))
    );
    assert!(row["total"].is_null() && row["free"].is_null());
    assert!(
        row["error"]
            .as_str()
            .unwrap()
            .contains("nr_hugepages holds \"many\""),
        "{row}"
    );
    assert_eq!(j["error"], serde_json::Value::Null);
}

#[test]
fn the_driver_can_be_left_alone() {
    let d = CudaDriver::NotLoaded;
    assert_eq!((d.version(), d.unavailable_reason()), (None, None));
    assert!(!d.disabled_by_env());
}

#[test]
fn selected_words() {
    assert_eq!(selected_word("always [madvise] never\n"), Some("madvise"));
    assert_eq!(
        selected_word("always defer defer+madvise [madvise] never"),
        Some("madvise")
    );
    assert_eq!(selected_word("[never]"), Some("never"));
    assert_eq!(selected_word("1\n"), Some("1"));
    assert_eq!(selected_word(""), None);
    assert_eq!(selected_word("a b"), None);
    assert_eq!(selected_word("a [b"), None);
    assert_eq!(selected_word("[]"), None);
}

#[test]
fn iommu_parameters() {
    let c = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt quiet -- iommu=off";
    assert_eq!(
        iommu_params(c),
        [("intel_iommu", "on"), ("iommu", "pt")],
        "init's arguments after -- are not the kernel's"
    );
    assert!(iommu_params("quiet amd_iommu_intr=legacy").is_empty());
    assert_eq!(iommu_params("amd_iommu=off"), [("amd_iommu", "off")]);
}

#[test]
fn policies_from_numa_maps_text() {
    use PolicyMode::*;
    assert_eq!(parse_policy("default"), Some((Default, vec![])));
    assert_eq!(parse_policy("bind:0-1"), Some((Bind, vec![0, 1])));
    assert_eq!(parse_policy("prefer:3"), Some((Preferred, vec![3])));
    assert_eq!(
        parse_policy("prefer (many)=static:1,3"),
        Some((PreferredMany, vec![1, 3]))
    );
    assert_eq!(
        parse_policy("interleave=relative:0-3").map(|p| p.0),
        Some(Interleave)
    );
    assert_eq!(
        parse_policy("weighted interleave:0"),
        Some((WeightedInterleave, vec![0]))
    );
    assert_eq!(parse_policy("bind:x"), None);
    assert_eq!(parse_policy("nonsense"), None);
}

#[test]
fn policy_mode_names() {
    assert_eq!(PolicyMode::from_raw(2).as_str(), "bind");
    // MPOL_F_STATIC_NODES (1 << 15) does not change the mode.
    assert_eq!(PolicyMode::from_raw(2 | 1 << 15), PolicyMode::Bind);
    assert_eq!(PolicyMode::from_raw(99), PolicyMode::Other(99));
    assert_eq!(PolicyMode::from_raw(99).to_string(), "unknown");
    assert_eq!(PolicyMode::from_raw(5).to_string(), "preferred-many");
}

proptest! {
    /// Whatever the file holds, the parser returns a word of it or nothing.
    #[test]
    fn selected_is_a_word_of_the_input(words in proptest::collection::vec("[a-z+]{1,8}", 1..6), pick in 0usize..6) {
        let pick = pick % words.len();
        let text = words
            .iter()
            .enumerate()
            .map(|(i, w)| if i == pick { format!("[{w}]") } else { w.clone() })
            .collect::<Vec<_>>()
            .join(" ");
        prop_assert_eq!(selected_word(&text), Some(words[pick].as_str()));
    }

    #[test]
    fn selected_never_panics(s in "\\PC*") {
        if let Some(w) = selected_word(&s) {
            prop_assert!(s.contains(w));
        }
    }
}
