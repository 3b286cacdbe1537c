//! The invariants the rest of numapin relies on, checked on every
//! description read from a file (a numapin JSON file may have been edited by
//! hand, or written by someone hostile): the limits of [`super::limits`],
//! and that what the description names exists, once.

use std::collections::BTreeSet;

use super::limits::{self, MAX_CPUS, MAX_GPUS, MAX_IO_DEVICES, MAX_NODES};
use super::{iodev, normalize_bus_id, Topology, TopologyError as Error};
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

/// Checks `t` (read from `source`).
pub(crate) fn check(t: &Topology, source: &str) -> Result<()> {
    let bad = |problem: String| {
        Error::input(
            source,
            format!("the description contradicts itself: {problem}"),
            "give an unmodified file: write it again with `numapin topo --json` (or `lstopo --of xml`)",
        )
    };
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
    )?;

    // NUMA nodes: numbered once each, within the limit, own CPUs no other
    // node owns (and, below, in a package that exists).
    let mut nodes = BTreeSet::new();
    let mut claims = Claims::new();
    for n in &t.numa_nodes {
        limits::check_node(source, "numa_nodes[]", n.os_index)?;
        if !nodes.insert(n.os_index) {
            return Err(bad(format!("two NUMA nodes are numbered {}", n.os_index)));
        }
        if let Some((cpu, other)) = claims.claim(&n.cpus, n.os_index) {
            return Err(bad(format!(
                "NUMA nodes {other} and {} both hold CPU {cpu}",
                n.os_index
            )));
        }
        if !n.distances.is_empty() && n.distances.len() != t.numa_nodes.len() {
            return Err(bad(format!(
                "node {} has {} distances for {} nodes",
                n.os_index,
                n.distances.len(),
                t.numa_nodes.len()
            )));
        }
    }

    // Packages: indexed once each, CPUs of their own, nodes that exist.
    let mut packages = BTreeSet::new();
    let mut claims = Claims::new();
    for p in &t.packages {
        if !packages.insert(p.index) {
            return Err(bad(format!("two packages have index {}", p.index)));
        }
        if let Some((cpu, other)) = claims.claim(&p.cpus, p.index) {
            return Err(bad(format!(
                "packages {other} and {} both hold CPU {cpu}",
                p.index
            )));
        }
        for &n in &p.numa_nodes {
            if !nodes.contains(&n) {
                return Err(bad(format!(
                    "package {} lists NUMA node {n}, which is not listed",
                    p.index
                )));
            }
        }
    }
    for n in &t.numa_nodes {
        if let Some(p) = n.package {
            if !packages.contains(&p) {
                return Err(bad(format!(
                    "NUMA node {} names package {p}, which is not listed",
                    n.os_index
                )));
            }
        }
    }
    let all = t.all_cpus();

    // What this process may use exists.
    let mut allowed = BTreeSet::new();
    for &n in &t.allowed.numa_nodes {
        limits::check_node(source, "allowed.numa_nodes", n)?;
        if !nodes.contains(&n) {
            return Err(bad(format!(
                "allowed.numa_nodes names node {n}, which is not listed"
            )));
        }
        if !allowed.insert(n) {
            return Err(bad(format!("allowed.numa_nodes lists node {n} twice")));
        }
    }
    let outside = t.allowed.cpus.difference(&all);
    if !outside.is_empty() {
        return Err(bad(format!(
            "allowed.cpus holds CPUs {outside}, which no node or package has"
        )));
    }

    // Cores: CPUs of their own, nodes that exist.
    let mut claims = Claims::new();
    for (i, c) in t.cores.iter().enumerate() {
        if let Some((cpu, _)) = claims.claim(&c.cpus, i as u32) {
            return Err(bad(format!("two cores hold CPU {cpu}")));
        }
        if let Some(n) = c.numa_node {
            if !nodes.contains(&n) {
                return Err(bad(format!(
                    "a core names NUMA node {n}, which is not listed"
                )));
            }
        }
    }

    // GPUs: in index order, one PCI bus id each, a node and package that
    // exist, local CPUs of this machine.
    let mut buses = BTreeSet::new();
    for (i, g) in t.gpus.iter().enumerate() {
        if g.index.as_usize() != i {
            return Err(bad(format!("gpus[{i}] has index {}", g.index)));
        }
        if normalize_bus_id(&g.pci_bus_id).as_deref() != Some(g.pci_bus_id.as_str()) {
            return Err(bad(format!(
                "GPU {i} has PCI bus id {}, not of the form 0000:07:00.0",
                crate::report::quote(&g.pci_bus_id)
            )));
        }
        if !buses.insert(g.pci_bus_id.as_str()) {
            return Err(bad(format!("two GPUs have PCI bus id {}", g.pci_bus_id)));
        }
        if let Some(n) = g.numa_node {
            if !nodes.contains(&n) {
                return Err(bad(format!(
                    "GPU {i} names NUMA node {n}, which is not listed"
                )));
            }
        }
        if let Some(p) = g.package {
            if !packages.contains(&p) {
                return Err(bad(format!(
                    "GPU {i} names package {p}, which is not listed"
                )));
            }
        }
        let outside = g.local_cpus.difference(&all);
        if !outside.is_empty() {
            return Err(bad(format!(
                "GPU {i}'s local CPUs hold {outside}, which no node or package has"
            )));
        }
    }

    // NICs and storage devices: a relation to each GPU, each in its list.
    for (list, devices) in [("nics", &t.nics), ("storage", &t.storage)] {
        iodev::validate(devices, list, t.gpus.len()).map_err(bad)?;
    }

    // CUDA ordinals: 0, 1, ... in order, each naming a GPU that exists, no
    // GPU twice (but for MIG instances of one GPU), as each GPU says.
    let mut seen = BTreeSet::new();
    for (i, e) in t.cuda.ordinals.iter().enumerate() {
        if e.ordinal.0 as usize != i {
            return Err(bad(format!(
                "cuda.ordinals[{i}] is ordinal {}: CUDA numbers its devices 0, 1, ... in order",
                e.ordinal
            )));
        }
        if let Some(g) = e.gpu {
            if g.as_usize() >= t.gpus.len() {
                return Err(bad(format!(
                    "CUDA ordinal {} maps to missing GPU {g}",
                    e.ordinal
                )));
            }
            if !e.mig && !seen.insert(g) {
                return Err(bad(format!(
                    "CUDA ordinal {} maps to GPU {g}, which another ordinal already is",
                    e.ordinal
                )));
            }
        }
    }
    for g in &t.gpus {
        if let Some(o) = g.cuda_ordinal {
            let maps = t
                .cuda
                .ordinals
                .get(o.0 as usize)
                .is_some_and(|e| e.gpu == Some(g.index));
            if !maps {
                return Err(bad(format!(
                    "GPU {} says it is CUDA ordinal {o}, but cuda.ordinals does not map that ordinal to it",
                    g.index
                )));
            }
        }
    }
    Ok(())
}
