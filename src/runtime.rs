//! The [`Runtime`]: one pinned arena per NUMA node with memory, built from
//! a [`Topology`], lending [`PinnedBuf`]s by node or by GPU.
//!
//! ```no_run
//! use numapin::runtime::{Runtime, RuntimeConfig};
//! use numapin::topology::{ProbeOptions, Topology};
//!
//! let topo = Topology::probe(&ProbeOptions::from_process())?;
//! let rt = std::sync::Arc::new(Runtime::new(topo, RuntimeConfig::default())?);
//! let mut buf = rt.alloc_for_gpu(0, 64 << 20)?; // on GPU 0's node
//! buf.as_mut_slice_of::<f32>().fill(1.0);
//! # Ok::<(), numapin::Error>(())
//! ```

use std::sync::Arc;
use std::time::Duration;

use crate::arena::{self, ArenaConfig, ArenaError, NodeArena, NodeStats, Placement};
use crate::error::Result;
use crate::topology::{NodeKind, Topology};

pub use crate::arena::{PinnedBuf, Pod};

/// How a [`Runtime`] builds and limits its arenas.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Standard region size in bytes, rounded up to 2 MiB (default
    /// 256 MiB). Larger means fewer registrations, smaller means less held
    /// beyond what is in use.
    pub region_bytes: usize,
    /// Alignment of every buffer: a power of two from 4 KiB (default) to
    /// 2 MiB. Sizes are rounded up to it.
    pub alignment: usize,
    /// Per-node budget as a fraction of the node's memory, in (0, 1]
    /// (default [`arena::DEFAULT_BUDGET_FRACTION`], one half).
    pub budget_fraction: f64,
    /// Per-node budget in bytes; overrides `budget_fraction` when set.
    pub budget_bytes: Option<u64>,
    /// Threads that populate a new region, bound to the node's CPUs; 0
    /// picks up to 4 (default 0); 1 is serial.
    pub populate_threads: usize,
    /// Whether to register regions with CUDA when the driver is present
    /// (default true).
    pub register: bool,
    /// What a page found off its node means (default an error).
    pub placement: Placement,
    /// Bounds of each thread's cache of freed blocks, per node (default
    /// 64 blocks, 16 MiB, blocks up to 4 MiB; [`arena::CacheLimits::off`]
    /// turns caching off).
    pub thread_cache: arena::CacheLimits,
    /// How long [`Runtime::alloc_on_node`] and [`Runtime::alloc_for_gpu`]
    /// wait for frees when over budget (default `None`: fail at once).
    pub budget_wait: Option<Duration>,
    /// Test hook: fail region creation right after this step.
    #[doc(hidden)]
    pub fail_after: Option<arena::Step>,
    /// Test hook: skip the RLIMIT_MEMLOCK check before mlock (to exercise
    /// a real mlock failure).
    #[doc(hidden)]
    pub skip_memlock_check: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            region_bytes: arena::DEFAULT_REGION_BYTES,
            alignment: arena::DEFAULT_ALIGNMENT,
            budget_fraction: arena::DEFAULT_BUDGET_FRACTION,
            budget_bytes: None,
            populate_threads: 0,
            register: true,
            placement: Placement::Strict,
            thread_cache: arena::CacheLimits::default(),
            budget_wait: None,
            fail_after: None,
            skip_memlock_check: false,
        }
    }
}

/// One arena per NUMA node with memory (see the module docs). `Send +
/// Sync`: share it with an `Arc`.
#[derive(Debug)]
pub struct Runtime {
    topology: Topology,
    config: RuntimeConfig,
    arenas: Vec<Arc<NodeArena>>,
}

fn config_error(setting: &'static str, value: String, problem: &str, fix: &str) -> ArenaError {
    ArenaError::Config {
        setting,
        value,
        problem: problem.into(),
        fix: fix.into(),
    }
}

impl Runtime {
    /// A runtime over `topology` (normally [`Topology::probe`] of this
    /// machine). Makes no region yet: the first allocation on a node does.
    pub fn new(topology: Topology, config: RuntimeConfig) -> Result<Runtime> {
        let a = config.alignment;
        if !a.is_power_of_two() || !(arena::DEFAULT_ALIGNMENT..=arena::MAX_ALIGNMENT).contains(&a) {
            return Err(config_error(
                "alignment",
                a.to_string(),
                "not a power of two from 4096 to 2097152",
                "use 4096 (4 KiB) up to 2097152 (2 MiB)",
            )
            .into());
        }
        if config.region_bytes == 0 || config.region_bytes > isize::MAX as usize / 4 {
            return Err(config_error(
                "region_bytes",
                config.region_bytes.to_string(),
                "out of range",
                "use a size such as 268435456 (256 MiB)",
            )
            .into());
        }
        let f = config.budget_fraction;
        if !(f > 0.0 && f <= 1.0) {
            return Err(config_error(
                "budget_fraction",
                f.to_string(),
                "not in (0, 1]",
                "use a fraction such as 0.5",
            )
            .into());
        }
        let region_bytes =
            arena::alloc::round_up(config.region_bytes as u64, arena::region::HUGE_PAGE as u64);
        let memlock_applies = !crate::sys::has_cap_ipc_lock() && !config.skip_memlock_check;
        let threads = if config.populate_threads == 0 {
            4
        } else {
            config.populate_threads
        };
        let arenas = topology
            .numa_nodes
            .iter()
            .filter(|n| n.memory_bytes > 0 && n.kind != NodeKind::GpuMemory)
            .map(|n| {
                let budget = config
                    .budget_bytes
                    .unwrap_or((n.memory_bytes as f64 * f) as u64);
                let allowed = &topology.allowed.cpus;
                let cpus = if allowed.is_empty() {
                    n.cpus.clone()
                } else {
                    n.cpus.intersection(allowed)
                };
                NodeArena::new(
                    n.os_index,
                    ArenaConfig {
                        region_bytes,
                        alignment: a as u64,
                        budget,
                        populate_threads: threads.min(cpus.len().max(1)),
                        cpus,
                        register: config.register,
                        placement: config.placement,
                        cache: config.thread_cache,
                        memlock_applies,
                        fail_after: config.fail_after,
                    },
                )
            })
            .collect();
        Ok(Runtime {
            topology,
            config,
            arenas,
        })
    }

    /// The topology it was built from.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The configuration.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// The arena of `node`.
    pub fn arena(&self, node: u32) -> Result<&Arc<NodeArena>, ArenaError> {
        if let Some(a) = self.arenas.iter().find(|a| a.node() == node) {
            return Ok(a);
        }
        match self.topology.node(node) {
            None => Err(ArenaError::UnknownNode {
                node,
                known: self
                    .topology
                    .numa_nodes
                    .iter()
                    .map(|n| n.os_index)
                    .collect(),
            }),
            Some(n) => Err(ArenaError::NoMemory {
                node,
                size: 0,
                reason: if n.kind == NodeKind::GpuMemory {
                    "it is GPU memory, not host memory".into()
                } else {
                    "the topology gives it no memory".into()
                },
            }),
        }
    }

    /// Lends `bytes` of pinned memory on `node` (waiting for frees up to
    /// [`RuntimeConfig::budget_wait`] when over budget).
    pub fn alloc_on_node(&self, node: u32, bytes: usize) -> Result<PinnedBuf> {
        let a = self.arena(node)?;
        Ok(match self.config.budget_wait {
            Some(t) => a.alloc_timeout(bytes, t)?,
            None => a.alloc(bytes)?,
        })
    }

    /// Lends `bytes` on `node`, waiting up to `timeout` for other buffers to
    /// be freed when the node's budget is spent.
    pub fn alloc_on_node_timeout(
        &self,
        node: u32,
        bytes: usize,
        timeout: Duration,
    ) -> Result<PinnedBuf> {
        Ok(self.arena(node)?.alloc_timeout(bytes, timeout)?)
    }

    /// The node buffers for GPU `gpu` (a CUDA ordinal, as given to
    /// `cuda::set_device`) go on: the GPU's own node, or, when its
    /// locality is unknown, the node of the CPU the calling thread runs on.
    pub fn node_for_gpu(&self, gpu: u32) -> Result<u32, ArenaError> {
        let g = self
            .topology
            .gpu_by_cuda_ordinal(gpu)
            .ok_or_else(|| ArenaError::UnknownGpu {
                gpu,
                known: self
                    .topology
                    .gpus
                    .iter()
                    .filter_map(|g| g.cuda_ordinal)
                    .collect(),
            })?;
        Ok(match g.numa_node {
            Some(n) => n,
            None => self.calling_thread_node(),
        })
    }

    /// The node of the CPU the calling thread runs on (`getcpu`), or the
    /// nearest node with memory when that node has none.
    pub fn calling_thread_node(&self) -> u32 {
        let here = arena::numa_sys::current_node().unwrap_or(0);
        if self.arenas.iter().any(|a| a.node() == here) {
            return here;
        }
        // Nearest by the topology's distances, else the first with memory.
        let pos = self
            .topology
            .numa_nodes
            .iter()
            .position(|n| n.os_index == here);
        let nearest = pos.and_then(|p| {
            self.arenas
                .iter()
                .filter_map(|a| {
                    let q = self
                        .topology
                        .numa_nodes
                        .iter()
                        .position(|n| n.os_index == a.node())?;
                    Some((*self.topology.numa_nodes[p].distances.get(q)?, a.node()))
                })
                .min()
                .map(|(_, n)| n)
        });
        nearest
            .or_else(|| self.arenas.first().map(|a| a.node()))
            .unwrap_or(here)
    }

    /// Lends `bytes` on the node of GPU `gpu` (a CUDA ordinal; see
    /// [`Runtime::node_for_gpu`]).
    pub fn alloc_for_gpu(&self, gpu: u32, bytes: usize) -> Result<PinnedBuf> {
        let node = self.node_for_gpu(gpu)?;
        self.alloc_on_node(node, bytes)
    }

    /// Counters per node with memory, by node number.
    pub fn stats(&self) -> Vec<NodeStats> {
        self.arenas.iter().map(|a| a.stats()).collect()
    }

    /// Takes back buffers dropped while a copy was in flight whose copies
    /// have now completed; returns how many still wait.
    pub fn reclaim(&self) -> usize {
        self.arenas.iter().map(|a| a.reclaim()).sum()
    }

    /// Gives every empty region back to the system (unregister, unlock,
    /// unmap), after taking back the blocks threads keep in their caches;
    /// returns the bytes still reserved over all nodes.
    pub fn trim(&self) -> u64 {
        self.arenas.iter().map(|a| a.trim()).sum()
    }

    /// Binds the calling thread to the CPUs near CUDA device `gpu` (its
    /// node's allowed CPUs; with unknown locality, the allowed CPUs, with a
    /// warning in the returned plan). Loader workers call this.
    pub fn bind_current_thread(&self, gpu: u32) -> Result<crate::affinity::RankPlan> {
        let plan = self.gpu_plan(gpu, crate::affinity::Mode::Node)?;
        crate::affinity::bind_current_thread(&plan.cpus)?;
        Ok(plan)
    }

    /// Binds the whole process (CPUs and memory policy, `MPOL_BIND`) near
    /// CUDA device `gpu` as `mode` plans it, the way `numapin exec` does.
    pub fn bind_current_process(
        &self,
        gpu: u32,
        mode: crate::affinity::Mode,
    ) -> Result<crate::affinity::RankPlan> {
        let plan = self.gpu_plan(gpu, mode)?;
        crate::affinity::bind_current_process(&plan, crate::affinity::MemPolicy::Bind)?;
        Ok(plan)
    }

    /// The plan for CUDA device `gpu` alone, as `numapin affinity` computes it.
    pub fn gpu_plan(
        &self,
        gpu: u32,
        mode: crate::affinity::Mode,
    ) -> Result<crate::affinity::RankPlan> {
        let t = self.topology();
        let index = crate::affinity::launcher::gpu_of_ordinal(t, gpu, "the runtime")?;
        let mut p =
            crate::affinity::plan(t, &[index], mode, &crate::affinity::PlanOptions::default())?;
        Ok(p.ranks.remove(0))
    }
}

impl Drop for Runtime {
    /// Closes the threads' caches, so that each arena is freed as soon as
    /// its last buffer is (cached blocks would keep it alive).
    fn drop(&mut self) {
        for a in &self.arenas {
            a.close_thread_caches();
        }
    }
}
