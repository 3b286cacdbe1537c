//! Where an hwloc object sits: the bus id of a PCI function, the NUMA node,
//! package and CPUs of an I/O object. Shared by the GPU step of the
//! extraction and by the PCI tree's scan (`iodev::hwloc`).

use hwlocality::object::attributes::PCIDeviceAttributes;
use hwlocality::object::types::ObjectType;
use hwlocality::object::TopologyObject;

use super::sets::{cpus_of, nodes_of};
use crate::cpulist::CpuList;
use crate::num::u32_saturating;
use crate::topology::{Package, RawTopology, TopologyError as Error};

type Result<T, E = Error> = std::result::Result<T, E>;

/// A PCI function's bus id, `0000:07:00.0` form.
pub(crate) fn bus_id_of(a: &PCIDeviceAttributes) -> String {
    format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        a.domain(),
        a.bus_id(),
        a.bus_device(),
        a.function()
    )
}

/// Where an I/O object hangs: its NUMA node and package (each `None` when
/// unknown) and its local CPUs, the CPU set of its first non-I/O ancestor.
/// The node is the one node of that ancestor that has CPUs among them (or
/// its only node); a machine-wide ancestor on a multi-node machine gives
/// none, never a guessed node 0.
pub(crate) fn io_locality(
    obj: &TopologyObject,
    raw: &RawTopology,
    source: &str,
) -> Result<(Option<u32>, Option<u32>, CpuList)> {
    let anc = obj.first_non_io_ancestor();
    let local_cpus = cpus_of(anc.and_then(|o| o.cpuset()), source)?;
    let anc_nodes = nodes_of(anc.and_then(|o| o.nodeset()), source)?;
    let with_cpus: Vec<u32> = anc_nodes
        .iter()
        .copied()
        .filter(|n| {
            raw.numa_nodes
                .iter()
                .any(|x| x.os_index == *n && !x.cpus.is_empty() && !x.cpus.is_disjoint(&local_cpus))
        })
        .collect();
    let numa_node = match (with_cpus.as_slice(), anc_nodes.as_slice()) {
        ([one], _) => Some(*one),
        ([], [one]) => Some(*one),
        _ => None,
    };
    let package = anc.and_then(|o| {
        if o.object_type() == ObjectType::Package {
            Some(u32_saturating(o.logical_index()))
        } else {
            o.first_ancestor_with_type(ObjectType::Package)
                .map(|p| u32_saturating(p.logical_index()))
        }
    });
    let package = package.or_else(|| package_holding(&raw.packages, &local_cpus));
    Ok((numa_node, package, local_cpus))
}

/// The one package holding all of `cpus`; `None` for no CPUs, or when no
/// package or several do.
pub(super) fn package_holding(packages: &[Package], cpus: &CpuList) -> Option<u32> {
    if cpus.is_empty() {
        return None;
    }
    let mut hits = packages.iter().filter(|p| cpus.is_subset(&p.cpus));
    match (hits.next(), hits.next()) {
        (Some(p), None) => Some(p.index),
        _ => None,
    }
}
