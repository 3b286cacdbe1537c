//! Every real machine description in `../shared/topologies/` is read and
//! compared with hwloc's own answer in its `expected.json`.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

mod common;

use std::path::PathBuf;

use numapin::topology::{ProbeOptions, Topology};
use numapin::CpuList;
use serde_json::Value;

fn shared() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/topologies");
    if dir.join("expected.json").is_file() {
        Some(dir)
    } else {
        common::skip(common::Need::Shared, "../shared/topologies/expected.json is not there (the real-machine data set lives beside the checkout)");
        None
    }
}

fn cpus(v: &Value) -> CpuList {
    CpuList::parse(v.as_str().unwrap()).unwrap()
}

#[test]
fn every_shared_topology_matches_its_expectation() {
    let Some(dir) = shared() else { return };
    let expected: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    assert!(!expected.is_empty());
    let mut checked = 0;
    for e in &expected {
        let file = e["file"].as_str().unwrap();
        let t = Topology::load(&dir.join(file), &ProbeOptions::default())
            .unwrap_or_else(|err| panic!("{file}: {err}"));
        // NUMA nodes and their CPUs.
        let nodes = e["nodes"].as_array().unwrap();
        assert_eq!(t.numa_nodes.len(), nodes.len(), "{file}: node count");
        for n in nodes {
            let os = u32::try_from(n["os_index"].as_u64().unwrap()).unwrap();
            let node = t
                .node(os)
                .unwrap_or_else(|| panic!("{file}: node {os} missing"));
            assert_eq!(node.cpus, cpus(&n["cpus"]), "{file}: node {os} CPUs");
        }
        if let Some(a) = e.get("allowed_cpus") {
            assert_eq!(t.allowed.cpus, cpus(a), "{file}: allowed CPUs");
        }
        // GPUs, in PCI bus id order, with their locality.
        let gpus = e["gpus"].as_array().unwrap();
        assert_eq!(
            t.gpus.len(),
            gpus.len(),
            "{file}: GPU count ({:?})",
            t.gpus.iter().map(|g| &g.pci_bus_id).collect::<Vec<_>>()
        );
        for (g, x) in t.gpus.iter().zip(gpus) {
            assert_eq!(g.pci_bus_id, x["pci_bus_id"].as_str().unwrap(), "{file}");
            assert_eq!(
                g.numa_node,
                x["numa_node"].as_u64().map(|v| u32::try_from(v).unwrap()),
                "{file}: {} node",
                g.pci_bus_id
            );
            assert_eq!(
                g.local_cpus,
                cpus(&x["local_cpus"]),
                "{file}: {} local CPUs",
                g.pci_bus_id
            );
        }
        // Display devices of other vendors are not GPUs.
        for o in e
            .get("other_display_devices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let bus = o["pci_bus_id"].as_str().unwrap();
            assert!(
                t.gpus.iter().all(|g| g.pci_bus_id != bus),
                "{file}: {bus} is not a GPU"
            );
        }
        // Unknown locality on a multi-node machine is never a silent node.
        for g in &t.gpus {
            if g.numa_node.is_none() && t.numa_nodes.len() > 1 {
                assert!(
                    t.warnings.iter().any(|w| w.gpu == Some(g.index)),
                    "{file}: GPU {} needs a warning",
                    g.index
                );
            }
        }
        // The JSON form reads back to the same description.
        let back: Topology = serde_json::from_str(&t.to_json()).unwrap();
        assert_eq!(back, t, "{file}: JSON round trip");
        checked += 1;
    }
    eprintln!("checked {checked} real machine descriptions");
}

#[test]
fn restricted_cpus_are_reported() {
    let Some(dir) = shared() else { return };
    let t = Topology::load(
        &dir.join("hwloc-xml/64intel64-3g2n+2n-irregulargroups+pci.xml"),
        &ProbeOptions::default(),
    )
    .unwrap();
    assert_eq!(t.allowed.cpus.to_cpulist(), "0-15");
    let excluded: Vec<_> = t
        .warnings
        .iter()
        .filter(|w| w.kind == numapin::topology::WarningKind::GpuCpusExcluded)
        .collect();
    assert_eq!(
        excluded.len(),
        2,
        "both GPUs sit on nodes outside the allowed CPUs: {:?}",
        t.warnings
    );
    assert!(excluded[0].message.contains("32-39"));
}

#[test]
fn cgroup_capture_restricts_allowed_cpus() {
    let Some(dir) = shared() else { return };
    let t = Topology::load(
        &dir.join("sysfs/32amd64-4s2n4c-cgroup2.tar.bz2"),
        &ProbeOptions::default(),
    )
    .unwrap();
    assert_eq!(t.allowed.cpus.to_cpulist(), "0-5");
    // Several nodes per socket: node and package both reported and differ.
    assert_eq!(t.packages.len(), 4);
    assert_eq!(t.node(1).unwrap().package, Some(0));
    assert_eq!(t.node(3).unwrap().package, Some(1));
    assert_eq!(t.package(0).unwrap().numa_nodes, vec![0, 1]);
}
