//! NICs and storage devices, their relation to every GPU, and the pairing of
//! each GPU with its nearest NICs: on the machine descriptions in
//! `topology/` (whose PCI trees `topology/gen_fixtures.py` documents), on an
//! NCCL dump, and on the real machines in `../shared/topologies/` when that
//! folder is there.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

mod common;

use std::path::PathBuf;

use numapin::topology::{DeviceKind, IoDevice, ProbeOptions, Relation, Topology};
use numapin::GpuIndex;
use Relation::*;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("topology")
        .join(name)
}

fn load(path: &std::path::Path) -> Topology {
    Topology::load(path, &ProbeOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The GPU-by-NIC matrix, `m[g][n]`.
fn matrix(t: &Topology) -> Vec<Vec<Relation>> {
    t.gpus
        .iter()
        .map(|g| t.nics.iter().map(|n| n.relation_to(g.index)).collect())
        .collect()
}

/// Each GPU's paired NICs, by their first OS name (or bus id).
fn paired(t: &Topology) -> Vec<Vec<String>> {
    t.nic_pairing()
        .iter()
        .map(|l| l.iter().map(|c| t.nics[c.nic].label()).collect())
        .collect()
}

fn nic<'a>(t: &'a Topology, name: &str) -> &'a IoDevice {
    t.nics
        .iter()
        .find(|n| n.names.iter().any(|x| x == name))
        .unwrap_or_else(|| panic!("no NIC {name}"))
}

#[test]
fn dgx_h100_each_gpu_shares_its_switch_with_one_compute_nic_and_one_drive() {
    let t = load(&fixture("dgx-h100.xml"));
    assert_eq!(t.gpus.len(), 8);
    assert_eq!(
        t.nics.len(),
        12,
        "8 compute ports and 2 dual-port storage NICs"
    );
    assert_eq!(t.storage.len(), 8);
    // Every GPU/NIC pair against the tree the generator wrote: the compute
    // NIC on the GPU's switch is PIX, other NICs of its socket NODE (other
    // root buses), the other socket's SYS.
    for g in &t.gpus {
        let gi = g.index.as_usize();
        let socket = gi / 4;
        for n in &t.nics {
            let own = n.names[0] == format!("mlx5_{gi}");
            let same_socket = n.numa_node == Some(u32::try_from(socket).unwrap());
            let want = match (own, same_socket) {
                (true, _) => Pix,
                (false, true) => Node,
                (false, false) => Sys,
            };
            assert_eq!(n.relation_to(g.index), want, "GPU {gi} / {}", n.label());
        }
        for (d, drive) in t.storage.iter().enumerate() {
            let want = if d == gi {
                Pix
            } else if d / 4 == socket {
                Node
            } else {
                Sys
            };
            assert_eq!(
                drive.relation_to(g.index),
                want,
                "GPU {gi} / {}",
                drive.label()
            );
        }
    }
    // Kinds, names and ports from hwloc's OS devices.
    let ib = nic(&t, "mlx5_3");
    assert_eq!(ib.kind, DeviceKind::Infiniband);
    assert_eq!(ib.names, ["mlx5_3", "ibp94s0"]);
    assert_eq!(
        (ib.rdma_device.as_deref(), ib.rdma_port),
        (Some("mlx5_3"), Some(1))
    );
    assert_eq!(ib.pci_bus_id.as_deref(), Some("0000:5e:00.0"));
    assert_eq!((ib.numa_node, ib.package), (Some(0), Some(0)));
    assert_eq!(nic(&t, "mlx5_9").kind, DeviceKind::Roce);
    assert!(t.storage.iter().all(|d| d.kind == DeviceKind::Nvme));
    assert_eq!(t.storage[4].names, ["nvme4n1"]);
    // Pairing: one to one with the compute NICs; the storage NICs unused.
    let want: Vec<Vec<String>> = (0..8).map(|i| vec![format!("mlx5_{i}")]).collect();
    assert_eq!(paired(&t), want);
    assert!(t.nic_pairing().iter().all(|l| l[0].relation == Pix));
}

#[test]
fn pcie_server_with_one_hca_gives_it_to_every_gpu_and_says_how_far() {
    let t = load(&fixture("pcie-switch-2s.xml"));
    let hca = nic(&t, "mlx5_0");
    assert_eq!(hca.kind, DeviceKind::Infiniband);
    assert_eq!(
        hca.gpu_relations,
        [Sys, Sys, Sys, Sys, Pix, Pix, Node, Node],
        "GPUs 4-5 share its switch, 6-7 another root of socket 1"
    );
    let eno1 = nic(&t, "eno1");
    assert_eq!(eno1.kind, DeviceKind::Ethernet);
    assert_eq!(
        eno1.gpu_relations,
        [Node, Node, Node, Node, Sys, Sys, Sys, Sys]
    );
    // RDMA wins over the nearer plain Ethernet: every GPU gets the HCA.
    assert_eq!(paired(&t), vec![vec!["mlx5_0".to_string()]; 8]);
    let p = t.nic_pairing();
    assert_eq!(
        (p[0][0].relation, p[4][0].relation, p[6][0].relation),
        (Sys, Pix, Node)
    );
    assert_eq!(t.storage.len(), 1);
    assert_eq!(
        (t.storage[0].kind, t.storage[0].names[0].as_str()),
        (DeviceKind::Sata, "sda")
    );
}

#[test]
fn dgx_a100_four_nics_pair_two_gpus_each() {
    let t = load(&fixture("dgx-a100-nps4.xml"));
    assert_eq!(t.nics.len(), 4);
    assert!(t
        .nics
        .iter()
        .all(|n| n.kind == DeviceKind::Infiniband && n.names.is_empty()));
    let m = matrix(&t);
    for (g, row) in m.iter().enumerate() {
        for (n, r) in row.iter().enumerate() {
            // Two GPUs and a NIC per switch; NPS4 nodes of one socket: SOCK.
            let want = if g / 2 == n {
                Pix
            } else if g / 4 == n / 2 {
                Sock
            } else {
                Sys
            };
            assert_eq!(*r, want, "GPU {g} NIC {n}");
        }
    }
    let p: Vec<Vec<usize>> = t
        .nic_pairing()
        .iter()
        .map(|l| l.iter().map(|c| c.nic).collect())
        .collect();
    assert_eq!(p, (0..8).map(|g| vec![g / 2]).collect::<Vec<_>>());
}

#[test]
fn unknown_locality_makes_every_pair_sys_and_pairs_in_bus_order() {
    let t = load(&fixture("cloud-vm-ndv4-nolocality.xml"));
    assert_eq!((t.gpus.len(), t.nics.len()), (8, 8));
    assert!(t.nics.iter().all(|n| n.numa_node.is_none()));
    assert!(
        matrix(&t).iter().flatten().all(|r| *r == Sys),
        "never guessed near"
    );
    let want: Vec<Vec<String>> = (0..8).map(|i| vec![format!("mlx5_ib{i}")]).collect();
    assert_eq!(paired(&t), want);
    // Fixtures without NICs have none, and keep their text report.
    let plain = load(&fixture("cloud-vm-2n-nolocality.xml"));
    assert!(plain.nics.is_empty() && plain.storage.is_empty());
    assert!(!plain.to_text().contains("NIC"));
    assert!(plain.nic_pairing().iter().all(Vec::is_empty));
}

#[test]
fn text_report_has_nic_columns_and_device_tables() {
    let t = load(&fixture("pcie-switch-2s.xml"));
    let text = t.to_text();
    let header = text
        .lines()
        .find(|l| l.trim_start().starts_with("GPU0"))
        .unwrap();
    assert!(header.ends_with("NIC0  NIC1  NIC2"), "{header}");
    let row4 = text.lines().find(|l| l.starts_with("GPU4 ")).unwrap();
    assert!(row4.ends_with("SYS   SYS   PIX"), "{row4}");
    assert!(
        text.contains("GPU-NIC: PIX = through one PCIe switch"),
        "{text}"
    );
    let hca = text.lines().find(|l| l.contains("mlx5_0,ib0")).unwrap();
    assert!(
        hca.contains("infiniband") && hca.ends_with("0,1,2,3,4,5,6,7"),
        "{hca}"
    );
    assert!(text.contains("STORAGE  BUS ID"), "{text}");
}

#[test]
fn json_files_without_nics_still_load_and_bad_relations_are_refused() {
    let t = load(&fixture("dgx-h100.xml"));
    let mut v: serde_json::Value = serde_json::from_str(&t.to_json()).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["nics"][0]["gpu_relations"][0], "PIX");
    assert_eq!(v["storage"][0]["kind"], "nvme");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.json");
    // A file from before NICs were read: no `nics`, no `storage`.
    let mut old = v.clone();
    old.as_object_mut().unwrap().remove("nics");
    old.as_object_mut().unwrap().remove("storage");
    std::fs::write(&path, old.to_string()).unwrap();
    let back = load(&path);
    assert!(back.nics.is_empty() && back.storage.is_empty());
    assert_eq!(back.gpus, t.gpus);
    // A relation list that does not match the GPUs is an input error.
    v["nics"][2]["gpu_relations"] = serde_json::json!(["PIX"]);
    std::fs::write(&path, v.to_string()).unwrap();
    let e = Topology::load(&path, &ProbeOptions::default()).unwrap_err();
    assert_eq!(e.kind(), numapin::ErrorKind::Input);
    assert!(
        e.to_string().contains("nics[2]") && e.to_string().contains("8 GPUs"),
        "{e}"
    );
    assert!(e.to_string().contains("t.json"), "{e}");
}

// --- the real machines in ../shared/topologies -------------------------------

fn shared(rel: &str) -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/topologies")
        .join(rel);
    if p.exists() {
        Some(p)
    } else {
        common::skip(common::Need::Shared, &format!("../shared/topologies/{rel} is not there (the real-machine data set lives beside the checkout)"));
        None
    }
}

#[test]
fn azure_ndv4_nccl_file_pairs_each_gpu_with_a_nic_on_its_switch() {
    let Some(p) = shared("nccl/azure-ndv4-topo.xml") else {
        return;
    };
    let t = load(&p);
    assert_eq!((t.gpus.len(), t.nics.len()), (8, 8));
    assert!(t.nics.iter().all(|n| n.kind == DeviceKind::Infiniband
        && n.names.is_empty()
        && n.rdma_device.is_none()));
    // GPUs and NICs in bus order, two of each per (fake) switch: the four
    // GPU/NIC pairs under a switch are PIX, pairs across switches (other
    // <cpu> elements) SYS.
    let m = matrix(&t);
    let mut pix = 0;
    for (g, row) in m.iter().enumerate() {
        for (n, r) in row.iter().enumerate() {
            assert_eq!(
                *r,
                if g / 2 == n / 2 { Pix } else { Sys },
                "GPU {g} NIC {n}"
            );
            pix += usize::from(*r == Pix);
        }
    }
    assert_eq!(pix, 16);
    let p = t.nic_pairing();
    assert_eq!(
        p.iter()
            .map(|l| l.iter().map(|c| c.nic).collect::<Vec<_>>())
            .collect::<Vec<_>>(),
        (0..8).map(|i| vec![i]).collect::<Vec<_>>(),
        "even sharing gives each rank its own NIC"
    );
    assert_eq!(t.gpus[2].pci_bus_id, "0003:00:00.0");
    assert_eq!(t.nics[2].pci_bus_id.as_deref(), Some("0103:00:00.0"));
    // The same VM seen by hwloc (no locality) pairs the same way.
    let vm = load(&fixture("cloud-vm-ndv4-nolocality.xml"));
    let buses = |t: &Topology| -> Vec<Option<String>> {
        t.nic_pairing()
            .iter()
            .map(|l| t.nics[l[0].nic].pci_bus_id.clone())
            .collect()
    };
    assert_eq!(buses(&vm), buses(&t));
}

#[test]
fn azure_ndv2_one_nic_for_eight_gpus() {
    let Some(p) = shared("nccl/azure-ndv2-topo.xml") else {
        return;
    };
    let t = load(&p);
    assert_eq!(t.nics.len(), 1);
    // NCCL files cannot tell a host bridge from a node: same <cpu> is PHB.
    assert_eq!(
        t.nics[0].gpu_relations,
        [Phb, Phb, Phb, Phb, Sys, Sys, Sys, Sys]
    );
    assert!(t
        .nic_pairing()
        .iter()
        .all(|l| l.len() == 1 && l[0].nic == 0));
}

#[test]
fn hwloc_exports_of_real_machines() {
    let Some(p) = shared("hwloc-xml/32em64t-2n8c2t-pci-wholeio.xml") else {
        return;
    };
    let t = load(&p);
    // Two different devices share bus id 0000:04:00.0 (a SAS controller on
    // socket 0, a ConnectX-4 on socket 1): both are kept.
    let at04: Vec<DeviceKind> = t
        .nics
        .iter()
        .chain(&t.storage)
        .filter(|d| d.pci_bus_id.as_deref() == Some("0000:04:00.0"))
        .map(|d| d.kind)
        .collect();
    assert_eq!(at04, [DeviceKind::Infiniband, DeviceKind::Sas]);
    let cx4 = nic(&t, "mlx5_0");
    assert_eq!(cx4.names, ["mlx5_0", "ib0"]);
    let rel = |bus: &str| {
        let g = t.gpus.iter().find(|g| g.pci_bus_id == bus).unwrap();
        cx4.relation_to(g.index)
    };
    assert_eq!(rel("0000:84:00.0"), Pix, "both below root port 80:03.0");
    assert_eq!(rel("0000:83:00.0"), Phb);
    assert_eq!(rel("0000:03:00.0"), Sys);

    let Some(p) = shared("hwloc-xml/24em64t-2n6c2t-pci.xml") else {
        return;
    };
    let t = load(&p);
    let cx3 = nic(&t, "mlx4_0");
    assert_eq!(
        cx3.kind,
        DeviceKind::Infiniband,
        "ConnectX-3, class 0x0c06, with ib0"
    );
    assert_eq!(cx3.names, ["mlx4_0", "eth2", "ib0"]);
    assert_eq!(cx3.rdma_port, None, "the export records no port states");
    assert_eq!(nic(&t, "eth0").kind, DeviceKind::Ethernet);
    assert_eq!(t.storage[0].kind, DeviceKind::Ide);
}

#[test]
fn captured_sysfs_roots_have_their_nics() {
    let Some(p) = shared("sysfs/40intel64-2g2n4c+pci.tar.bz2") else {
        return;
    };
    let t = load(&p);
    let kinds: Vec<(String, DeviceKind)> = t.nics.iter().map(|n| (n.label(), n.kind)).collect();
    assert_eq!(
        kinds,
        [
            ("eth0".to_string(), DeviceKind::Ethernet),
            ("eth1".to_string(), DeviceKind::Ethernet),
            ("eth2".to_string(), DeviceKind::Ethernet),
            ("eth3".to_string(), DeviceKind::Ethernet),
            ("qib0".to_string(), DeviceKind::Infiniband),
        ]
    );
    assert_eq!(t.storage.len(), 2);
    // The capture gives sysfs link states.
    let qib = &t.nics[4];
    assert!(qib.pcie.is_some(), "{qib:?}");
    assert_eq!(
        qib.relation_to(GpuIndex(0)),
        Sys,
        "no GPUs: nothing recorded"
    );
}
