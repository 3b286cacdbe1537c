//! The [`Runtime`]: one pinned arena per NUMA node with memory, built from
//! a [`Topology`], lending [`PinnedBuf`]s by node or by GPU.
//!
//! ```no_run
//! use numapin::runtime::{Runtime, RuntimeConfig};
//! use numapin::topology::{ProbeOptions, Topology};
//! use numapin::CudaOrdinal;
//!
//! let topo = Topology::probe(&ProbeOptions::from_process())?;
//! let mut config = RuntimeConfig::default();
//! config.budget_bytes = Some(8 << 30);
//! let rt = std::sync::Arc::new(Runtime::new(topo, config)?);
//! let mut buf = rt.alloc_for_gpu(CudaOrdinal(0), 64 << 20)?; // on GPU 0's node
//! buf.as_mut_slice_of::<f32>().fill(1.0);
//! # Ok::<(), numapin::Error>(())
//! ```
//!
//! The arenas themselves (regions, the TLSF sub-allocator, the threads'
//! caches) are described in `docs/arena.md`.

use std::sync::Arc;
use std::time::Duration;

use crate::affinity::{AffinityError, Mode, RankPlan};
use crate::arena::{self, ArenaConfig, NodeArena};
use crate::gpu::CudaOrdinal;
use crate::topology::{NodeKind, Topology};

mod place;
pub use place::{Site, Target};

pub use crate::arena::region::Step;
pub use crate::arena::{
    ArenaError, Backend, CacheLimits, HugePages, NodeStats, PageKind, ParseHugePagesError,
    PinnedBuf, PinnedBy, PlacedBy, Placement, RegionMethods, VerifiedBy, DEFAULT_ALIGNMENT,
    DEFAULT_BUDGET_FRACTION, DEFAULT_REGION_BYTES, MAX_ALIGNMENT,
};

mod machine;
pub use machine::{
    machine_budget_usage, BudgetHolder, MachineBudget, MachineNodeUse, MachineUsage,
    ParseMachineBudgetError, DEFAULT_STATE_DIR, MACHINE_BUDGET_DIR_VAR, MACHINE_BUDGET_VAR,
};

/// Most threads that fault in a new region when
/// [`RuntimeConfig::populate_threads`] is 0 (they are also limited to the
/// node's allowed CPUs).
pub const MAX_POPULATE_THREADS: usize = 64;

/// Hooks numapin's own tests set through [`crate::internals`]; never set
/// in normal use.
#[derive(Debug, Clone, Default)]
pub(crate) struct TestHooks {
    /// Fail region creation right after this step.
    pub(crate) fail_after: Option<Step>,
    /// Skip the RLIMIT_MEMLOCK check before mlock (to exercise a real
    /// mlock failure).
    pub(crate) skip_memlock_check: bool,
    /// Read the memory cgroup limits under this root instead of `/`.
    pub(crate) cgroup_root: Option<std::path::PathBuf>,
    /// Read the huge page pools under this root instead of `/`.
    pub(crate) pool_root: Option<std::path::PathBuf>,
    /// Keep the machine budget's state file in this folder instead of the
    /// one `NUMAPIN_MACHINE_BUDGET_DIR` names (or `/dev/shm`).
    pub(crate) machine_dir: Option<std::path::PathBuf>,
}

/// How a [`Runtime`] builds and limits its arenas. Start from
/// `RuntimeConfig::default()` and set the fields you need (new fields may
/// be added, so it cannot be built field by field).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RuntimeConfig {
    /// Standard region size in bytes, rounded up to 2 MiB (to 1 GiB with
    /// [`HugePages::Hugetlb1G`]; default 256 MiB). Larger means fewer
    /// registrations, smaller means less held beyond what is in use.
    pub region_bytes: usize,
    /// Alignment of every buffer: a power of two from 4 KiB (default) to
    /// 2 MiB. Sizes are rounded up to it.
    pub alignment: usize,
    /// Per-node budget as a fraction of the node's memory, in (0, 1]
    /// (default [`arena::DEFAULT_BUDGET_FRACTION`], one half). Under a
    /// memory cgroup limit (v2 `memory.max`/`memory.high`, v1
    /// `memory.limit_in_bytes`) the same fraction of the limit also caps
    /// each node's budget and the pinned bytes over all nodes together:
    /// pinned pages are charged to the cgroup and cannot be reclaimed.
    pub budget_fraction: f64,
    /// Per-node budget in bytes; overrides `budget_fraction` when set (and
    /// then no cgroup cap applies: pinning beyond the cgroup's limit gets
    /// the process killed by the OOM killer).
    pub budget_bytes: Option<u64>,
    /// Threads that populate a new region, bound to the node's CPUs; 0
    /// picks one per allowed CPU of the node, up to
    /// [`MAX_POPULATE_THREADS`] (default 0); 1 is serial.
    pub populate_threads: usize,
    /// Whether to register regions with CUDA when the driver is present
    /// (default true).
    pub register: bool,
    /// What a page found off its node means (default an error).
    pub placement: Placement,
    /// Where regions' memory comes from (default [`Backend::Mapped`],
    /// numapin's own mmap + mbind + mlock + `cuMemHostRegister`; the
    /// driver backends are measured against it by `numapin bench --only
    /// pinning`, and `docs/BENCHMARKS.md` says why it stays the default).
    pub backend: Backend,
    /// Bounds of each thread's cache of freed blocks, per node (default
    /// 64 blocks, 16 MiB, blocks up to 4 MiB; [`arena::CacheLimits::off`]
    /// turns caching off).
    pub thread_cache: arena::CacheLimits,
    /// How long [`Runtime::alloc_on_node`] and [`Runtime::alloc_for_gpu`]
    /// wait for frees when over budget (default `None`: fail at once).
    pub budget_wait: Option<Duration>,
    /// Which pages back the regions (default [`HugePages::Auto`]: hugetlb
    /// pages when the node's pool has enough free pages for a region,
    /// else transparent huge pages; see `docs/arena.md`, Huge pages). Each
    /// region records what it got ([`NodeStats::regions_hugetlb_2m`] and
    /// the counts beside it).
    pub huge_pages: HugePages,
    /// Make each standard region in two halves (default false): the second
    /// half's pages are faulted in while the first half is registered with
    /// CUDA (and its placement checked). Each half is its own registration,
    /// and CUDA refuses a copy whose range spans two registrations, so no
    /// buffer is placed across the halves; buffers larger than half a
    /// region get a region of their own, registered in one call, as always.
    /// Off by default: on the H100 VMs measured (`numapin bench --only
    /// pinning`, `pin_parts_per_gib`; docs/BENCHMARKS.md) halves made
    /// 256 MiB regions 0-16% faster, within the noise between runs, for
    /// more registrations and less room for buffers over a quarter of a
    /// region.
    pub register_in_parts: bool,
    /// The machine budget: pinned bytes per node over every numapin
    /// runtime of this user on the machine, in every process (each shared
    /// region counted once, in the process that made it), kept in a state
    /// file that a killed process cannot leave wrong (see `docs/arena.md`,
    /// Machine budget). `None` (the default): the `NUMAPIN_MACHINE_BUDGET`
    /// variable when set, else [`MachineBudget::Auto`], half of each node
    /// or this runtime's own budget there when larger, so that one process
    /// alone is limited as before and several share what one would have.
    /// Over it, [`ArenaError::MachineBudget`] names the processes holding
    /// the node's share; [`RuntimeConfig::budget_wait`] waits for them.
    pub machine_budget: Option<MachineBudget>,
    pub(crate) hooks: TestHooks,
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
            backend: Backend::Mapped,
            thread_cache: arena::CacheLimits::default(),
            budget_wait: None,
            huge_pages: HugePages::default(),
            register_in_parts: false,
            machine_budget: None,
            hooks: TestHooks::default(),
        }
    }
}

with_setters!(RuntimeConfig {
    with_region_bytes => region_bytes: usize,
    with_alignment => alignment: usize,
    with_budget_fraction => budget_fraction: f64,
    with_budget_bytes => budget_bytes: Option<u64>,
    with_populate_threads => populate_threads: usize,
    with_register => register: bool,
    with_placement => placement: Placement,
    with_backend => backend: Backend,
    with_thread_cache => thread_cache: CacheLimits,
    with_budget_wait => budget_wait: Option<Duration>,
    with_huge_pages => huge_pages: HugePages,
    with_register_in_parts => register_in_parts: bool,
    with_machine_budget => machine_budget: Option<MachineBudget>,
});

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

/// The budget over all nodes under the process's memory cgroup limit:
/// `budget_fraction` of the tightest limit, or `None` without one.
fn cgroup_budget(config: &RuntimeConfig) -> Option<Arc<arena::SharedBudget>> {
    let limits = match &config.hooks.cgroup_root {
        Some(root) => crate::platform::cgroup::read_limits(root),
        None => crate::platform::cgroup::read_self(),
    };
    let l = limits.tightest()?;
    let f = config.budget_fraction;
    let cap = (l.bytes as f64 * f) as u64;
    Some(Arc::new(arena::SharedBudget::new(
        cap,
        format!(
            "budget_fraction {f} of {} = {}, in /{}",
            arena::fmt_bytes(l.bytes),
            arena::fmt_bytes(cap),
            l.path.display()
        ),
    )))
}

impl RuntimeConfig {
    /// Checks every setting is in range, as [`Runtime::new`] does first
    /// (front ends check a configuration when it is given, not at first
    /// use).
    ///
    /// # Errors
    ///
    /// [`ArenaError::Config`] naming the first setting out of range, its
    /// value and what to use.
    pub fn check(&self) -> Result<(), ArenaError> {
        check_config(self)
    }
}

/// Refuses a configuration setting out of range.
fn check_config(config: &RuntimeConfig) -> Result<(), ArenaError> {
    let a = config.alignment;
    if !a.is_power_of_two() || !(arena::DEFAULT_ALIGNMENT..=arena::MAX_ALIGNMENT).contains(&a) {
        return Err(config_error(
            "alignment",
            a.to_string(),
            "not a power of two from 4096 to 2097152",
            "use 4096 (4 KiB) up to 2097152 (2 MiB)",
        ));
    }
    if config.region_bytes == 0 || config.region_bytes > isize::MAX as usize / 4 {
        return Err(config_error(
            "region_bytes",
            config.region_bytes.to_string(),
            "out of range",
            "use a size such as 268435456 (256 MiB)",
        ));
    }
    let f = config.budget_fraction;
    if !(f > 0.0 && f <= 1.0) {
        return Err(config_error(
            "budget_fraction",
            f.to_string(),
            "not in (0, 1]",
            "use a fraction such as 0.5",
        ));
    }
    machine::check(config)?;
    if config.backend != Backend::Mapped
        && matches!(
            config.huge_pages,
            HugePages::Hugetlb2M | HugePages::Hugetlb1G
        )
    {
        return Err(config_error(
        "huge_pages",
        config.huge_pages.to_string(),
        &format!(
            "hugetlb pages are for the mapped backend, and backend is {}",
            config.backend.as_str()
        ),
        "use HugePages::Auto (or Transparent) with a driver backend, or Backend::Mapped with hugetlb pages",
        ));
    }
    Ok(())
}

/// One arena per node of `topology` that can hold pinned memory, each with
/// its budget (the node's share, capped by the cgroup's `shared` budget),
/// its allowed CPUs and its populate threads.
fn make_arenas(
    topology: &Topology,
    config: &RuntimeConfig,
    region_bytes: u64,
    shared: Option<Arc<arena::SharedBudget>>,
    machine: &machine::Resolved,
) -> Vec<Arc<NodeArena>> {
    let (a, f) = (config.alignment, config.budget_fraction);
    let memlock_applies =
        !crate::platform::sys::has_cap_ipc_lock() && !config.hooks.skip_memlock_check;
    // 0: every allowed CPU of the node, up to MAX_POPULATE_THREADS
    // (faulting a region in is bound by the kernel zeroing pages, which
    // scales with threads: 1 GiB in 119 ms with 16 on an H100 VM).
    let threads = if config.populate_threads == 0 {
        MAX_POPULATE_THREADS
    } else {
        config.populate_threads
    };
    topology
        .numa_nodes
        .iter()
        .filter(|n| n.memory_bytes > 0 && n.kind != NodeKind::GpuMemory)
        .map(|n| {
            let mut budget = config
                .budget_bytes
                .unwrap_or((n.memory_bytes as f64 * f) as u64);
            if let Some(s) = &shared {
                budget = budget.min(s.limit());
            }
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
                    backend: config.backend,
                    cache: config.thread_cache,
                    memlock_applies,
                    shared: shared.clone(),
                    machine: machine.for_node(n.memory_bytes, budget),
                    huge_pages: config.huge_pages,
                    register_in_parts: config.register_in_parts,
                    pool_root: config.hooks.pool_root.clone(),
                    fail_after: config.hooks.fail_after,
                },
            )
        })
        .collect()
}

impl Runtime {
    /// A runtime over `topology` (normally [`Topology::probe`] of this
    /// machine). Makes no region yet: the first allocation on a node does.
    /// Reads the process's memory cgroup limit (see
    /// [`RuntimeConfig::budget_fraction`]).
    ///
    /// # Errors
    ///
    /// [`ArenaError::Config`] for a setting out of range (alignment,
    /// region size, budget fraction, machine budget, hugetlb pages with a
    /// driver backend), or a `NUMAPIN_MACHINE_BUDGET` or
    /// `NUMAPIN_MACHINE_BUDGET_DIR` that cannot be read.
    pub fn new(topology: Topology, config: RuntimeConfig) -> Result<Runtime, ArenaError> {
        check_config(&config)?;
        let region_bytes = arena::alloc::round_up(
            config.region_bytes as u64,
            config.huge_pages.granule() as u64,
        );
        let shared = match config.budget_bytes {
            Some(_) => None,
            None => cgroup_budget(&config),
        };
        let machine = machine::resolve(&config)?;
        let arenas = make_arenas(&topology, &config, region_bytes, shared, &machine);
        arena::publish::register(&arenas);
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
                source: None,
            }),
        }
    }

    /// Lends `bytes` of pinned memory on `node` (waiting for frees up to
    /// [`RuntimeConfig::budget_wait`] when over budget).
    pub fn alloc_on_node(&self, node: u32, bytes: usize) -> Result<PinnedBuf, ArenaError> {
        let a = self.arena(node)?;
        match self.config.budget_wait {
            Some(t) => a.alloc_timeout(bytes, t),
            None => a.alloc(bytes),
        }
    }

    /// Lends `bytes` on `node` for staging (slots a reader or a copy reuses
    /// for a while): when a region must be made for the buffer, it is made
    /// of the buffer's own size, rounded up to 2 MiB, instead of a standard
    /// region, so that the slots pin no more than they hold.
    ///
    /// # Errors
    ///
    /// As [`Runtime::alloc_on_node`] (no waiting for frees).
    pub fn alloc_staging(&self, node: u32, bytes: usize) -> Result<PinnedBuf, ArenaError> {
        self.arena(node)?.alloc_fitted(bytes)
    }

    /// Lends `bytes` on `node`, waiting up to `timeout` for other buffers to
    /// be freed when the node's budget is spent.
    pub fn alloc_on_node_timeout(
        &self,
        node: u32,
        bytes: usize,
        timeout: Duration,
    ) -> Result<PinnedBuf, ArenaError> {
        self.arena(node)?.alloc_timeout(bytes, timeout)
    }

    /// The node buffers for CUDA device `gpu` go on
    /// ([`Runtime::place`]'s node for [`Target::Gpu`]).
    ///
    /// # Errors
    ///
    /// [`ArenaError::UnknownGpu`] when the topology has no such device.
    pub fn node_for_gpu(&self, gpu: CudaOrdinal) -> Result<u32, ArenaError> {
        Ok(self.place(Target::Gpu(gpu))?.node)
    }

    /// The nodes with an arena (memory this process can pin), ascending.
    pub fn arena_nodes(&self) -> impl Iterator<Item = u32> + '_ {
        self.arenas.iter().map(|a| a.node())
    }

    /// The node of the CPU the calling thread runs on (`getcpu`), or the
    /// nearest node with memory when that node has none.
    pub fn calling_thread_node(&self) -> u32 {
        let here = crate::platform::numa::current_node().unwrap_or(0);
        if self.arenas.iter().any(|a| a.node() == here) {
            return here;
        }
        self.nearest_arena(here)
            .or_else(|| self.arenas.first().map(|a| a.node()))
            .unwrap_or(here)
    }

    /// Lends `bytes` on the node of CUDA device `gpu` (see
    /// [`Runtime::place`]).
    ///
    /// # Errors
    ///
    /// As [`Runtime::place`] and [`Runtime::alloc_on_node`].
    pub fn alloc_for_gpu(&self, gpu: CudaOrdinal, bytes: usize) -> Result<PinnedBuf, ArenaError> {
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
    pub fn bind_current_thread(&self, gpu: CudaOrdinal) -> Result<RankPlan, AffinityError> {
        let plan = self.gpu_plan(gpu, Mode::Node)?;
        crate::affinity::bind_current_thread(&plan.cpus)?;
        Ok(plan)
    }

    /// Binds the whole process (CPUs and memory policy, `MPOL_BIND`) near
    /// CUDA device `gpu` as `mode` plans it, the way `numapin exec` does.
    /// When `set_mempolicy` is refused (a seccomp profile), only the CPUs
    /// are bound and the returned plan's warnings say so.
    pub fn bind_current_process(
        &self,
        gpu: CudaOrdinal,
        mode: Mode,
    ) -> Result<RankPlan, AffinityError> {
        let mut plan = self.gpu_plan(gpu, mode)?;
        let b = crate::affinity::bind_current_process(&plan, crate::affinity::MemPolicy::Bind)?;
        if let crate::affinity::Binding::CpusOnly { reason } = b {
            plan.warnings.push(reason);
        }
        Ok(plan)
    }

    /// The plan for CUDA device `gpu` alone, as `numapin affinity` computes it.
    pub fn gpu_plan(&self, gpu: CudaOrdinal, mode: Mode) -> Result<RankPlan, AffinityError> {
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
