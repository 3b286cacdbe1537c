//! NICs and storage devices, and how each relates to each GPU.
//!
//! The readers (hwloc: live, XML, captured roots; NCCL topology files) build
//! a [`tree::PciTree`] of the PCI hierarchy with the GPUs, NICs and drives in
//! it ([`RawIo`]); [`finish`] turns it into [`IoDevice`]s, each with its
//! [`Relation`] to every GPU in the vocabulary of `nvidia-smi topo -m`.
//! [`pairing`] gives each GPU its nearest NICs.

pub(crate) mod hwloc;
mod kind;
pub(crate) mod nccl;
mod pairing;
pub(crate) mod tree;

use serde::{Deserialize, Serialize};

use super::{Gpu, PcieLink};

pub(crate) use pairing::pair;
pub use pairing::NicChoice;

/// Whether a PCI function's ids alone make it a NIC or storage device (a
/// function may also be one by the OS devices below it).
pub(crate) fn is_io_device(vendor: u16, device: u16, class: u16) -> bool {
    kind::classify(vendor, device, class, &[]).is_some()
}

/// How two PCI devices (a GPU and a NIC or drive) reach each other, in the
/// words of `nvidia-smi topo -m`, best first (`Ord` follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Relation {
    /// Through at most one PCIe switch (or the one root port of a
    /// multi-function card), without the host bridge.
    Pix,
    /// Through several PCIe switches, without the host bridge.
    Pxb,
    /// Through the PCIe host bridge (root complex) both hang off.
    Phb,
    /// Different host bridges of the same NUMA node.
    Node,
    /// Different NUMA nodes of the same package (NPS, SNC).
    Sock,
    /// Across the link between packages, or locality unknown: numapin never
    /// guesses that unknown means near.
    Sys,
}

impl Relation {
    /// Every relation, best first.
    pub const ALL: [Relation; 6] = [
        Relation::Pix,
        Relation::Pxb,
        Relation::Phb,
        Relation::Node,
        Relation::Sock,
        Relation::Sys,
    ];

    /// The word `nvidia-smi topo -m` uses (`PIX`, ..., `SYS`).
    pub fn as_str(self) -> &'static str {
        match self {
            Relation::Pix => "PIX",
            Relation::Pxb => "PXB",
            Relation::Phb => "PHB",
            Relation::Node => "NODE",
            Relation::Sock => "SOCK",
            Relation::Sys => "SYS",
        }
    }
}

impl std::fmt::Display for Relation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a NIC or storage device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DeviceKind {
    /// InfiniBand HCA (a verbs device with a LID, an IPoIB interface, or
    /// PCI class 0x0207).
    Infiniband,
    /// RDMA over Converged Ethernet (a verbs device on an Ethernet port).
    Roce,
    /// AWS Elastic Fabric Adapter.
    Efa,
    /// Intel/Cornelis Omni-Path.
    Omnipath,
    /// HPE Slingshot.
    Slingshot,
    /// An Ethernet NIC without RDMA.
    Ethernet,
    /// Another network controller.
    Network,
    /// An NVMe drive (PCI class 0x0108).
    Nvme,
    /// A SATA (AHCI) controller.
    Sata,
    /// A SAS controller.
    Sas,
    /// A RAID controller.
    Raid,
    /// A SCSI controller.
    Scsi,
    /// An IDE controller.
    Ide,
    /// Another storage controller, or a PCI function with block devices
    /// (virtio-blk).
    Block,
    /// A kind this version of numapin does not know (read from a JSON file
    /// written by a later one).
    #[serde(other)]
    Unknown,
}

impl DeviceKind {
    /// The name used in JSON and in the text report (`infiniband`, `nvme`).
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Infiniband => "infiniband",
            DeviceKind::Roce => "roce",
            DeviceKind::Efa => "efa",
            DeviceKind::Omnipath => "omnipath",
            DeviceKind::Slingshot => "slingshot",
            DeviceKind::Ethernet => "ethernet",
            DeviceKind::Network => "network",
            DeviceKind::Nvme => "nvme",
            DeviceKind::Sata => "sata",
            DeviceKind::Sas => "sas",
            DeviceKind::Raid => "raid",
            DeviceKind::Scsi => "scsi",
            DeviceKind::Ide => "ide",
            DeviceKind::Block => "block",
            DeviceKind::Unknown => "unknown",
        }
    }

    /// Whether this is a network device (the [`Topology::nics`](super::Topology::nics) list).
    pub fn is_nic(self) -> bool {
        self.is_rdma() || matches!(self, DeviceKind::Ethernet | DeviceKind::Network)
    }

    /// Whether the NIC does RDMA (what NCCL's and UCX's fast transports use).
    pub fn is_rdma(self) -> bool {
        matches!(
            self,
            DeviceKind::Infiniband
                | DeviceKind::Roce
                | DeviceKind::Efa
                | DeviceKind::Omnipath
                | DeviceKind::Slingshot
        )
    }
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A NIC or a storage device, with its place relative to every GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IoDevice {
    /// PCI bus id, `0000:19:00.0` form; `None` for a network device without
    /// a PCI function (an NCCL `<nic>` directly under a `<cpu>`). Not a
    /// unique key: hwloc exports of real machines repeat bus ids across PCI
    /// domains they merged.
    pub pci_bus_id: Option<String>,
    /// What it is.
    pub kind: DeviceKind,
    /// Its OS names: the verbs device first (`mlx5_0`), then network
    /// interfaces (`ibp26s0`) or block devices (`nvme0n1`). Empty when the
    /// source names none (NCCL files often do not; hwloc XML without OS
    /// devices).
    pub names: Vec<String>,
    /// The verbs (RDMA) device, when it has one: what `UCX_NET_DEVICES` and
    /// `NCCL_IB_HCA` name.
    #[serde(default)]
    pub rdma_device: Option<String>,
    /// The port of [`rdma_device`](Self::rdma_device) to use: the first
    /// active one (the first one when none is active), `None` when the
    /// source does not say (port 1 is then assumed).
    #[serde(default)]
    pub rdma_port: Option<u32>,
    /// The NUMA node it hangs off, `None` when unknown.
    pub numa_node: Option<u32>,
    /// The package it hangs off, `None` when unknown.
    pub package: Option<u32>,
    /// PCIe link, when known.
    pub pcie: Option<PcieLink>,
    /// Its relation to each GPU, in the order of [`Topology::gpus`](super::Topology::gpus).
    #[serde(deserialize_with = "crate::topology::limits::listed::relations")]
    pub gpu_relations: Vec<Relation>,
    /// PCI vendor id (`0x15b3` for NVIDIA/Mellanox), empty when unknown.
    #[serde(default)]
    pub vendor_id: String,
    /// PCI device id, empty when unknown.
    #[serde(default)]
    pub device_id: String,
    /// PCI class (`0x0207` InfiniBand, `0x0108` NVMe), empty when unknown.
    #[serde(default)]
    pub class_id: String,
}

impl IoDevice {
    /// A short name for people: the first OS name, else the bus id.
    pub fn label(&self) -> String {
        match (self.names.first(), &self.pci_bus_id) {
            (Some(n), _) => n.clone(),
            (None, Some(b)) => b.clone(),
            (None, None) => format!("({} device)", self.kind),
        }
    }

    /// Its relation to GPU `gpu` (`SYS` when it has none recorded).
    pub fn relation_to(&self, gpu: crate::gpu::GpuIndex) -> Relation {
        self.gpu_relations
            .get(gpu.as_usize())
            .copied()
            .unwrap_or(Relation::Sys)
    }
}

/// A NIC or drive as a reader found it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RawIoDevice {
    /// Its node in [`RawIo::tree`].
    pub node: usize,
    pub pci_bus_id: Option<String>,
    pub kind: DeviceKind,
    pub names: Vec<String>,
    pub rdma_device: Option<String>,
    pub rdma_port: Option<u32>,
    pub numa_node: Option<u32>,
    pub package: Option<u32>,
    pub pcie: Option<PcieLink>,
    pub vendor: Option<u16>,
    pub device: Option<u16>,
    pub class: Option<u16>,
}

/// The PCI tree a reader found, with its NICs and drives and where the GPUs
/// are in it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct RawIo {
    pub tree: tree::PciTree,
    pub devices: Vec<RawIoDevice>,
    /// Each GPU's bus id and node in the tree (GPU bus ids are unique:
    /// `finish` refuses a file where they are not).
    pub gpus: Vec<(String, usize)>,
}

/// The NICs and the storage devices, each with its relation to every GPU,
/// in PCI bus id order (devices without one last).
pub(crate) fn finish(io: RawIo, gpus: &[Gpu]) -> (Vec<IoDevice>, Vec<IoDevice>) {
    let nodes: Vec<Option<usize>> = gpus
        .iter()
        .map(|g| {
            io.gpus
                .iter()
                .find(|(bus, _)| *bus == g.pci_bus_id)
                .map(|&(_, n)| n)
        })
        .collect();
    let hex = |v: Option<u16>| v.map_or_else(String::new, |v| format!("0x{v:04x}"));
    let mut all: Vec<IoDevice> = io
        .devices
        .into_iter()
        .map(|d| IoDevice {
            gpu_relations: nodes
                .iter()
                .map(|g| g.map_or(Relation::Sys, |g| io.tree.relation(g, d.node)))
                .collect(),
            pci_bus_id: d.pci_bus_id,
            kind: d.kind,
            names: d.names,
            rdma_device: d.rdma_device,
            rdma_port: d.rdma_port,
            numa_node: d.numa_node,
            package: d.package,
            pcie: d.pcie,
            vendor_id: hex(d.vendor),
            device_id: hex(d.device),
            class_id: hex(d.class),
        })
        .collect();
    // Stable: devices with the same bus id keep the reader's order.
    all.sort_by(|a, b| match (&a.pci_bus_id, &b.pci_bus_id) {
        (Some(x), Some(y)) => x.cmp(y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    all.into_iter().partition(|d| d.kind.is_nic())
}

/// Checks a JSON file's devices against its GPUs: `Err(problem)`.
pub(crate) fn validate(devices: &[IoDevice], list: &str, gpus: usize) -> Result<(), String> {
    for (i, d) in devices.iter().enumerate() {
        if d.gpu_relations.len() != gpus {
            return Err(format!(
                "{list}[{i}] ({}) has {} gpu_relations for {gpus} GPUs",
                d.label(),
                d.gpu_relations.len()
            ));
        }
        if d.kind != DeviceKind::Unknown && d.kind.is_nic() != (list == "nics") {
            return Err(format!(
                "{list}[{i}] ({}) is of kind {}, which belongs in {}",
                d.label(),
                d.kind,
                if d.kind.is_nic() { "nics" } else { "storage" }
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relations_and_kinds_read_and_write_their_documented_names() {
        for r in Relation::ALL {
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, format!("\"{}\"", r.as_str()));
            assert_eq!(serde_json::from_str::<Relation>(&json).unwrap(), r);
        }
        assert!(Relation::Pix < Relation::Pxb && Relation::Sock < Relation::Sys);
        let k: DeviceKind = serde_json::from_str("\"infiniband\"").unwrap();
        assert_eq!(k, DeviceKind::Infiniband);
        assert_eq!(
            serde_json::to_string(&DeviceKind::Nvme).unwrap(),
            "\"nvme\""
        );
        let later: DeviceKind = serde_json::from_str("\"cxl_fabric\"").unwrap();
        assert_eq!(
            later,
            DeviceKind::Unknown,
            "a later numapin's kind still reads"
        );
        assert!(!DeviceKind::Unknown.is_nic());
        assert!(DeviceKind::Roce.is_rdma() && !DeviceKind::Ethernet.is_rdma());
        assert!(DeviceKind::Ethernet.is_nic() && !DeviceKind::Nvme.is_nic());
    }
}
