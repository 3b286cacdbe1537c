//! The invariants the rest of numapin relies on, checked on every
//! description read from a file (a numapin JSON file may have been edited by
//! hand, or written by someone hostile): the limits of [`super::limits`],
//! and that what the description names exists, once.

use std::collections::BTreeSet;

use super::limits::{self, MAX_CPUS, MAX_GPUS, MAX_IO_DEVICES, MAX_NODES};
use super::{iodev, normalize_bus_id, Gpu, Topology, TopologyError as Error};
use crate::cpulist::CpuList;

type Result<T, E = Error> = std::result::Result<T, E>;

/// Marks CPUs as they are claimed, to find two owners of one CPU in one pass.
struct Claims {
    owner: Vec<Option<u32>>,
}

impl Claims {
    fn new() -> Self {
        Self {
            owner: vec![None; MAX_CPUS as usize],
        }
    }

    /// Claims `cpus` for `who`; the first CPU another owner holds, with it.
    fn claim(&mut self, cpus: &CpuList, who: u32) -> Option<(u32, u32)> {
        for c in cpus.iter() {
            // CpuList never holds a CPU beyond MAX_CPUS - 1 (parsing refuses
            // it), but a description built in code may.
            let slot = self.owner.get_mut(c as usize)?;
            match *slot {
                Some(o) if o != who => return Some((c, o)),
                _ => *slot = Some(who),
            }
        }
        None
    }
}

/// What the description lists, for the steps that check references to it.
struct Listed {
    /// NUMA node numbers.
    nodes: BTreeSet<u32>,
    /// Package indexes.
    packages: BTreeSet<u32>,
    /// Every CPU of the nodes and packages.
    cpus: CpuList,
}

/// A contradiction in the description read from `source`.
fn bad(source: &str, problem: String) -> Error {
    Error::input(
        source,
        format!("the description contradicts itself: {problem}"),
        "give an unmodified file: write it again with `numapin topo --json` (or `lstopo --of xml`)",
    )
}

/// Checks `t` (read from `source`), step by step: the counts, the nodes,
/// the packages, what this process may use, the cores, the GPUs, the NICs
/// and storage devices, and the CUDA ordinals.
pub(crate) fn check(t: &Topology, source: &str) -> Result<()> {
    check_counts(t, source)?;
    let nodes = check_nodes(t, source)?;
    let packages = check_packages(t, &nodes, source)?;
    let listed = Listed {
        nodes,
        packages,
        cpus: t.all_cpus(),
    };
    check_allowed(t, &listed, source)?;
    check_cores(t, &listed, source)?;
    check_gpus(t, &listed, source)?;
    for (list, devices) in [("nics", &t.nics), ("storage", &t.storage)] {
        iodev::validate(devices, list, t.gpus.len()).map_err(|p| bad(source, p))?;
    }
    check_ordinals(t, source)?;
    check_gpu_ordinals(t, source)
}

/// Every list within its limit.
fn check_counts(t: &Topology, source: &str) -> Result<()> {
    limits::check_count(source, "NUMA nodes", t.numa_nodes.len(), MAX_NODES as usize)?;
    limits::check_count(source, "GPUs", t.gpus.len(), MAX_GPUS)?;
    limits::check_count(source, "CUDA ordinals", t.cuda.ordinals.len(), MAX_GPUS)?;
    limits::check_count(source, "packages", t.packages.len(), MAX_CPUS as usize)?;
    limits::check_count(source, "cores", t.cores.len(), MAX_CPUS as usize)?;
    limits::check_count(source, "caches", t.caches.len(), MAX_CPUS as usize)?;
    limits::check_count(
        source,
        "NICs and storage devices",
        t.nics.len() + t.storage.len(),
        MAX_IO_DEVICES,
    )
}

/// NUMA nodes: numbered once each, within the limit, own CPUs no other
/// node owns, a distance to each node or none. Returns their numbers.
fn check_nodes(t: &Topology, source: &str) -> Result<BTreeSet<u32>> {
    let mut nodes = BTreeSet::new();
    let mut claims = Claims::new();
    for n in &t.numa_nodes {
        limits::check_node(source, "numa_nodes[]", n.os_index)?;
        if !nodes.insert(n.os_index) {
            return Err(bad(
                source,
                format!("two NUMA nodes are numbered {}", n.os_index),
            ));
        }
        if let Some((cpu, other)) = claims.claim(&n.cpus, n.os_index) {
            return Err(bad(
                source,
                format!("NUMA nodes {other} and {} both hold CPU {cpu}", n.os_index),
            ));
        }
        if !n.distances.is_empty() && n.distances.len() != t.numa_nodes.len() {
            return Err(bad(
                source,
                format!(
                    "node {} has {} distances for {} nodes",
                    n.os_index,
                    n.distances.len(),
                    t.numa_nodes.len()
                ),
            ));
        }
    }
    Ok(nodes)
}

/// Packages: indexed once each, CPUs of their own, nodes that exist; and
/// each node's package exists. Returns their indexes.
fn check_packages(t: &Topology, nodes: &BTreeSet<u32>, source: &str) -> Result<BTreeSet<u32>> {
    let mut packages = BTreeSet::new();
    let mut claims = Claims::new();
    for p in &t.packages {
        if !packages.insert(p.index) {
            return Err(bad(source, format!("two packages have index {}", p.index)));
        }
        if let Some((cpu, other)) = claims.claim(&p.cpus, p.index) {
            return Err(bad(
                source,
                format!("packages {other} and {} both hold CPU {cpu}", p.index),
            ));
        }
        if let Some(n) = p.numa_nodes.iter().find(|n| !nodes.contains(n)) {
            return Err(bad(
                source,
                format!(
                    "package {} lists NUMA node {n}, which is not listed",
                    p.index
                ),
            ));
        }
    }
    for n in &t.numa_nodes {
        if let Some(p) = n.package.filter(|p| !packages.contains(p)) {
            return Err(bad(
                source,
                format!(
                    "NUMA node {} names package {p}, which is not listed",
                    n.os_index
                ),
            ));
        }
    }
    Ok(packages)
}

/// What this process may use exists: listed nodes, each once, and CPUs of
/// the machine.
fn check_allowed(t: &Topology, listed: &Listed, source: &str) -> Result<()> {
    let mut allowed = BTreeSet::new();
    for &n in &t.allowed.numa_nodes {
        limits::check_node(source, "allowed.numa_nodes", n)?;
        if !listed.nodes.contains(&n) {
            return Err(bad(
                source,
                format!("allowed.numa_nodes names node {n}, which is not listed"),
            ));
        }
        if !allowed.insert(n) {
            return Err(bad(
                source,
                format!("allowed.numa_nodes lists node {n} twice"),
            ));
        }
    }
    let outside = t.allowed.cpus.difference(&listed.cpus);
    if !outside.is_empty() {
        return Err(bad(
            source,
            format!("allowed.cpus holds CPUs {outside}, which no node or package has"),
        ));
    }
    Ok(())
}

/// Cores: CPUs of their own, nodes that exist.
fn check_cores(t: &Topology, listed: &Listed, source: &str) -> Result<()> {
    let mut claims = Claims::new();
    for (i, c) in t.cores.iter().enumerate() {
        if let Some((cpu, _)) = claims.claim(&c.cpus, crate::num::u32_saturating(i)) {
            return Err(bad(source, format!("two cores hold CPU {cpu}")));
        }
        if let Some(n) = c.numa_node.filter(|n| !listed.nodes.contains(n)) {
            return Err(bad(
                source,
                format!("a core names NUMA node {n}, which is not listed"),
            ));
        }
    }
    Ok(())
}

/// GPUs: in index order, one PCI bus id each, a node and package that
/// exist, local CPUs of this machine.
fn check_gpus(t: &Topology, listed: &Listed, source: &str) -> Result<()> {
    let mut buses = BTreeSet::new();
    for (i, g) in t.gpus.iter().enumerate() {
        if g.index.as_usize() != i {
            return Err(bad(source, format!("gpus[{i}] has index {}", g.index)));
        }
        if normalize_bus_id(&g.pci_bus_id).as_deref() != Some(g.pci_bus_id.as_str()) {
            return Err(bad(
                source,
                format!(
                    "GPU {i} has PCI bus id {}, not of the form 0000:07:00.0",
                    crate::report::quote(&g.pci_bus_id)
                ),
            ));
        }
        if !buses.insert(g.pci_bus_id.as_str()) {
            return Err(bad(
                source,
                format!("two GPUs have PCI bus id {}", g.pci_bus_id),
            ));
        }
        check_gpu_place(i, g, listed, source)?;
    }
    Ok(())
}

/// GPU `i`'s node, package and local CPUs are listed.
fn check_gpu_place(i: usize, g: &Gpu, listed: &Listed, source: &str) -> Result<()> {
    if let Some(n) = g.numa_node.filter(|n| !listed.nodes.contains(n)) {
        return Err(bad(
            source,
            format!("GPU {i} names NUMA node {n}, which is not listed"),
        ));
    }
    if let Some(p) = g.package.filter(|p| !listed.packages.contains(p)) {
        return Err(bad(
            source,
            format!("GPU {i} names package {p}, which is not listed"),
        ));
    }
    let outside = g.local_cpus.difference(&listed.cpus);
    if !outside.is_empty() {
        return Err(bad(
            source,
            format!("GPU {i}'s local CPUs hold {outside}, which no node or package has"),
        ));
    }
    Ok(())
}

/// CUDA ordinals: 0, 1, ... in order, each naming a GPU that exists, no
/// GPU twice (but for MIG instances of one GPU).
fn check_ordinals(t: &Topology, source: &str) -> Result<()> {
    let mut seen = BTreeSet::new();
    for (i, e) in t.cuda.ordinals.iter().enumerate() {
        if e.ordinal.0 as usize != i {
            return Err(bad(
                source,
                format!(
                    "cuda.ordinals[{i}] is ordinal {}: CUDA numbers its devices 0, 1, ... in order",
                    e.ordinal
                ),
            ));
        }
        let Some(g) = e.gpu else { continue };
        if g.as_usize() >= t.gpus.len() {
            return Err(bad(
                source,
                format!("CUDA ordinal {} maps to missing GPU {g}", e.ordinal),
            ));
        }
        if !e.mig && !seen.insert(g) {
            return Err(bad(
                source,
                format!(
                    "CUDA ordinal {} maps to GPU {g}, which another ordinal already is",
                    e.ordinal
                ),
            ));
        }
    }
    Ok(())
}

/// Each GPU's own ordinal is the one `cuda.ordinals` maps to it.
fn check_gpu_ordinals(t: &Topology, source: &str) -> Result<()> {
    for g in &t.gpus {
        let Some(o) = g.cuda_ordinal else { continue };
        let maps = t
            .cuda
            .ordinals
            .get(o.0 as usize)
            .is_some_and(|e| e.gpu == Some(g.index));
        if !maps {
            return Err(bad(
                source,
                format!(
                    "GPU {} says it is CUDA ordinal {o}, but cuda.ordinals does not map that ordinal to it",
                    g.index
                ),
            ));
        }
    }
    Ok(())
}
