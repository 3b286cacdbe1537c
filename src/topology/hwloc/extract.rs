//! What numapin needs of an hwloc topology, in steps: the allowed sets,
//! packages, NUMA nodes (in [`super::nodes`]), their distances, cores,
//! last-level caches, GPUs, and last the PCI tree with the NICs and drives
//! (`iodev::hwloc`). Each step checks its counts and sets against
//! [`limits`] before it builds anything from them.

use std::path::Path;

use hwlocality::object::attributes::{ObjectAttributes, PCIDeviceAttributes};
use hwlocality::object::distance::Distances;
use hwlocality::object::types::ObjectType;
use hwlocality::object::TopologyObject;
use hwlocality::Topology as Hw;

use super::locality::{bus_id_of, io_locality};
use super::nodes::numa_nodes;
use super::sets::{cpus_of, nodes_of};
use crate::topology::limits::{self, MAX_CPUS, MAX_GPUS};
use crate::topology::pcie::pcie_of;
use crate::topology::{
    is_accelerator, Allowed, Cache, Core, NumaNode, Package, ProbeOptions, RawGpu, RawTopology,
    TopologyError as Error,
};

type Result<T, E = Error> = std::result::Result<T, E>;

/// What numapin needs of an hwloc topology; `source` names it in errors,
/// `sysfs_root` is where PCIe link states are read (live and captured
/// machines).
pub(super) fn extract(
    topo: &Hw,
    opts: &ProbeOptions,
    sysfs_root: Option<&Path>,
    source: &str,
) -> Result<RawTopology> {
    let mut raw = RawTopology {
        allowed: allowed(topo, source)?,
        packages: packages(topo, source)?,
        ..RawTopology::default()
    };
    raw.numa_nodes = numa_nodes(topo, &raw.packages, source)?;
    list_nodes_in_packages(&mut raw);
    add_distances(topo, &mut raw.numa_nodes);
    raw.cores = cores(topo, &raw.numa_nodes, source)?;
    raw.caches = last_level_caches(topo, source)?;
    raw.gpus = gpus(topo, &raw, opts, sysfs_root, source)?;
    raw.io = crate::topology::iodev::hwloc::scan(topo, &raw, opts, sysfs_root, source)?;
    Ok(raw)
}

/// What this process may use, checked first with the machine's complete
/// sets: a description whose sets run to infinity fails here, before
/// anything is expanded.
fn allowed(topo: &Hw, source: &str) -> Result<Allowed> {
    let allowed = Allowed {
        cpus: cpus_of(Some(topo.allowed_cpuset()), source)?,
        numa_nodes: nodes_of(Some(topo.allowed_nodeset()), source)?,
    };
    cpus_of(Some(topo.complete_cpuset()), source)?;
    nodes_of(Some(topo.complete_nodeset()), source)?;
    Ok(allowed)
}

/// The packages, by logical index (their nodes are listed later).
fn packages(topo: &Hw, source: &str) -> Result<Vec<Package>> {
    let objs: Vec<&TopologyObject> = topo.objects_with_type(ObjectType::Package).collect();
    limits::check_count(source, "packages", objs.len(), MAX_CPUS as usize)?;
    objs.iter()
        .map(|p| {
            Ok(Package {
                index: crate::num::u32_saturating(p.logical_index()),
                cpus: cpus_of(p.cpuset(), source)?,
                numa_nodes: Vec::new(),
            })
        })
        .collect()
}

/// Lists each node in the package that holds it.
fn list_nodes_in_packages(raw: &mut RawTopology) {
    for node in &raw.numa_nodes {
        if let Some(p) = node.package {
            if let Some(pkg) = raw.packages.iter_mut().find(|x| x.index == p) {
                pkg.numa_nodes.push(node.os_index);
            }
        }
    }
}

/// Distances between NUMA nodes: the first of hwloc's matrices (its
/// "NUMALatency") that covers every node.
fn add_distances(topo: &Hw, nodes: &mut [NumaNode]) {
    let Ok(all) = topo.distances(None) else {
        return;
    };
    for d in all {
        if let Some(rows) = node_rows(&d, nodes) {
            for (i, row) in rows {
                nodes[i].distances = row;
            }
            return;
        }
    }
}

/// A distance matrix's rows, each with the position of its node in
/// `nodes`; `None` when the matrix is not between exactly those nodes.
fn node_rows(d: &Distances<'_>, nodes: &[NumaNode]) -> Option<Vec<(usize, Vec<u32>)>> {
    let n = nodes.len();
    let objs: Vec<Option<&TopologyObject>> = d.objects().collect();
    if objs.len() != n
        || objs
            .iter()
            .any(|o| o.is_none_or(|o| o.object_type() != ObjectType::NUMANode))
    {
        return None;
    }
    let idx: Vec<usize> = objs
        .iter()
        .filter_map(|o| {
            let os = u32::try_from(o.and_then(|o| o.os_index())?).ok()?;
            nodes.iter().position(|x| x.os_index == os)
        })
        .collect();
    if idx.len() != n {
        return None;
    }
    let values = d.distances();
    let rows = idx.iter().enumerate().map(|(a, &ia)| {
        let mut row = vec![0u32; n];
        for (b, &ib) in idx.iter().enumerate() {
            row[ib] = values
                .get(a * n + b)
                .copied()
                .map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX));
        }
        (ia, row)
    });
    Some(rows.collect())
}

/// The physical cores with CPUs, each with the node holding its first CPU.
fn cores(topo: &Hw, nodes: &[NumaNode], source: &str) -> Result<Vec<Core>> {
    let objs = topo.objects_with_type(ObjectType::Core);
    limits::check_count(source, "cores", objs.len(), MAX_CPUS as usize)?;
    let mut cores = Vec::new();
    for c in objs {
        let cpus = cpus_of(c.cpuset(), source)?;
        if cpus.is_empty() {
            continue;
        }
        let numa_node = nodes
            .iter()
            .find(|n| n.cpus.contains(cpus.as_slice()[0]))
            .map(|n| n.os_index);
        cores.push(Core { cpus, numa_node });
    }
    Ok(cores)
}

/// The caches of the highest level present from L5 down to L2. (An L4
/// that spans a whole package, a memory-side cache, is not a core complex:
/// the level below would be preferred when the upper spans a node.)
fn last_level_caches(topo: &Hw, source: &str) -> Result<Vec<Cache>> {
    for (ty, level) in [
        (ObjectType::L5Cache, 5u8),
        (ObjectType::L4Cache, 4),
        (ObjectType::L3Cache, 3),
        (ObjectType::L2Cache, 2),
    ] {
        let objs: Vec<&TopologyObject> = topo.objects_with_type(ty).collect();
        if objs.is_empty() {
            continue;
        }
        limits::check_count(source, "caches", objs.len(), MAX_CPUS as usize)?;
        return objs
            .iter()
            .map(|c| {
                let size_bytes = match c.attributes() {
                    Some(ObjectAttributes::Cache(a)) => a.size().map(|s| s.get()),
                    _ => None,
                };
                Ok(Cache {
                    level,
                    size_bytes,
                    cpus: cpus_of(c.cpuset(), source)?,
                })
            })
            .collect();
    }
    Ok(Vec::new())
}

/// The GPUs and chosen accelerators, in PCI bus id order.
fn gpus(
    topo: &Hw,
    raw: &RawTopology,
    opts: &ProbeOptions,
    sysfs_root: Option<&Path>,
    source: &str,
) -> Result<Vec<RawGpu>> {
    let mut pcis: Vec<&TopologyObject> = topo.objects_with_type(ObjectType::PCIDevice).collect();
    pcis.sort_by_key(|o| match o.attributes() {
        Some(ObjectAttributes::PCIDevice(a)) => {
            (a.domain(), a.bus_id(), a.bus_device(), a.function())
        }
        _ => (u16::MAX, 0, 0, 0),
    });
    let mut gpus = Vec::new();
    for obj in pcis {
        let Some(ObjectAttributes::PCIDevice(a)) = obj.attributes() else {
            continue;
        };
        if !is_accelerator(
            a.vendor_id(),
            a.device_id(),
            a.class_id(),
            &opts.accelerator_ids,
        ) {
            continue;
        }
        if gpus.len() == MAX_GPUS {
            return Err(limits::over(
                source,
                format!("it has more than {MAX_GPUS} GPUs, the limit"),
            ));
        }
        gpus.push(gpu(obj, a, raw, sysfs_root, source)?);
    }
    Ok(gpus)
}

/// One GPU: where it sits, and the name and UUID hwloc's CUDA, NVML or
/// OpenCL readers recorded for it (else the PCI device name).
fn gpu(
    obj: &TopologyObject,
    a: &PCIDeviceAttributes,
    raw: &RawTopology,
    sysfs_root: Option<&Path>,
    source: &str,
) -> Result<RawGpu> {
    let bus_id = bus_id_of(a);
    let (numa_node, package, local_cpus) = io_locality(obj, raw, source)?;
    let text = |s: &std::ffi::CStr| s.to_string_lossy().into_owned();
    let mut name = None;
    let mut uuid = None;
    for od in obj.io_children() {
        if name.is_none() {
            name = od.info("GPUModel").map(text);
        }
        if uuid.is_none() {
            uuid = od.info("NVIDIAUUID").map(text);
        }
    }
    if name.is_none() {
        name = obj.info("PCIDevice").map(text);
    }
    let pcie = pcie_of(sysfs_root, &bus_id, a.link_speed());
    Ok(RawGpu {
        pci_bus_id: bus_id,
        vendor: a.vendor_id(),
        device: a.device_id(),
        class: a.class_id(),
        name,
        uuid: uuid.map(|u| {
            if u.starts_with("GPU-") {
                u
            } else {
                format!("GPU-{u}")
            }
        }),
        numa_node,
        package,
        local_cpus,
        pcie,
    })
}
