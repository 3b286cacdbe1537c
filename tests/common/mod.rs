//! Machines described in tests: built as `Topology` values directly, so the
//! plan tests need no files.
#![allow(dead_code)]

use numapin::topology::{
    Allowed, Cache, Core, CudaInfo, DeviceKind, Gpu, IoDevice, NodeKind, NumaNode, Package,
    Relation, Topology, VisibleEntry,
};
use numapin::CpuList;

/// The shape of a mocked machine, as in PyTorch's NUMA binding tests: CPUs
/// are numbered in order, socket by socket, node by node, L3 by L3; each
/// physical core has two hardware threads with consecutive numbers (when
/// `smt`), and the GPUs of each node come in order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub sockets: u32,
    pub nodes_per_socket: u32,
    pub gpus_per_node: u32,
    pub l3_per_node: u32,
    pub cores_per_l3: u32,
    pub smt: bool,
}

impl Shape {
    pub(crate) fn new(
        sockets: u32,
        nodes_per_socket: u32,
        gpus_per_node: u32,
        l3_per_node: u32,
        cores_per_l3: u32,
    ) -> Self {
        Self {
            sockets,
            nodes_per_socket,
            gpus_per_node,
            l3_per_node,
            cores_per_l3,
            smt: true,
        }
    }

    pub(crate) fn threads(&self) -> u32 {
        if self.smt {
            2
        } else {
            1
        }
    }

    pub(crate) fn build(&self) -> Topology {
        let mut t = empty("mock");
        let mut cpu = 0u32;
        let mut node = 0u32;
        for s in 0..self.sockets {
            let mut pkg = Package {
                index: s,
                cpus: CpuList::new(),
                numa_nodes: vec![],
            };
            for _ in 0..self.nodes_per_socket {
                let first = cpu;
                for _ in 0..self.l3_per_node {
                    let l3_first = cpu;
                    for _ in 0..self.cores_per_l3 {
                        let core = CpuList::range(cpu, cpu + self.threads() - 1);
                        t.cores.push(Core {
                            cpus: core,
                            numa_node: Some(node),
                        });
                        cpu += self.threads();
                    }
                    t.caches.push(Cache {
                        level: 3,
                        size_bytes: None,
                        cpus: CpuList::range(l3_first, cpu - 1),
                    });
                }
                let cpus = CpuList::range(first, cpu - 1);
                t.numa_nodes.push(NumaNode {
                    os_index: node,
                    package: Some(s),
                    cpus: cpus.clone(),
                    memory_bytes: 1 << 30,
                    distances: vec![],
                    kind: NodeKind::Normal,
                });
                for _ in 0..self.gpus_per_node {
                    add_gpu(&mut t, Some(node), Some(s), cpus.clone());
                }
                pkg.cpus = pkg.cpus.union(&cpus);
                pkg.numa_nodes.push(node);
                node += 1;
            }
            t.packages.push(pkg);
        }
        allow_everything(&mut t);
        t
    }
}

/// A topology with nothing in it.
pub(crate) fn empty(source: &str) -> Topology {
    Topology {
        schema_version: numapin::topology::SCHEMA_VERSION,
        source: source.into(),
        packages: vec![],
        numa_nodes: vec![],
        gpus: vec![],
        allowed: Allowed::default(),
        warnings: vec![],
        cores: vec![],
        caches: vec![],
        cuda: CudaInfo {
            ordinal_source: "pci_order".into(),
            device_order: "FASTEST_FIRST".into(),
            ..Default::default()
        },
        nics: vec![],
        storage: vec![],
    }
}

/// Adds a GPU (with the next CUDA ordinal).
pub(crate) fn add_gpu(
    t: &mut Topology,
    node: Option<u32>,
    package: Option<u32>,
    local_cpus: CpuList,
) {
    let i = t.gpus.len() as u32;
    t.gpus.push(Gpu {
        index: numapin::GpuIndex(i),
        cuda_ordinal: Some(numapin::CudaOrdinal(i)),
        pci_bus_id: format!("0000:{:02x}:00.0", i + 1),
        name: None,
        uuid: None,
        numa_node: node,
        package,
        local_cpus,
        pcie: None,
        vendor_id: "0x10de".into(),
        device_id: "0x2330".into(),
        class_id: "0x0302".into(),
    });
    t.cuda.ordinals.push(VisibleEntry {
        ordinal: numapin::CudaOrdinal(i),
        entry: "*".into(),
        gpu: Some(numapin::GpuIndex(i)),
        mig: false,
    });
}

/// Adds a NIC named `verbs` (an RDMA device on port 1, and interface
/// `if_<verbs>`) of `kind`, at `relations` from the GPUs (in their order).
pub(crate) fn add_nic(t: &mut Topology, verbs: &str, kind: DeviceKind, relations: &[Relation]) {
    let i = t.nics.len();
    t.nics.push(IoDevice {
        pci_bus_id: Some(format!("0000:{:02x}:00.0", 0x80 + i)),
        kind,
        names: vec![verbs.to_string(), format!("if_{verbs}")],
        rdma_device: kind.is_rdma().then(|| verbs.to_string()),
        rdma_port: kind.is_rdma().then_some(1),
        numa_node: None,
        package: None,
        pcie: None,
        gpu_relations: relations.to_vec(),
        vendor_id: "0x15b3".into(),
        device_id: "0x1021".into(),
        class_id: "0x0207".into(),
    });
}

/// Lets the process use every CPU and node.
pub(crate) fn allow_everything(t: &mut Topology) {
    t.allowed.cpus = t.all_cpus();
    t.allowed.numa_nodes = t.numa_nodes.iter().map(|n| n.os_index).collect();
}

pub(crate) fn cpus(s: &str) -> CpuList {
    CpuList::parse(s).unwrap()
}

/// Writes `t` as a numapin JSON file in a temporary folder.
pub(crate) fn write_json(t: &Topology) -> tempfile::TempPath {
    let mut f = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    std::io::Write::write_all(&mut f, t.to_json().as_bytes()).unwrap();
    f.into_temp_path()
}

/// A copy of the executable `exe` that any user can run: the build folder
/// may sit below a directory only its owner can enter (a `mktemp -d`
/// checkout), and tests run some binaries as user `nobody`. Keep the
/// returned folder alive while the copy runs.
pub(crate) fn runnable_by_everyone(
    exe: &std::path::Path,
) -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("numapin-exe")
        .tempdir_in("/tmp")
        .expect("a folder in /tmp");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = dir.path().join(exe.file_name().expect("a file name"));
    std::fs::copy(exe, &copy).expect("copy the executable");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, copy)
}
