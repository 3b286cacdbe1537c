//! Which drive a file lives on, its NUMA node, and how it relates to a
//! GPU: the file's device leads to its drives' PCI functions
//! (`platform::block`), which the topology's storage devices place.

use std::path::{Path, PathBuf};

use crate::gpu::{CudaOrdinal, GpuIndex};
use crate::platform::block::{self, Backing};
use crate::runtime::Runtime;
use crate::topology::{DeviceKind, Relation, Topology};

use super::{Source, StorageError};

/// A drive holding (part of) a file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Drive {
    /// Its block device (`nvme0n1`, `sda`, `vda`).
    pub name: String,
    /// The PCI function it hangs off, when it has one.
    pub pci_bus_id: Option<String>,
    /// Its NUMA node: the topology's storage device's, else the kernel's
    /// (`numa_node` of the PCI function); `None` when unknown.
    pub numa_node: Option<u32>,
    /// Its package (socket), when known.
    pub package: Option<u32>,
    /// What it is, when the topology lists it (`nvme`, `block`, ...).
    pub kind: Option<DeviceKind>,
    /// Its relation to each GPU of the topology (in [`Topology::gpus`]
    /// order), when the topology lists it; empty otherwise.
    pub gpu_relations: Vec<Relation>,
}

impl Drive {
    /// A drive called `name` on PCI function `pci_bus_id` and NUMA node
    /// `numa_node`, not placed in a topology (no package, kind or
    /// relations): to describe a machine's drives by hand.
    pub fn new(
        name: impl Into<String>,
        pci_bus_id: Option<String>,
        numa_node: Option<u32>,
    ) -> Drive {
        Drive {
            name: name.into(),
            pci_bus_id,
            numa_node,
            package: None,
            kind: None,
            gpu_relations: Vec::new(),
        }
    }

    /// `nvme0n1 (0000:41:00.0, node 1)`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(p) = &self.pci_bus_id {
            parts.push(p.clone());
        }
        parts.push(match self.numa_node {
            Some(n) => format!("node {n}"),
            None => "node unknown".into(),
        });
        format!("{} ({})", self.name, parts.join(", "))
    }
}

/// Where a file lives.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileLocation {
    /// The file.
    pub path: PathBuf,
    /// The block device of its filesystem (`nvme0n1p2`, `dm-0`), when it
    /// has one.
    pub device: Option<String>,
    /// The drives below that device (several for RAID or LVM over drives).
    pub drives: Vec<Drive>,
    /// For a filesystem without a block device: its type and source
    /// (`nfs4`, `server:/export`), as mountinfo has them.
    pub filesystem: Option<(String, String)>,
    /// Why nothing was found, when nothing was.
    pub note: Option<String>,
}

impl FileLocation {
    /// `path` on block device `device`, held by `drives`.
    pub fn on_drives(
        path: impl Into<PathBuf>,
        device: impl Into<String>,
        drives: Vec<Drive>,
    ) -> FileLocation {
        FileLocation {
            path: path.into(),
            device: Some(device.into()),
            drives,
            filesystem: None,
            note: None,
        }
    }

    /// `nvme0n1p2 on nvme0n1 (0000:41:00.0, node 1)`, `nfs4 server:/export`.
    pub fn describe(&self) -> String {
        if let Some((t, s)) = &self.filesystem {
            return format!("{t} {s} (no local drive)");
        }
        if let Some(n) = &self.note {
            return format!("unknown drive ({n})");
        }
        let drives: Vec<String> = self.drives.iter().map(Drive::describe).collect();
        format!(
            "{} on {}",
            self.device.as_deref().unwrap_or("?"),
            if drives.is_empty() {
                "no PCI drive".to_string()
            } else {
                drives.join(", ")
            }
        )
    }

    /// Sentences about reading this file for GPU `gpu` (or into memory on
    /// `node`): its drives behind another NUMA node or socket. None on a
    /// one-node machine, or when the drives' places are unknown.
    pub fn warnings_for(&self, topo: &Topology, node: u32, gpu: Option<GpuIndex>) -> Vec<String> {
        if topo.numa_nodes.len() <= 1 {
            return Vec::new();
        }
        let package_of = |n: u32| topo.node(n).and_then(|x| x.package);
        let who = match gpu.and_then(|g| topo.gpu(g)) {
            Some(g) => format!("GPU {} ({}, node {node})", g.index, g.pci_bus_id),
            None => format!("memory on node {node}"),
        };
        let mut out = Vec::new();
        for d in &self.drives {
            let Some(dn) = d.numa_node else { continue };
            let far = match gpu.map(|g| d.gpu_relations.get(g.as_usize())) {
                Some(Some(Relation::Sys)) => Some(true),
                Some(Some(Relation::Sock)) => Some(false),
                Some(Some(_)) => None,
                _ if dn == node => None,
                _ => Some(package_of(dn) != package_of(node) || package_of(dn).is_none()),
            };
            let Some(cross_socket) = far else { continue };
            let how = if cross_socket {
                "behind the other socket: every byte crosses the socket link"
            } else {
                "on another NUMA node of the same socket"
            };
            out.push(format!(
                "{} is on {}, {how} to reach {who}\n  fix: keep the files on a drive of node {node} (`numapin topo` lists the drives), or read them for a GPU of node {dn}",
                self.path.display(),
                d.describe()
            ));
        }
        out
    }
}

/// Where the file (or folder) at `path` lives: its filesystem's block
/// device, the drives below it and their NUMA nodes, placed in `topo`'s
/// storage devices.
///
/// # Errors
/// [`StorageError::Input`] when the path does not exist or cannot be
/// read.
pub fn locate(path: impl AsRef<Path>, topo: &Topology) -> Result<FileLocation, StorageError> {
    use std::os::unix::fs::MetadataExt;
    let path = path.as_ref();
    let m = std::fs::metadata(path)
        .map_err(|e| StorageError::input_from(path, "cannot be read", "check the path", e))?;
    let dev = (libc::major(m.dev()), libc::minor(m.dev()));
    Ok(place(path, &block::locate(dev, Path::new("/")), topo))
}

/// The local filesystems mounted in this process's view (those on a block
/// device), each once with its first mount point as the path, and where
/// they live: what `numapin doctor` checks against the GPUs.
pub fn mounted(topo: &Topology) -> Vec<FileLocation> {
    block::block_mounts(Path::new("/"))
        .into_iter()
        .map(|(point, dev)| place(&point, &block::locate(dev, Path::new("/")), topo))
        .collect()
}

/// Where `src` lives, placed in `topo`.
pub(crate) fn of_source(src: &Source, topo: &Topology) -> FileLocation {
    place(src.path(), src.backing(), topo)
}

/// The location of `path` backed by `backing`, placed in `topo`.
fn place(path: &Path, backing: &Backing, topo: &Topology) -> FileLocation {
    let mut loc = FileLocation {
        path: path.to_path_buf(),
        device: None,
        drives: Vec::new(),
        filesystem: None,
        note: None,
    };
    match backing {
        Backing::Block { device, disks } => {
            loc.device = Some(device.clone());
            loc.drives = disks
                .iter()
                .map(|d| {
                    let known = d.pci_bus_id.as_deref().and_then(|p| {
                        topo.storage
                            .iter()
                            .find(|s| s.pci_bus_id.as_deref() == Some(p))
                    });
                    let numa_node = known.and_then(|k| k.numa_node).or(d.numa_node);
                    Drive {
                        name: d.name.clone(),
                        pci_bus_id: d.pci_bus_id.clone(),
                        numa_node,
                        package: known
                            .and_then(|k| k.package)
                            .or_else(|| numa_node.and_then(|n| topo.node(n)?.package)),
                        kind: known.map(|k| k.kind),
                        gpu_relations: known.map(|k| k.gpu_relations.clone()).unwrap_or_default(),
                    }
                })
                .collect();
        }
        Backing::Filesystem { fstype, source } => {
            loc.filesystem = Some((fstype.clone(), source.clone()));
        }
        Backing::Unknown(why) => loc.note = Some(why.clone()),
    }
    loc
}

/// The warnings of a read of `used` sources for `gpu` (or into memory on
/// `node`): each distinct file's drives behind another node or socket.
pub(crate) fn warnings(
    rt: &Runtime,
    sources: &[Source],
    used: impl Iterator<Item = usize>,
    node: u32,
    gpu: Option<CudaOrdinal>,
) -> Vec<String> {
    let topo = rt.topology();
    if topo.numa_nodes.len() <= 1 {
        return Vec::new();
    }
    let mut seen = vec![false; sources.len()];
    let gpu = gpu.and_then(|g| topo.gpu_by_ordinal(g)).map(|g| g.index);
    let mut drives_seen: Vec<String> = Vec::new();
    let mut out: Vec<String> = Vec::new();
    for s in used {
        if std::mem::replace(&mut seen[s], true) {
            continue;
        }
        // One sentence per drive, naming the first file read from it.
        let mut loc = of_source(&sources[s], topo);
        loc.drives.retain(|d| !drives_seen.contains(&d.name));
        drives_seen.extend(loc.drives.iter().map(|d| d.name.clone()));
        out.extend(loc.warnings_for(topo, node, gpu));
    }
    out
}
