//! [`Runtime::place`]: the one answer to "which node and which CPUs for
//! this GPU". Allocations for a GPU ([`Runtime::alloc`]), loaders,
//! staged copies, the storage reader, the Python package and its
//! DataLoader all ask it, so that memory and threads for one GPU always
//! land in the same place, with the same warnings.
//!
//! The CPUs are the affinity planner's ([`crate::affinity::plan`] in
//! [`Mode::Node`]: the allowed CPUs of the GPU's node, with its fallbacks
//! for unknown locality and CPUs outside the process's set). The node is
//! the GPU's own when this process can pin memory there; otherwise the
//! nearest node that can (by the topology's distances), and for a GPU of
//! unknown locality the calling thread's node among the planner's memory
//! nodes. Every fallback says so in [`Site::warnings`]; on a machine with
//! one NUMA node there is nothing to choose and nothing to warn about.

use crate::affinity::{Mode, PlanOptions};
use crate::arena::RuntimeError;
use crate::cpulist::CpuList;
use crate::gpu::{CudaOrdinal, GpuIndex};

use super::Runtime;

/// What a placement is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// The CUDA device: threads on its local CPUs, memory on its node;
    /// copies go to this device.
    Gpu(CudaOrdinal),
    /// The topology GPU (or accelerator) at this index (PCI order), without
    /// CUDA: threads on its local CPUs, memory on its node.
    HostForGpu(GpuIndex),
    /// A NUMA node: threads on the node's CPUs, memory on the node.
    HostNode(u32),
    /// No placement: threads on every allowed CPU, memory on the calling
    /// thread's node.
    Host,
}

impl Target {
    /// Whether the target is a CUDA device (otherwise data stays in host
    /// memory).
    pub fn is_gpu(&self) -> bool {
        matches!(self, Target::Gpu(_))
    }
}

/// Where work for a [`Target`] goes ([`Runtime::place`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Site {
    /// What was placed.
    pub target: Target,
    /// The CPUs threads working for the target run on (never empty).
    pub cpus: CpuList,
    /// The node pinned memory for the target comes from (a node with an
    /// arena).
    pub node: u32,
    /// The GPU (position in [`Topology::gpus`](crate::Topology::gpus)) for
    /// GPU targets.
    pub gpu: Option<GpuIndex>,
    /// What a person should know about how the site was chosen (each
    /// fallback, in a sentence).
    pub warnings: Vec<String>,
}

impl Site {
    /// The CUDA device copies go to ([`Target::Gpu`] only).
    pub fn ordinal(&self) -> Option<CudaOrdinal> {
        match self.target {
            Target::Gpu(o) => Some(o),
            _ => None,
        }
    }
}

impl Runtime {
    /// Where threads and pinned memory for `target` go: the one placement
    /// every part of numapin asks (see the module docs for the rules and
    /// fallbacks).
    ///
    /// # Errors
    ///
    /// [`RuntimeError::UnknownGpu`] for an ordinal the topology does not
    /// have, [`RuntimeError::UnknownGpuIndex`] for an index past its GPUs,
    /// and [`RuntimeError::UnknownNode`] or [`RuntimeError::NoMemory`] for a
    /// [`Target::HostNode`] this process cannot pin memory on.
    ///
    /// # Examples
    ///
    /// ```
    /// # use numapin::topology::{CudaMode, ProbeOptions, Topology};
    /// use numapin::runtime::{Runtime, RuntimeConfig, RuntimeError, Target};
    ///
    /// # let topo = Topology::probe(&ProbeOptions::from_process().with_cuda(CudaMode::Off))?;
    /// let rt = Runtime::new(topo, RuntimeConfig::default())?;
    /// // Each GPU's CPUs and node (Target::Gpu(ordinal) with CUDA).
    /// for gpu in &rt.topology().gpus {
    ///     let site = rt.place(Target::HostForGpu(gpu.index))?;
    ///     println!("GPU {}: node {}, CPUs {}", gpu.index, site.node, site.cpus.to_cpulist());
    ///     for w in &site.warnings {
    ///         println!("  {w}");
    ///     }
    /// }
    /// let here = rt.place(Target::Host)?;
    /// assert!(!here.cpus.is_empty() && rt.arena_nodes().any(|n| n == here.node));
    /// let nowhere = rt.place(Target::HostNode(numapin::topology::MAX_NODES));
    /// assert!(matches!(nowhere, Err(RuntimeError::UnknownNode { .. })));
    /// # Ok::<(), numapin::Error>(())
    /// ```
    pub fn place(&self, target: Target) -> Result<Site, RuntimeError> {
        let topo = self.topology();
        match target {
            Target::Gpu(ordinal) => {
                let index = topo
                    .gpu_by_ordinal(ordinal)
                    .map(|g| g.index)
                    .ok_or_else(|| RuntimeError::UnknownGpu {
                        gpu: ordinal,
                        known: topo.gpus.iter().filter_map(|g| g.cuda_ordinal).collect(),
                    })?;
                Ok(self.near_gpu(target, index))
            }
            Target::HostForGpu(index) => {
                if topo.gpu(index).is_none() {
                    return Err(RuntimeError::UnknownGpuIndex {
                        index,
                        count: topo.gpus.len(),
                    });
                }
                Ok(self.near_gpu(target, index))
            }
            Target::HostNode(node) => self.on_node(node),
            Target::Host => Ok(Site {
                target,
                cpus: self.allowed_cpus(),
                node: self.calling_thread_node(),
                gpu: None,
                warnings: Vec::new(),
            }),
        }
    }

    /// The CPUs this process may use: the topology's allowed set, or, for
    /// a topology that records none, the calling thread's own set.
    pub(crate) fn allowed_cpus(&self) -> CpuList {
        let allowed = &self.topology().allowed.cpus;
        if !allowed.is_empty() {
            return allowed.clone();
        }
        crate::platform::sys::sched_getaffinity_self()
            .unwrap_or_else(|_| self.topology().all_cpus())
    }

    fn on_node(&self, node: u32) -> Result<Site, RuntimeError> {
        self.arena(node)?;
        let allowed = self.allowed_cpus();
        let node_cpus = self
            .topology()
            .node(node)
            .map(|n| n.cpus.clone())
            .unwrap_or_default();
        let local = node_cpus.intersection(&allowed);
        let mut warnings = Vec::new();
        let cpus = if local.is_empty() {
            warnings.push(format!(
                "none of node {node}'s CPUs ({node_cpus}) may be used by this process (allowed: {allowed}); threads run on the allowed CPUs, memory stays on node {node}"
            ));
            allowed
        } else {
            local
        };
        Ok(Site {
            target: Target::HostNode(node),
            cpus,
            node,
            gpu: None,
            warnings,
        })
    }

    /// The site of GPU `index` (in the topology).
    fn near_gpu(&self, target: Target, index: GpuIndex) -> Site {
        let topo = self.topology();
        let several = topo.numa_nodes.len() > 1;
        let (cpus, mems, mut warnings) = self.gpu_cpus(index);
        let (node, why) = self.gpu_node(index, &mems);
        warnings.extend(why);
        if !several {
            warnings.clear();
        }
        Site {
            target,
            cpus,
            node,
            gpu: Some(index),
            warnings,
        }
    }

    /// The planner's CPUs and memory nodes for GPU `index` alone, with its
    /// warnings; every allowed CPU when the topology lists none allowed.
    fn gpu_cpus(&self, index: GpuIndex) -> (CpuList, Vec<u32>, Vec<String>) {
        let topo = self.topology();
        match crate::affinity::plan(topo, &[index], Mode::Node, &PlanOptions::default()) {
            Ok(mut p) => {
                let r = p.ranks.remove(0);
                (r.cpus, r.mems, r.warnings)
            }
            Err(e) => (
                self.allowed_cpus(),
                Vec::new(),
                vec![format!(
                    "GPU {index}: {e}; threads run on this thread's CPUs"
                )],
            ),
        }
    }

    /// The node pinned memory for GPU `index` goes on (see the module
    /// docs), and a sentence when it is not the GPU's own.
    fn gpu_node(&self, index: GpuIndex, mems: &[u32]) -> (u32, Option<String>) {
        let topo = self.topology();
        let g = &topo.gpus[index.as_usize()];
        if let Some(n) = g.numa_node {
            if self.arena(n).is_ok() {
                return (n, None);
            }
            let near = self
                .nearest_arena(n)
                .unwrap_or_else(|| self.calling_thread_node());
            return (
                near,
                Some(format!(
                    "GPU {index} ({}): its node {n} has no memory this process can pin, so pinned memory goes on node {near}, the nearest that has",
                    g.pci_bus_id
                )),
            );
        }
        let here = self.calling_thread_node();
        let with_arena: Vec<u32> = mems
            .iter()
            .copied()
            .filter(|&m| self.arena(m).is_ok())
            .collect();
        let node = if with_arena.is_empty() || with_arena.contains(&here) {
            here
        } else {
            with_arena[0]
        };
        (
            node,
            Some(format!(
                "GPU {index} ({}): pinned memory goes on node {node}{}",
                g.pci_bus_id,
                if node == here {
                    " (the calling thread's)"
                } else {
                    ""
                }
            )),
        )
    }

    /// The node with an arena nearest to `from` by the topology's
    /// distances (`from` itself excluded unless it has one).
    pub(crate) fn nearest_arena(&self, from: u32) -> Option<u32> {
        let topo = self.topology();
        let p = topo.numa_nodes.iter().position(|n| n.os_index == from)?;
        self.arena_nodes()
            .filter_map(|a| {
                let q = topo.numa_nodes.iter().position(|n| n.os_index == a)?;
                Some((*topo.numa_nodes[p].distances.get(q)?, a))
            })
            .min()
            .map(|(_, n)| n)
    }
}
