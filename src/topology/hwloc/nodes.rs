//! The NUMA nodes of an hwloc topology: each node's own CPUs, memory,
//! package and kind.
//!
//! A node's own CPUs are its cpuset less the CPUs of nodes attached deeper
//! (hwloc gives a CPU-less node its parent's cpuset); among nodes left with
//! the same CPUs, ordinary memory keeps them.

use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::ObjectType;
use hwlocality::object::TopologyObject;
use hwlocality::Topology as Hw;

use super::locality::package_holding;
use super::sets::cpus_of;
use crate::cpulist::CpuList;
use crate::num::u32_saturating;
use crate::topology::limits::{self, MAX_NODES};
use crate::topology::{NodeKind, NumaNode, Package, TopologyError as Error};

type Result<T, E = Error> = std::result::Result<T, E>;

/// The nodes by OS index, each placed in one of `packages`.
pub(super) fn numa_nodes(topo: &Hw, packages: &[Package], source: &str) -> Result<Vec<NumaNode>> {
    let mut objs: Vec<&TopologyObject> = topo.objects_with_type(ObjectType::NUMANode).collect();
    limits::check_count(source, "NUMA nodes", objs.len(), MAX_NODES as usize)?;
    objs.sort_by_key(|n| n.os_index().unwrap_or(usize::MAX));
    let full: Vec<CpuList> = objs
        .iter()
        .map(|n| cpus_of(n.cpuset(), source))
        .collect::<Result<_>>()?;
    let subtypes: Vec<Option<String>> = objs
        .iter()
        .map(|n| n.subtype().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    let own = own_cpus(&full, &subtypes);
    objs.iter()
        .enumerate()
        .map(|(i, n)| {
            let cpus = Cpus {
                own: &own[i],
                full: &full[i],
            };
            node(n, i, cpus, subtypes[i].as_deref(), packages, source)
        })
        .collect()
}

/// A node's CPUs: its own, and its whole cpuset.
#[derive(Clone, Copy)]
struct Cpus<'a> {
    own: &'a CpuList,
    full: &'a CpuList,
}

/// Each node's own CPUs, from every node's cpuset (`full`) and subtype.
fn own_cpus(full: &[CpuList], subtypes: &[Option<String>]) -> Vec<CpuList> {
    let mut own: Vec<CpuList> = full
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut mine = c.clone();
            for (j, d) in full.iter().enumerate() {
                if i != j && d.is_subset(c) && d != c {
                    mine = mine.difference(d);
                }
            }
            mine
        })
        .collect();
    for i in 0..own.len() {
        if own[i].is_empty() {
            continue;
        }
        let holder = (0..own.len())
            .filter(|&j| own[j] == own[i])
            .min_by_key(|&j| (subtypes[j].as_deref().is_some_and(|s| s != "DRAM"), j))
            .unwrap_or(i);
        if holder != i {
            own[i] = CpuList::new();
        }
    }
    own
}

/// The node `n`, the `i`th by OS index.
fn node(
    n: &TopologyObject,
    i: usize,
    cpus: Cpus<'_>,
    subtype: Option<&str>,
    packages: &[Package],
    source: &str,
) -> Result<NumaNode> {
    let os_index = n.os_index().unwrap_or(i);
    let Some(os_index) = u32::try_from(os_index).ok().filter(|&o| o < MAX_NODES) else {
        return Err(limits::over(
            source,
            format!(
                "it names NUMA node {os_index}, beyond the limit of {MAX_NODES} nodes (0-{})",
                MAX_NODES - 1
            ),
        ));
    };
    let memory_bytes = match n.attributes() {
        Some(ObjectAttributes::NUMANode(a)) => a.local_memory().map_or(0, |m| m.get()),
        _ => 0,
    };
    // The package holding all of the node's CPUs; for a node without
    // CPUs, the package it is attached under.
    let package = if !cpus.own.is_empty() {
        package_holding(packages, cpus.own)
    } else {
        n.first_ancestor_with_type(ObjectType::Package)
            .map(|p| u32_saturating(p.logical_index()))
            .or_else(|| package_holding(packages, cpus.full))
    };
    Ok(NumaNode {
        os_index,
        package,
        cpus: cpus.own.clone(),
        memory_bytes,
        distances: Vec::new(),
        kind: kind(subtype, memory_bytes, cpus.own),
    })
}

/// What a node holds, from its subtype, memory and own CPUs.
fn kind(subtype: Option<&str>, memory_bytes: u64, own: &CpuList) -> NodeKind {
    if subtype == Some("GPUMemory") {
        NodeKind::GpuMemory
    } else if memory_bytes == 0 {
        NodeKind::Memoryless
    } else if own.is_empty() {
        NodeKind::Cpuless
    } else {
        NodeKind::Normal
    }
}
