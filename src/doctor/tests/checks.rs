//! Each verdict of the checks of the topology, the limits and the kernel
//! settings, from synthetic topologies and live-state values.

use super::{cpus, gpu, machine, verdicts};
use crate::doctor::gpu::{
    cuda_driver, gpu_cpus_allowed, gpu_memory_allowed, gpu_visibility, locality, pcie_links,
};
use crate::doctor::kernel::{iommu, memory_policy, numa_balancing, transparent_hugepages};
use crate::doctor::limits::{memlock, memlock_need};
use crate::doctor::nic::{nic_locality, nic_pcie_links};
use crate::doctor::Verdict::{Fail, Ok as Pass, Warn};
use crate::gpu::{CudaError, GpuIndex};
use crate::platform::cuda::NoDriver;
use crate::system::{
    CudaDriver, Iommu, MemlockError, MemlockLimit, MempolicyError, PolicyMode, PolicySource, Thp,
    ThreadPolicy,
};
use crate::topology::{DeviceKind, IoDevice, PcieLink, Relation, Topology, Warning, WarningKind};

const MIB: u64 = 1 << 20;

fn lim(soft: u64, hard: u64) -> Result<MemlockLimit, MemlockError> {
    Ok(MemlockLimit { soft, hard })
}

fn policy(mode: i32, nodes: &[u32]) -> Result<ThreadPolicy, MempolicyError> {
    Ok(ThreadPolicy {
        mode: PolicyMode::from_raw(mode),
        nodes: nodes.to_vec(),
        source: PolicySource::GetMempolicy,
    })
}

fn thp(enabled: Option<&str>, defrag: Option<&str>) -> crate::doctor::Check {
    transparent_hugepages(&Thp {
        enabled: enabled.map(String::from),
        defrag: defrag.map(String::from),
    })
}

// ---- memlock ----

#[test]
fn memlock_need_counts_gpu_nodes_or_memory_nodes() {
    let mut t = machine(4);
    let n = memlock_need(&t);
    assert_eq!((n.regions, n.bytes), (4, 1024 * MIB));
    assert!(n.basis.contains("nodes 0-3; no GPU visible"), "{}", n.basis);
    t.numa_nodes[3].memory_bytes = 0; // memoryless
    t.allowed.numa_nodes = vec![0, 1, 3]; // node 2 outside cpuset.mems
    assert_eq!(memlock_need(&t).regions, 2);
    let mut t = machine(4);
    gpu(&mut t, Some(1));
    gpu(&mut t, Some(1));
    gpu(&mut t, Some(3));
    let n = memlock_need(&t);
    assert_eq!((n.regions, n.bytes), (2, 512 * MIB));
    assert!(n.basis.contains("nodes 1,3"), "{}", n.basis);
    gpu(&mut t, None);
    let n = memlock_need(&t);
    assert_eq!(n.regions, 3);
    assert!(
        n.basis.contains("1 GPU(s) whose node is unknown"),
        "{}",
        n.basis
    );
    // A GPU hidden by CUDA_VISIBLE_DEVICES needs nothing.
    t.gpus[3].cuda_ordinal = None;
    assert_eq!(memlock_need(&t).regions, 2);
}

#[test]
fn memlock_verdicts() {
    let t = machine(1); // needs 256 MiB
    let c = memlock(&t, &lim(8 * MIB, 8 * MIB), false, false);
    assert_eq!(c.verdict, Fail);
    assert!(c.evidence.contains("soft 8 MiB, hard 8 MiB; no CAP_IPC_LOCK; numapin needs 256 MiB: one 256 MiB arena region on each node with memory (node 0; no GPU visible)"), "{}", c.evidence);
    let fix = c.fix.unwrap();
    for want in [
        "ulimit -l",
        "LimitMEMLOCK=",
        "--ulimit memlock=",
        "262144 KiB",
        "limits.conf",
        "CAP_IPC_LOCK",
    ] {
        assert!(fix.contains(want), "{want} missing from {fix}");
    }
    // Hard limit high enough: no limits.conf detour.
    let c = memlock(&t, &lim(8 * MIB, u64::MAX), false, false);
    assert_eq!(c.verdict, Fail);
    assert!(!c.fix.unwrap().contains("limits.conf"));
    // Exactly enough, unlimited, or CAP_IPC_LOCK.
    assert_eq!(
        memlock(&t, &lim(256 * MIB, 256 * MIB), false, false).verdict,
        Pass
    );
    assert_eq!(
        memlock(&t, &lim(256 * MIB - 1, u64::MAX), false, false).verdict,
        Fail
    );
    let c = memlock(&t, &lim(u64::MAX, u64::MAX), false, false);
    assert_eq!(c.verdict, Pass);
    assert!(c.evidence.contains("soft unlimited"), "{}", c.evidence);
    let c = memlock(&t, &lim(0, 0), true, false);
    assert_eq!(c.verdict, Pass);
    assert!(c
        .evidence
        .contains("CAP_IPC_LOCK (the limit does not apply)"));
    assert!(c.fix.is_none());
    let e = MemlockError {
        source: std::io::Error::from_raw_os_error(libc::EPERM),
    };
    let c = memlock(&t, &Err(e), false, false);
    assert_eq!(c.verdict, Warn);
    assert!(
        c.evidence
            .starts_with("cannot read RLIMIT_MEMLOCK: Operation not permitted"),
        "{}",
        c.evidence
    );
    // With the CUDA driver, registration pins regions the limit cannot
    // lock: a warning with the same fix, not a failure.
    let c = memlock(&t, &lim(64 << 10, 64 << 10), false, true);
    assert_eq!(c.verdict, Warn);
    assert!(
        c.evidence.contains("CUDA registration pins them"),
        "{}",
        c.evidence
    );
    assert!(c.fix.unwrap().contains("ulimit -l"));
    assert_eq!(
        memlock(&t, &lim(u64::MAX, u64::MAX), false, true).verdict,
        Pass
    );
}

// ---- CUDA ----

#[test]
fn cuda_driver_verdicts() {
    let none = machine(1);
    let mut nv = machine(1);
    gpu(&mut nv, Some(0));
    let c = cuda_driver(
        &nv,
        &CudaDriver::Loaded {
            version: 12080,
            devices: Ok(1),
        },
    );
    assert_eq!(c.verdict, Pass);
    assert!(
        c.evidence.contains("CUDA driver 12.8 (12080)"),
        "{}",
        c.evidence
    );
    assert!(c.evidence.contains("1 NVIDIA GPU(s)"));
    let missing = CudaDriver::Unavailable(CudaError::NoDriver(NoDriver::NotInstalled));
    let c = cuda_driver(&none, &missing);
    assert_eq!(c.verdict, Pass);
    assert!(
        c.evidence.contains("libcuda.so was not found") && c.evidence.contains("none is needed")
    );
    let c = cuda_driver(&nv, &missing);
    assert_eq!(c.verdict, Fail);
    assert!(c.fix.unwrap().contains("nvidia-smi"));
    let off = CudaDriver::Unavailable(CudaError::NoDriver(NoDriver::Disabled));
    assert_eq!(cuda_driver(&nv, &off).verdict, Warn);
    assert_eq!(cuda_driver(&none, &off).verdict, Pass);
    assert_eq!(cuda_driver(&nv, &CudaDriver::NotLoaded).verdict, Warn);
    let c = cuda_driver(&none, &CudaDriver::NotLoaded);
    assert_eq!(c.verdict, Pass);
    assert!(c.evidence.contains("--no-cuda"));
    // A stand-in accelerator is not an NVIDIA GPU.
    let mut other = machine(1);
    gpu(&mut other, Some(0)).vendor_id = "0x1b36".into();
    assert_eq!(cuda_driver(&other, &missing).verdict, Pass);
}

#[test]
fn gpu_visibility_verdicts() {
    let c = gpu_visibility(&machine(1));
    assert_eq!(verdicts(&c), [Pass]);
    assert!(c[0].evidence.contains("no GPUs found"));

    let mut t = machine(2);
    gpu(&mut t, Some(0)).name = Some("NVIDIA H100".into());
    gpu(&mut t, Some(1));
    // The driver lists only GPU 0: GPU 1 is missing from CUDA.
    t.gpus[1].cuda_ordinal = None;
    t.cuda.ordinals.pop();
    let c = gpu_visibility(&t);
    assert_eq!(verdicts(&c), [Pass, Fail]);
    assert!(
        c[0].evidence.contains("NVIDIA H100: CUDA ordinal 0"),
        "{}",
        c[0].evidence
    );
    assert_eq!(c[1].gpu(), Some(GpuIndex(1)));
    assert!(c[1].fix.as_ref().unwrap().contains("dmesg"));
    // ... unless CUDA_VISIBLE_DEVICES hides it.
    t.cuda.visible_devices = Some("0".into());
    let c = gpu_visibility(&t);
    assert_eq!(verdicts(&c), [Pass, Pass]);
    assert!(
        c[1].evidence.contains("CUDA_VISIBLE_DEVICES=\"0\""),
        "{}",
        c[1].evidence
    );

    // No driver on this machine: not checked (warn); a saved machine: ok.
    let mut t = machine(1);
    gpu(&mut t, Some(0));
    t.cuda.ordinal_source = "pci_order".into();
    let c = gpu_visibility(&t);
    assert_eq!(verdicts(&c), [Warn]);
    assert!(c[0].evidence.contains("assumed from PCI order"));
    t.source = "saved.xml".into();
    assert_eq!(verdicts(&gpu_visibility(&t)), [Pass]);
    // A stand-in accelerator is fine either way.
    t.source = "live".into();
    t.gpus[0].vendor_id = "0x1b36".into();
    assert_eq!(verdicts(&gpu_visibility(&t)), [Pass]);
    t.cuda.ordinal_source = "driver".into();
    t.gpus[0].cuda_ordinal = None;
    assert_eq!(verdicts(&gpu_visibility(&t)), [Pass]);

    // Topology notes about CUDA_VISIBLE_DEVICES become warnings.
    t.warnings.push(Warning {
        kind: WarningKind::CudaVisibleDevices,
        gpu: None,
        message: "CUDA_VISIBLE_DEVICES=\"\" hides every GPU from CUDA".into(),
    });
    t.warnings.push(Warning {
        kind: WarningKind::GpuLocalityUnknown,
        gpu: Some(GpuIndex(0)),
        message: "reported by gpu_locality instead".into(),
    });
    let c = gpu_visibility(&t);
    assert_eq!(verdicts(&c), [Pass, Warn]);
    assert_eq!(c[1].name, "cuda_visible_devices");
}

// ---- PCIe ----

fn link(cg: Option<u8>, cw: Option<u8>, mg: Option<u8>, mw: Option<u8>) -> Option<PcieLink> {
    Some(PcieLink {
        current_gen: cg,
        current_width: cw,
        max_gen: mg,
        max_width: mw,
        speed_gbps: None,
    })
}

#[test]
fn pcie_link_verdicts() {
    assert_eq!(verdicts(&pcie_links(&machine(1))), [Pass]);
    let mut t = machine(1);
    for l in [
        link(Some(5), Some(16), Some(5), Some(16)), // at maximum
        link(Some(1), Some(16), Some(5), Some(16)), // idle downclock
        link(Some(5), Some(8), Some(5), Some(16)),  // half width
        link(Some(3), Some(4), Some(4), Some(16)),  // both
        link(Some(4), Some(16), None, None),        // maximum unknown
        None,                                       // not reported
        link(None, None, Some(5), Some(16)),        // current unknown
    ] {
        gpu(&mut t, Some(0)).pcie = l;
    }
    let c = pcie_links(&t);
    assert_eq!(verdicts(&c), [Pass, Warn, Fail, Fail, Pass, Pass, Pass]);
    assert!(
        c[0].evidence
            .contains("Gen5 x16, maximum Gen5 x16: at its maximum"),
        "{}",
        c[0].evidence
    );
    assert!(
        c[1].evidence.contains("lower the link speed when idle"),
        "{}",
        c[1].evidence
    );
    assert!(c[1].fix.as_ref().unwrap().contains("pcie.link.gen.current"));
    assert!(
        c[2].evidence
            .contains("8 of 16 lanes, so at most 8/16 of the bandwidth"),
        "{}",
        c[2].evidence
    );
    assert!(c[2].fix.as_ref().unwrap().contains("reseat"));
    assert!(c[3].evidence.contains("and a lower generation"));
    assert!(c[4].evidence.contains("maximum not reported"));
    assert!(c[5].evidence.contains("not reported by sysfs"));
    assert_eq!(
        c.iter().map(|c| c.gpu().unwrap().get()).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4, 5, 6]
    );
}

// ---- locality, allowed CPUs and nodes ----

#[test]
fn locality_verdicts() {
    assert_eq!(verdicts(&locality(&machine(2))), [Pass]);
    let mut t = machine(2);
    gpu(&mut t, Some(1));
    gpu(&mut t, None);
    let c = locality(&t);
    assert_eq!(verdicts(&c), [Pass, Warn]);
    assert!(
        c[0].evidence
            .contains("on NUMA node 1 (package 0), local CPUs 4-7"),
        "{}",
        c[0].evidence
    );
    assert!(c[1]
        .evidence
        .contains("NUMA node unknown on a machine with 2 nodes"));
    assert!(c[1].fix.as_ref().unwrap().contains("SRAT"));
    // One node: an unknown node is no loss.
    let mut t = machine(1);
    gpu(&mut t, None);
    assert_eq!(verdicts(&locality(&t)), [Pass]);
}

#[test]
fn gpu_cpus_allowed_verdicts() {
    assert_eq!(verdicts(&gpu_cpus_allowed(&machine(2))), [Pass]);
    let mut t = machine(3);
    gpu(&mut t, Some(0));
    gpu(&mut t, Some(1));
    gpu(&mut t, Some(2));
    gpu(&mut t, None);
    gpu(&mut t, Some(2)).cuda_ordinal = None;
    t.allowed.cpus = cpus("0-3,6-7");
    let c = gpu_cpus_allowed(&t);
    assert_eq!(verdicts(&c), [Pass, Warn, Fail, Pass, Pass]);
    assert!(
        c[0].evidence
            .contains("local CPUs 0-3; this process may use CPUs 0-3,6-7: all of them"),
        "{}",
        c[0].evidence
    );
    assert!(
        c[1].evidence
            .contains("2 of its 4 local CPUs are excluded (4-5)"),
        "{}",
        c[1].evidence
    );
    assert!(c[2].evidence.contains("none of them"));
    assert!(c[2].fix.as_ref().unwrap().contains("--cpuset-cpus"));
    assert!(c[3].evidence.contains("local CPUs unknown"));
    assert!(c[4].evidence.contains("not visible to this process"));
    t.source = "box.xml".into();
    assert!(gpu_cpus_allowed(&t)[0]
        .evidence
        .contains("the process that recorded box.xml"));
}

#[test]
fn gpu_memory_allowed_verdicts() {
    assert_eq!(verdicts(&gpu_memory_allowed(&machine(2))), [Pass]);
    let mut t = machine(2);
    gpu(&mut t, Some(0));
    gpu(&mut t, Some(1));
    gpu(&mut t, None);
    gpu(&mut t, Some(1)).cuda_ordinal = None;
    t.allowed.numa_nodes = vec![0];
    let c = gpu_memory_allowed(&t);
    assert_eq!(verdicts(&c), [Pass, Fail, Pass, Pass]);
    assert!(
        c[1].evidence
            .contains("node 1 is not among the memory nodes this process may use (0)"),
        "{}",
        c[1].evidence
    );
    assert!(c[1].fix.as_ref().unwrap().contains("cpuset.mems"));
    t.allowed.numa_nodes.clear();
    assert_eq!(verdicts(&gpu_memory_allowed(&t)), [Pass, Pass, Pass, Pass]);
}

// ---- memory policy ----

#[test]
fn memory_policy_verdicts() {
    let mut t = machine(4);
    gpu(&mut t, Some(2));
    gpu(&mut t, Some(3));
    let p = |mode: i32, nodes: &[u32]| memory_policy(&t, &policy(mode, nodes));
    assert_eq!(p(0, &[]).verdict, Pass);
    assert_eq!(p(4, &[]).verdict, Pass); // local
    let c = p(2, &[2, 3]);
    assert_eq!(c.verdict, Pass);
    assert!(
        c.evidence
            .contains("bind over nodes 2-3; the GPUs this process sees are on nodes 2-3"),
        "{}",
        c.evidence
    );
    assert_eq!(p(3, &[0, 1, 2, 3]).verdict, Pass); // interleave over all
    let c = p(2, &[0, 1]);
    assert_eq!(c.verdict, Fail);
    assert!(c.evidence.contains("bound away from every GPU's node"));
    assert!(c.fix.as_ref().unwrap().contains("numapin exec"));
    let c = p(2, &[0, 2]);
    assert_eq!(c.verdict, Warn);
    assert!(
        c.evidence.contains("GPU node(s) 3 left out"),
        "{}",
        c.evidence
    );
    assert_eq!(p(1, &[0]).verdict, Warn); // preferred elsewhere: falls back
    assert_eq!(p(2 | 1 << 15, &[0]).verdict, Fail); // flags do not hide the mode
    assert_eq!(
        memory_policy(
            &t,
            &Err(MempolicyError::Refused {
                errno: "ENOSYS".into()
            })
        )
        .verdict,
        Warn
    );
    // No GPU: nothing to compare with.
    assert_eq!(memory_policy(&machine(2), &policy(2, &[1])).verdict, Pass);
}

// ---- kernel settings ----

#[test]
fn thp_verdicts() {
    let c = thp(
        Some("always [madvise] never\n"),
        Some("always defer defer+madvise [madvise] never\n"),
    );
    assert_eq!(c.verdict, Pass);
    assert_eq!(
        c.evidence,
        "enabled: madvise, defrag: madvise: arena regions get huge pages (MADV_HUGEPAGE)"
    );
    assert_eq!(thp(Some("[always] madvise never"), None).verdict, Pass);
    let c = thp(Some("always madvise [never]"), Some("[madvise]"));
    assert_eq!(c.verdict, Warn);
    assert!(c
        .fix
        .as_ref()
        .unwrap()
        .contains("transparent_hugepage=madvise"));
    let c = thp(
        Some("[always] madvise never"),
        Some("[always] defer madvise never"),
    );
    assert_eq!(c.verdict, Warn);
    assert!(c.evidence.contains("direct compaction"));
    assert_eq!(thp(None, None).verdict, Warn);
    assert_eq!(thp(Some("garbage here"), None).verdict, Warn);
}

#[test]
fn numa_balancing_verdicts() {
    let two = machine(2);
    assert_eq!(numa_balancing(&two, Some("0\n")).verdict, Pass);
    let c = numa_balancing(&two, Some("1\n"));
    assert_eq!(c.verdict, Warn);
    assert!(c
        .fix
        .as_ref()
        .unwrap()
        .contains("sysctl -w kernel.numa_balancing=0"));
    assert!(numa_balancing(&two, Some("3"))
        .evidence
        .contains("memory tiering"));
    assert_eq!(numa_balancing(&machine(1), Some("1")).verdict, Pass);
    assert_eq!(numa_balancing(&two, None).verdict, Pass);
    assert_eq!(numa_balancing(&two, Some("yes")).verdict, Warn);
}

#[test]
fn iommu_verdicts() {
    let mut t = machine(2);
    gpu(&mut t, Some(0));
    gpu(&mut t, Some(1));
    let view = |cmdline: &str, units: &[&str], domains: [Option<&str>; 2]| Iommu {
        cmdline: Some(cmdline.into()),
        units: Some(units.iter().map(|s| s.to_string()).collect()),
        groups: Some(if units.is_empty() { 0 } else { 40 }),
        gpu_domains: domains
            .iter()
            .enumerate()
            .map(|(i, d)| (GpuIndex(u32::try_from(i).unwrap()), d.map(String::from)))
            .collect(),
    };
    // No IOMMU.
    let c = iommu(&t, &view("quiet", &[], [None, None]));
    assert_eq!(c.verdict, Pass);
    assert!(c.evidence.contains("no IOMMU active"), "{}", c.evidence);
    // Passthrough, read from the groups or from the command line.
    let c = iommu(
        &t,
        &view(
            "intel_iommu=on iommu=pt",
            &["dmar0"],
            [Some("identity"), Some("identity")],
        ),
    );
    assert_eq!(c.verdict, Pass);
    assert!(c.evidence.contains("kernel command line: intel_iommu=on iommu=pt; IOMMU units dmar0; 40 IOMMU group(s); GPU domains: GPU 0 identity, GPU 1 identity"), "{}", c.evidence);
    assert_eq!(
        iommu(&t, &view("iommu=pt", &["dmar0"], [None, None])).verdict,
        Pass
    );
    assert_eq!(
        iommu(&t, &view("iommu.passthrough=1", &["smmu3.0"], [None, None])).verdict,
        Pass
    );
    // Translated DMA.
    let c = iommu(
        &t,
        &view(
            "intel_iommu=on",
            &["dmar0"],
            [Some("identity"), Some("DMA-FQ")],
        ),
    );
    assert_eq!(c.verdict, Warn);
    assert!(
        c.evidence.contains("DMA of GPU(s) 1 is translated"),
        "{}",
        c.evidence
    );
    assert!(c.fix.as_ref().unwrap().contains("iommu=pt"));
    // Active, domains unreadable, no passthrough asked for.
    assert_eq!(
        iommu(&t, &view("quiet", &["ivhd0"], [None, None])).verdict,
        Warn
    );
    // Blocked: the GPU cannot DMA.
    assert_eq!(
        iommu(&t, &view("", &["dmar0"], [Some("blocked"), Some("DMA")])).verdict,
        Fail
    );
    // No GPU: nothing to judge.
    assert_eq!(
        iommu(&machine(1), &view("quiet", &["dmar0"], [None, None])).verdict,
        Pass
    );
    // Nothing readable.
    assert_eq!(iommu(&t, &Iommu::default()).verdict, Pass);
}

// ---- NICs ----

/// Adds a NIC at `relations` from the GPUs (in their order), on `node`.
fn nic<'a>(
    t: &'a mut Topology,
    name: &str,
    node: Option<u32>,
    relations: &[Relation],
) -> &'a mut IoDevice {
    let i = t.nics.len();
    t.nics.push(IoDevice {
        pci_bus_id: Some(format!("0000:{:02x}:00.0", 0x80 + i)),
        kind: DeviceKind::Infiniband,
        names: vec![name.into()],
        rdma_device: Some(name.into()),
        rdma_port: Some(1),
        numa_node: node,
        package: node.map(|n| n / 2),
        pcie: None,
        gpu_relations: relations.to_vec(),
        vendor_id: "0x15b3".into(),
        device_id: "0x1021".into(),
        class_id: "0x0207".into(),
    });
    t.nics.last_mut().unwrap()
}

#[test]
fn nic_locality_verdicts() {
    use Relation::*;
    let mut t = machine(4);
    gpu(&mut t, Some(0));
    assert_eq!(
        verdicts(&nic_locality(&t)),
        [Pass],
        "no NIC: nothing to check"
    );
    assert!(nic_locality(&t)[0].evidence.contains("no NICs found"));
    gpu(&mut t, Some(2));
    gpu(&mut t, None);
    // NIC 0 on node 0 (PIX to GPU 0), NIC 1 on node 3 (other socket).
    nic(&mut t, "mlx5_0", Some(0), &[Pix, Sys, Sys]);
    nic(&mut t, "mlx5_1", Some(3), &[Sys, Sock, Sys]);
    let c = nic_locality(&t);
    assert_eq!(verdicts(&c), [Pass, Pass, Warn]);
    assert!(
        c[0].evidence.contains("NIC 0 (mlx5_0, 0000:80:00.0), PIX"),
        "{}",
        c[0].evidence
    );
    assert!(c[1].evidence.ends_with("SOCK"), "{}", c[1].evidence);
    // GPU 2's node is unknown: SYS, and the fix speaks of the locality.
    assert!(
        c[2].evidence
            .contains("locality of the GPU or of the NIC is unknown"),
        "{}",
        c[2].evidence
    );
    assert!(c[2].fix.as_ref().unwrap().contains("NCCL_TOPO_FILE"));
    assert_eq!(
        c.iter().map(|c| c.gpu().unwrap().get()).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    // A GPU whose only NICs are across the socket link, locality known.
    t.nics.truncate(1);
    let c = nic_locality(&t);
    assert_eq!(verdicts(&c), [Pass, Warn, Warn]);
    assert!(
        c[1].evidence.contains("crosses the link between sockets"),
        "{}",
        c[1].evidence
    );
    assert!(
        c[1].fix.as_ref().unwrap().contains("socket (package 1)"),
        "{:?}",
        c[1].fix
    );
}

#[test]
fn nic_pcie_link_verdicts() {
    let mut t = machine(2);
    assert_eq!(verdicts(&nic_pcie_links(&t)), [Pass]);
    for l in [
        link(Some(5), Some(16), Some(5), Some(16)), // at maximum
        link(Some(4), Some(16), Some(5), Some(16)), // lower generation
        link(Some(5), Some(8), Some(5), Some(16)),  // half width
        link(Some(4), Some(16), None, None),        // maximum unknown
        None,                                       // not reported
    ] {
        nic(&mut t, "mlx5_x", Some(0), &[]).pcie = l;
    }
    let c = nic_pcie_links(&t);
    assert_eq!(verdicts(&c), [Pass, Warn, Warn, Pass, Pass]);
    assert!(
        c[1].evidence
            .contains("link running at Gen4 x16, below its maximum Gen5 x16"),
        "{}",
        c[1].evidence
    );
    assert!(
        c[2].fix.as_ref().unwrap().contains("wired for x16 at Gen5"),
        "{:?}",
        c[2].fix
    );
    assert!(
        c[2].fix
            .as_ref()
            .unwrap()
            .contains("lspci -vv -s 0000:82:00.0"),
        "{:?}",
        c[2].fix
    );
    assert!(c[3].evidence.contains("maximum not reported"));
    assert!(c[4].evidence.contains("not reported by sysfs"));
    assert_eq!(
        c.iter().map(|c| c.nic().unwrap()).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    assert!(c.iter().all(|c| c.gpu().is_none()));
}
