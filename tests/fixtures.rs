//! The machine descriptions in `topology/`, each with its expected GPU ->
//! NUMA node mapping and the cases the probe must get right.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

use std::path::PathBuf;

use numapin::topology::{NodeKind, ProbeEnv, ProbeOptions, Topology, WarningKind};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("topology")
        .join(name)
}

fn load(name: &str) -> Topology {
    Topology::load(&fixture(name), &ProbeOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn load_env(name: &str, cvd: Option<&str>, order: Option<&str>) -> numapin::Result<Topology> {
    let opts = ProbeOptions::default().with_env(ProbeEnv {
        cuda_visible_devices: cvd.map(Into::into),
        cuda_device_order: order.map(Into::into),
    });
    Ok(Topology::load(&fixture(name), &opts)?)
}

fn nodes(t: &Topology) -> Vec<Option<u32>> {
    t.gpus.iter().map(|g| g.numa_node).collect()
}

#[test]
fn dgx_a100_nps4_maps_gpus_to_their_published_nodes() {
    let t = load("dgx-a100-nps4.xml");
    assert_eq!(t.packages.len(), 2);
    assert_eq!(t.numa_nodes.len(), 8);
    assert_eq!(nodes(&t), [3, 3, 1, 1, 7, 7, 5, 5].map(Some));
    assert_eq!(t.gpus[0].local_cpus.to_cpulist(), "48-63,176-191");
    assert_eq!(t.gpus[4].local_cpus.to_cpulist(), "112-127,240-255");
    // Several nodes per socket: node and package both reported, and differ.
    assert_eq!(t.gpus[0].package, Some(0));
    assert_eq!(t.gpus[6].package, Some(1));
    assert_eq!(t.node(5).unwrap().package, Some(1));
    assert_eq!(t.package(1).unwrap().numa_nodes, vec![4, 5, 6, 7]);
    // Core complexes: 4 cores (8 threads) per L3, 16 per socket.
    assert_eq!(t.caches.len(), 32);
    assert!(t.caches.iter().all(|c| c.cpus.len() == 8 && c.level == 3));
    assert_eq!(t.cores.len(), 128);
    assert_eq!(
        t.node(3).unwrap().distances,
        vec![12, 12, 12, 10, 32, 32, 32, 32]
    );
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
}

#[test]
fn dgx_h100_has_four_gpus_per_socket() {
    let t = load("dgx-h100.xml");
    assert_eq!(nodes(&t), [0, 0, 0, 0, 1, 1, 1, 1].map(Some));
    assert_eq!(t.gpus[3].pci_bus_id, "0000:5d:00.0");
    assert_eq!(t.gpus[7].local_cpus.to_cpulist(), "56-111,168-223");
    assert_eq!(t.gpus[7].package, Some(1));
}

#[test]
fn gpus_behind_pcie_switches_take_the_switchs_socket() {
    let t = load("pcie-switch-2s.xml");
    assert_eq!(nodes(&t), [0, 0, 0, 0, 1, 1, 1, 1].map(Some));
    // The link that trained at half width shows half the bandwidth.
    let slow = t
        .gpus
        .iter()
        .find(|g| g.pci_bus_id == "0000:3f:00.0")
        .unwrap();
    let speed = slow.pcie.as_ref().unwrap().speed_gbps.unwrap();
    assert!((speed - 7.88).abs() < 0.01, "{speed}");
}

#[test]
fn unknown_locality_on_a_two_node_vm_is_reported_not_guessed() {
    let t = load("cloud-vm-2n-nolocality.xml");
    assert_eq!(t.numa_nodes.len(), 2);
    assert_eq!(nodes(&t), vec![None; 4], "never a silent node 0");
    for g in &t.gpus {
        assert_eq!(g.local_cpus, t.all_cpus(), "hangs off the whole machine");
        let w: Vec<_> = t
            .warnings
            .iter()
            .filter(|w| w.gpu == Some(g.index))
            .collect();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].kind, WarningKind::GpuLocalityUnknown);
        assert!(w[0].message.contains("numa_node = -1"));
    }
    let json: serde_json::Value = serde_json::from_str(&t.to_json()).unwrap();
    assert!(json["gpus"][0]["numa_node"].is_null());
}

#[test]
fn unknown_locality_on_a_one_node_vm_is_node_zero() {
    let t = load("cloud-vm-1n.xml");
    assert_eq!(nodes(&t), vec![Some(0)]);
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
}

#[test]
fn grace_hopper_gpu_memory_and_empty_nodes() {
    let t = load("grace-hopper.xml");
    assert_eq!(t.numa_nodes.len(), 9);
    assert_eq!(t.gpus.len(), 1);
    assert_eq!(
        t.gpus[0].numa_node,
        Some(0),
        "the GPU belongs to the Grace CPU's node"
    );
    let hbm = t.node(1).unwrap();
    assert_eq!(hbm.kind, NodeKind::GpuMemory);
    assert!(hbm.cpus.is_empty());
    assert_eq!(hbm.memory_bytes, 96 << 30);
    for n in 2..=8 {
        let node = t.node(n).unwrap();
        assert_eq!(node.kind, NodeKind::Memoryless);
        assert!(node.cpus.is_empty());
    }
    assert_eq!(t.node(0).unwrap().cpus.to_cpulist(), "0-71");
    assert_eq!(t.node(0).unwrap().kind, NodeKind::Normal);
}

#[test]
fn memoryless_node_is_reported() {
    let t = load("memoryless-node-2s.xml");
    let n1 = t.node(1).unwrap();
    assert_eq!(n1.kind, NodeKind::Memoryless);
    assert_eq!(n1.memory_bytes, 0);
    assert_eq!(n1.cpus.to_cpulist(), "16-31,48-63");
    assert_eq!(nodes(&t), vec![Some(0), Some(1)]);
}

#[test]
fn cuda_visible_devices_picks_and_reorders() {
    let t = load_env("dgx-h100.xml", Some("4,0"), Some("PCI_BUS_ID")).unwrap();
    assert_eq!(t.cuda.ordinals.len(), 2);
    assert_eq!(t.gpus[4].cuda_ordinal, Some(numapin::CudaOrdinal(0)));
    assert_eq!(t.gpus[0].cuda_ordinal, Some(numapin::CudaOrdinal(1)));
    assert_eq!(t.gpus[1].cuda_ordinal, None, "hidden GPUs have no ordinal");
    assert_eq!(
        t.gpu_by_ordinal(numapin::CudaOrdinal(0)).unwrap().numa_node,
        Some(1)
    );
    assert_eq!(t.cuda.device_order, "PCI_BUS_ID");
}

#[test]
fn cuda_visible_devices_empty_hides_everything() {
    let t = load_env("dgx-h100.xml", Some(""), None).unwrap();
    assert!(t.cuda.ordinals.is_empty());
    assert!(t.gpus.iter().all(|g| g.cuda_ordinal.is_none()));
    assert!(t
        .warnings
        .iter()
        .any(|w| w.kind == WarningKind::CudaVisibleDevices));
}

#[test]
fn cuda_visible_devices_garbage_is_an_error_naming_it() {
    for bad in ["0,banana", "8", "0,0", "GPU-zz"] {
        let e = load_env("dgx-h100.xml", Some(bad), None).unwrap_err();
        assert_eq!(e.kind(), numapin::ErrorKind::Input);
        assert!(e.to_string().contains("CUDA_VISIBLE_DEVICES"), "{bad}: {e}");
    }
    let e = load_env("dgx-h100.xml", None, Some("SLOWEST_FIRST")).unwrap_err();
    assert!(e.to_string().contains("CUDA_DEVICE_ORDER"), "{e}");
}

#[test]
fn every_fixture_round_trips_through_json() {
    for entry in std::fs::read_dir(fixture("")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "xml") {
            let t = Topology::load(&path, &ProbeOptions::default()).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let json = dir.path().join("t.json");
            std::fs::write(&json, t.to_json()).unwrap();
            let mut back = Topology::load(&json, &ProbeOptions::default()).unwrap();
            back.source = t.source.clone();
            assert_eq!(back, t, "{}", path.display());
        }
    }
}
