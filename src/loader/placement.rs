//! Where a loader's (or a staged copy's) threads run and its slots live.

use crate::affinity::AffinityError;
use crate::arena::ArenaError;
use crate::cpulist::CpuList;
use crate::gpu::CudaOrdinal;
use crate::runtime::Runtime;
use crate::topology::Gpu;

use super::{LoaderError, Target};

/// The CPUs, node and GPU a loader works for, and what a person should
/// know about how they were chosen.
#[derive(Debug, Clone)]
pub(crate) struct Placement {
    /// CPUs the worker threads are bound to.
    pub cpus: CpuList,
    /// Node the pinned slots come from.
    pub node: u32,
    /// The CUDA device to copy to (GPU mode only).
    pub ordinal: Option<CudaOrdinal>,
    /// Sentences for [`super::Loader::warnings`].
    pub warnings: Vec<String>,
}

/// The CPUs this process may use: the topology's allowed set, or, for a
/// topology that records none, the calling thread's own set.
pub(crate) fn allowed_cpus(rt: &Runtime) -> CpuList {
    let allowed = &rt.topology().allowed.cpus;
    if !allowed.is_empty() {
        return allowed.clone();
    }
    crate::platform::sys::sched_getaffinity_self().unwrap_or_else(|_| rt.topology().all_cpus())
}

/// Resolves `target` on `rt`'s topology.
pub(crate) fn resolve(rt: &Runtime, target: Target) -> Result<Placement, LoaderError> {
    let topo = rt.topology();
    match target {
        Target::Gpu(ordinal) => {
            let gpu = topo
                .gpu_by_ordinal(ordinal)
                .ok_or_else(|| ArenaError::UnknownGpu {
                    gpu: ordinal,
                    known: topo.gpus.iter().filter_map(|g| g.cuda_ordinal).collect(),
                })?;
            let mut p = near_gpu(rt, gpu, &format!("GPU {ordinal} (CUDA ordinal)"));
            p.ordinal = Some(ordinal);
            Ok(p)
        }
        Target::HostForGpu(index) => {
            let gpu = topo.gpu(index).ok_or_else(|| {
                AffinityError::request(
                    format!(
                        "GPU index {index} is not in the topology ({} GPU(s))",
                        topo.gpus.len()
                    ),
                    "pick an index listed by `numapin topo` (indexes follow PCI order, not CUDA ordinals)",
                )
            })?;
            Ok(near_gpu(rt, gpu, &format!("GPU index {index}")))
        }
        Target::HostNode(node) => {
            rt.arena(node)?;
            let n = topo
                .node(node)
                .expect("a node with an arena is in the topology");
            let allowed = allowed_cpus(rt);
            let local = n.cpus.intersection(&allowed);
            let mut warnings = Vec::new();
            let cpus = if local.is_empty() {
                warnings.push(format!(
                    "none of node {node}'s CPUs ({}) may be used by this process (allowed: {allowed}); loader workers run on the allowed CPUs, slots stay on node {node}",
                    n.cpus
                ));
                allowed
            } else {
                local
            };
            Ok(Placement {
                cpus,
                node,
                ordinal: None,
                warnings,
            })
        }
        Target::Host => Ok(Placement {
            cpus: allowed_cpus(rt),
            node: rt.calling_thread_node(),
            ordinal: None,
            warnings: Vec::new(),
        }),
    }
}

/// CPUs and node near `gpu`: its local CPUs that are allowed and its node;
/// with unknown locality (or no allowed local CPU) the allowed CPUs, with a
/// warning (none on a one-node machine, where there is nothing to choose).
fn near_gpu(rt: &Runtime, gpu: &Gpu, name: &str) -> Placement {
    let allowed = allowed_cpus(rt);
    let mut warnings = Vec::new();
    let (cpus, node) = match gpu.numa_node {
        // One node: nothing to choose, nothing to warn about.
        None if rt.topology().numa_nodes.len() <= 1 => (allowed, rt.calling_thread_node()),
        None => {
            let node = rt.calling_thread_node();
            warnings.push(format!(
                "{name} ({}): its NUMA node is unknown, so loader workers run on all allowed CPUs ({allowed}) and slots go on node {node}, the calling thread's\n  fix: check that the kernel reports the device's numa_node (/sys/bus/pci/devices/{}/numa_node), or pick a node with Target::HostNode",
                gpu.pci_bus_id, gpu.pci_bus_id
            ));
            (allowed, node)
        }
        Some(n) => {
            let local = gpu.local_cpus.intersection(&allowed);
            let cpus = if local.is_empty() {
                warnings.push(format!(
                    "{name} ({}): none of its local CPUs ({}) may be used by this process (allowed: {allowed}); loader workers run on the allowed CPUs, across the socket from the GPU\n  fix: run the process with the GPU's CPUs allowed (cgroup cpuset, taskset, `numapin exec`)",
                    gpu.pci_bus_id, gpu.local_cpus
                ));
                allowed
            } else {
                local
            };
            let node = if rt.arena(n).is_ok() {
                n
            } else {
                let here = rt.calling_thread_node();
                warnings.push(format!(
                    "{name} ({}): its node {n} has no memory this process can pin, so slots go on node {here}",
                    gpu.pci_bus_id
                ));
                here
            };
            (cpus, node)
        }
    };
    Placement {
        cpus,
        node,
        ordinal: None,
        warnings,
    }
}
