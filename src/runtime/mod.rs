//! The [`Runtime`]: one pinned arena per NUMA node with memory, built from
//! a [`Topology`], lending [`PinnedBuf`]s by node or by GPU.
//!
//! ```
//! use numapin::runtime::{Runtime, RuntimeConfig, Target};
//! use numapin::topology::{CudaMode, ProbeOptions, Topology};
//!
//! // This machine; CudaMode::Off finds GPUs on the PCI bus without the driver.
//! let topo = Topology::probe(&ProbeOptions::from_process().with_cuda(CudaMode::Off))?;
//! // Regions of 2 MiB (the default, 256 MiB, suits a trainer), 1 GiB per node.
//! let config = RuntimeConfig::default()
//!     .with_region_bytes(2 << 20)
//!     .with_budget_bytes(Some(1 << 30));
//! let rt = std::sync::Arc::new(Runtime::new(topo, config)?);
//! // Target::Gpu(CudaOrdinal(0)) puts it on GPU 0's node; here, this thread's.
//! let node = rt.calling_thread_node();
//! let mut buf = rt.alloc(Target::HostNode(node), 1 << 20)?;
//! buf.as_mut_slice_of::<f32>().fill(1.0);
//! assert_eq!(buf.node(), node);
//! # Ok::<(), numapin::Error>(())
//! ```
//!
//! The arenas themselves (regions, the TLSF sub-allocator, the threads'
//! caches) are described in `docs/arena.md`.

use std::sync::Arc;
use std::time::Duration;

use crate::arena::{self, ArenaConfig, NodeArena};
use crate::gpu::CudaOrdinal;
use crate::topology::{NodeKind, Topology};

mod place;
pub use place::{Site, Target};

pub use crate::arena::region::Step;
pub use crate::arena::{
    Backend, CacheLimits, HugePages, NodeStats, OffNode, PageKind, ParseHugePagesError, PinnedBuf,
    PinnedBy, PlacedBy, RegionMethods, RuntimeError, VerifiedBy, DEFAULT_ALIGNMENT,
    DEFAULT_BUDGET_FRACTION, DEFAULT_REGION_BYTES, MAX_ALIGNMENT, MAX_PART_BYTES,
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
    pub off_node: OffNode,
    /// Where regions' memory comes from (default [`Backend::Mapped`],
    /// numapin's own mmap + mbind + mlock + `cuMemHostRegister`; the
    /// driver backends are measured against it by `numapin bench --only
    /// pinning`, and `docs/BENCHMARKS.md` says why it stays the default).
    pub backend: Backend,
    /// Bounds of each thread's cache of freed blocks, per node (default
    /// 64 blocks, 16 MiB, blocks up to 4 MiB; [`arena::CacheLimits::off`]
    /// turns caching off).
    pub thread_cache: arena::CacheLimits,
    /// How long [`Runtime::alloc`] waits for frees when over budget
    /// (default `None`: fail at once; [`AllocOptions::wait`] overrides it
    /// for one allocation).
    pub budget_wait: Option<Duration>,
    /// Which pages back the regions (default [`HugePages::Auto`]: hugetlb
    /// pages when the node's pool has enough free pages for a region,
    /// else transparent huge pages; see `docs/arena.md`, Huge pages). Each
    /// region records what it got ([`NodeStats::regions_hugetlb_2m`] and
    /// the counts beside it).
    pub huge_pages: HugePages,
    /// Make each standard region in parts of half a region, at most
    /// [`MAX_PART_BYTES`] (256 MiB) (default false): each part is
    /// registered with CUDA (and its placement checked) as soon as its pages
    /// are in, while the populate threads fault in the next parts. Each
    /// part is its own registration, and CUDA refuses a copy whose range
    /// spans two registrations, so no buffer is placed across parts; a
    /// buffer larger than a part gets a standard region in one piece, or a
    /// region of its own, registered in one call, as always. This is the
    /// way to pin a large pool fast and carve buffers from it: with
    /// `region_bytes` of 16 GiB, a region took 30 ms per GiB on an H100 VM
    /// against 47 in one piece (docs/BENCHMARKS.md, "cold pinning"). Off by
    /// default: with the default 256 MiB regions halves gained 0-16%,
    /// within the noise between runs, for more registrations and less room
    /// for buffers over a quarter of a region.
    pub register_in_parts: bool,
    /// The machine budget: pinned bytes per node over every numapin
    /// runtime of this user on the machine, in every process (each shared
    /// region counted once, in the process that made it), kept in a state
    /// file that a killed process cannot leave wrong (see `docs/arena.md`,
    /// Machine budget). `None` (the default): the `NUMAPIN_MACHINE_BUDGET`
    /// variable when set, else [`MachineBudget::Auto`], half of each node
    /// or this runtime's own budget there when larger, so that one process
    /// alone is limited as before and several share what one would have.
    /// Over it, [`RuntimeError::MachineBudget`] names the processes holding
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
            off_node: OffNode::Strict,
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
    with_off_node => off_node: OffNode,
    with_backend => backend: Backend,
    with_thread_cache => thread_cache: CacheLimits,
    with_budget_wait => budget_wait: Option<Duration>,
    with_huge_pages => huge_pages: HugePages,
    with_register_in_parts => register_in_parts: bool,
    with_machine_budget => machine_budget: Option<MachineBudget>,
});

/// How [`Runtime::alloc_with`] lends a buffer. Start from
/// `AllocOptions::default()` (what [`Runtime::alloc`] does) and set what
/// you need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct AllocOptions {
    /// How long to wait for other buffers to be freed when the node's
    /// budget is spent: `None` (the default) for
    /// [`RuntimeConfig::budget_wait`], `Some(Duration::ZERO)` to fail at
    /// once whatever the configuration says.
    pub wait: Option<Duration>,
    /// A staging slot (a buffer a reader or a copy reuses for a while):
    /// when a region must be made for it, the region is of the buffer's
    /// own size, rounded up to 2 MiB, instead of a standard region, so
    /// that slots pin no more than they hold (default false).
    pub staging: bool,
}

with_setters!(AllocOptions {
    with_wait => wait: Option<Duration>,
    with_staging => staging: bool,
});

/// One arena per NUMA node with memory (see the module docs). `Send +
/// Sync`: share it with an `Arc`.
#[derive(Debug)]
pub struct Runtime {
    topology: Topology,
    config: RuntimeConfig,
    arenas: Vec<Arc<NodeArena>>,
}

fn config_error(setting: &'static str, value: String, problem: &str, fix: &str) -> RuntimeError {
    RuntimeError::Config {
        setting,
        value,
        problem: problem.into(),
        fix: fix.into(),
    }
}

/// The budget over all nodes under the process's memory cgroup limit:
/// `budget_fraction` of the tightest limit, or `None` without one.
fn cgroup_cap(config: &RuntimeConfig) -> Option<Arc<arena::CgroupCap>> {
    let limits = match &config.hooks.cgroup_root {
        Some(root) => crate::platform::cgroup::read_limits(root),
        None => crate::platform::cgroup::read_self(),
    };
    let l = limits.tightest()?;
    let f = config.budget_fraction;
    let cap = crate::num::share(l.bytes, f);
    Some(Arc::new(arena::CgroupCap::new(
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
    /// [`RuntimeError::Config`] naming the first setting out of range, its
    /// value and what to use.
    pub fn check(&self) -> Result<(), RuntimeError> {
        check_config(self)
    }
}

/// Refuses a configuration setting out of range.
fn check_config(config: &RuntimeConfig) -> Result<(), RuntimeError> {
    let a = config.alignment;
    if !a.is_power_of_two() || !(arena::DEFAULT_ALIGNMENT..=arena::MAX_ALIGNMENT).contains(&a) {
        return Err(config_error(
            "alignment",
            a.to_string(),
            "not a power of two from 4096 to 2097152",
            "use 4096 (4 KiB) up to 2097152 (2 MiB)",
        ));
    }
    let most = isize::MAX.unsigned_abs() / 4;
    if config.region_bytes == 0 || config.region_bytes > most {
        return Err(config_error(
            "region_bytes",
            config.region_bytes.to_string(),
            &format!("out of range (1 to {most} bytes)"),
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
/// its budget (the node's share, capped by the cgroup's `cap`),
/// its allowed CPUs and its populate threads.
fn make_arenas(
    topology: &Topology,
    config: &RuntimeConfig,
    region_bytes: u64,
    cap: Option<Arc<arena::CgroupCap>>,
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
                .unwrap_or(crate::num::share(n.memory_bytes, f));
            if let Some(s) = &cap {
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
                    off_node: config.off_node,
                    backend: config.backend,
                    cache: config.thread_cache,
                    memlock_applies,
                    cgroup_cap: cap.clone(),
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
    /// [`RuntimeError::Config`] for a setting out of range (alignment,
    /// region size, budget fraction, machine budget, hugetlb pages with a
    /// driver backend), or a `NUMAPIN_MACHINE_BUDGET` or
    /// `NUMAPIN_MACHINE_BUDGET_DIR` that cannot be read.
    ///
    /// # Examples
    ///
    /// ```
    /// use numapin::runtime::{Runtime, RuntimeConfig, RuntimeError};
    /// use numapin::topology::{CudaMode, ProbeOptions, Topology};
    ///
    /// let topo = Topology::probe(&ProbeOptions::from_process().with_cuda(CudaMode::Off))?;
    /// let rt = Runtime::new(topo.clone(), RuntimeConfig::default())?;
    /// assert!(rt.arena_nodes().count() >= 1, "one arena per node with memory");
    /// // A setting out of range is refused before anything is made.
    /// let odd = RuntimeConfig::default().with_alignment(3000);
    /// assert!(matches!(Runtime::new(topo, odd), Err(RuntimeError::Config { .. })));
    /// # Ok::<(), numapin::Error>(())
    /// ```
    pub fn new(topology: Topology, config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        check_config(&config)?;
        let region_bytes = arena::alloc::round_up(
            config.region_bytes as u64,
            config.huge_pages.granule() as u64,
        );
        let cap = match config.budget_bytes {
            Some(_) => None,
            None => cgroup_cap(&config),
        };
        let machine = machine::resolve(&config)?;
        let arenas = make_arenas(&topology, &config, region_bytes, cap, &machine);
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
    pub(crate) fn arena(&self, node: u32) -> Result<&Arc<NodeArena>, RuntimeError> {
        if let Some(a) = self.arenas.iter().find(|a| a.node() == node) {
            return Ok(a);
        }
        match self.topology.node(node) {
            None => Err(RuntimeError::UnknownNode {
                node,
                known: self
                    .topology
                    .numa_nodes
                    .iter()
                    .map(|n| n.os_index)
                    .collect(),
            }),
            Some(n) => Err(RuntimeError::NoMemory {
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

    /// Lends `bytes` of pinned memory for `target`: on a node
    /// ([`Target::HostNode`]), on the node of a GPU ([`Target::Gpu`],
    /// [`Target::HostForGpu`]: [`Runtime::place`]'s node) or on the
    /// calling thread's node ([`Target::Host`]), counted in that node's
    /// budget. Over budget, it waits for frees up to
    /// [`RuntimeConfig::budget_wait`] (by default not at all).
    ///
    /// The way in to pinned memory for one process; [`Runtime::alloc_with`]
    /// says how (waiting, staging), [`crate::shared`] makes memory other
    /// processes map.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::UnknownNode`] or [`RuntimeError::NoMemory`] for a node
    /// this process cannot pin memory on, [`RuntimeError::UnknownGpu`] or
    /// [`RuntimeError::UnknownGpuIndex`] for a GPU the topology does not
    /// have, [`RuntimeError::BadRequest`] for 0 bytes or a size past any
    /// address space, [`RuntimeError::BudgetExceeded`] or
    /// [`RuntimeError::CgroupBudget`] over a budget, and when a region must
    /// be made, its errors ([`RuntimeError::Memlock`],
    /// [`RuntimeError::System`], [`RuntimeError::AddressLimit`] (under
    /// `ulimit -v` or `-d`), [`RuntimeError::OffNode`],
    /// [`RuntimeError::HugePages`], ...).
    ///
    /// # Examples
    ///
    /// ```
    /// # use numapin::topology::{CudaMode, ProbeOptions, Topology};
    /// use numapin::runtime::{Runtime, RuntimeConfig, RuntimeError, Target};
    ///
    /// # let topo = Topology::probe(&ProbeOptions::from_process().with_cuda(CudaMode::Off))?;
    /// let rt = Runtime::new(topo, RuntimeConfig::default().with_region_bytes(2 << 20))?;
    /// // For a GPU: rt.alloc(Target::Gpu(CudaOrdinal(0)), bytes), on its node.
    /// let mut buf = rt.alloc(Target::Host, 1 << 20)?;
    /// buf.fill(7);
    /// assert_eq!((buf.len(), buf[0]), (1 << 20, 7));
    /// assert!(matches!(rt.alloc(Target::Host, 0), Err(RuntimeError::BadRequest { .. })));
    /// # Ok::<(), numapin::Error>(())
    /// ```
    #[inline]
    pub fn alloc(&self, target: Target, bytes: usize) -> Result<PinnedBuf, RuntimeError> {
        self.alloc_with(target, bytes, &AllocOptions::default())
    }

    /// [`Runtime::alloc`] with options: how long to wait for frees over
    /// budget, and whether the buffer is a staging slot (see
    /// [`AllocOptions`]).
    ///
    /// # Errors
    ///
    /// As [`Runtime::alloc`]; with [`AllocOptions::wait`], the budget
    /// errors come only once the wait is over.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # use numapin::topology::{CudaMode, ProbeOptions, Topology};
    /// use numapin::runtime::{AllocOptions, Runtime, RuntimeConfig, RuntimeError, Target};
    ///
    /// # let topo = Topology::probe(&ProbeOptions::from_process().with_cuda(CudaMode::Off))?;
    /// // A budget of 4 MiB per node.
    /// let config = RuntimeConfig::default().with_budget_bytes(Some(4 << 20));
    /// let rt = Runtime::new(topo, config)?;
    /// // A staging slot: its region is its own size (2 MiB), not a standard one.
    /// let slot = rt.alloc_with(Target::Host, 1 << 20, &AllocOptions::default().with_staging(true))?;
    /// // Over the budget: wait up to 10 ms for frees, then the budget's error.
    /// let wait = AllocOptions::default().with_wait(Some(Duration::from_millis(10)));
    /// let over = rt.alloc_with(Target::HostNode(slot.node()), 8 << 20, &wait);
    /// assert!(matches!(over, Err(RuntimeError::BudgetExceeded { .. })), "{over:?}");
    /// # Ok::<(), numapin::Error>(())
    /// ```
    #[inline]
    pub fn alloc_with(
        &self,
        target: Target,
        bytes: usize,
        opts: &AllocOptions,
    ) -> Result<PinnedBuf, RuntimeError> {
        let a = self.arena(self.node_for(target)?)?;
        match opts.wait.or(self.config.budget_wait) {
            Some(t) => a.alloc_waiting(bytes, opts.staging, t),
            None if opts.staging => a.alloc_fitted(bytes),
            None => a.alloc(bytes),
        }
    }

    /// The node pinned memory for `target` comes from: the node itself for
    /// [`Target::HostNode`] (without working out CPUs: the allocation fast
    /// path), else [`Runtime::place`]'s.
    #[inline]
    fn node_for(&self, target: Target) -> Result<u32, RuntimeError> {
        match target {
            Target::HostNode(node) => Ok(node),
            Target::Host => Ok(self.calling_thread_node()),
            _ => Ok(self.place(target)?.node),
        }
    }

    /// The node buffers for CUDA device `gpu` go on
    /// ([`Runtime::place`]'s node for [`Target::Gpu`]).
    ///
    /// # Errors
    ///
    /// [`RuntimeError::UnknownGpu`] when the topology has no such device.
    pub fn node_for_gpu(&self, gpu: CudaOrdinal) -> Result<u32, RuntimeError> {
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

    /// Counters per node with memory, by node number.
    ///
    /// # Examples
    ///
    /// ```
    /// # use numapin::topology::{CudaMode, ProbeOptions, Topology};
    /// use numapin::runtime::{Runtime, RuntimeConfig, Target};
    ///
    /// # let topo = Topology::probe(&ProbeOptions::from_process().with_cuda(CudaMode::Off))?;
    /// let rt = Runtime::new(topo, RuntimeConfig::default().with_region_bytes(2 << 20))?;
    /// let buf = rt.alloc(Target::Host, 1 << 20)?;
    /// let here = rt.stats().into_iter().find(|s| s.node == buf.node()).expect("its node");
    /// assert_eq!((here.regions, here.bytes_in_use), (1, 1 << 20));
    /// assert!(here.bytes_reserved >= 2 << 20 && here.budget > 0);
    /// drop(buf);
    /// let after = rt.stats().into_iter().find(|s| s.node == here.node).expect("its node");
    /// assert_eq!(after.bytes_in_use, 0, "back in its arena, the region kept");
    /// # Ok::<(), numapin::Error>(())
    /// ```
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

    /// Binds the calling thread to [`Runtime::place`]'s CPUs for `target`
    /// (for a GPU, its node's allowed CPUs; with unknown locality, the
    /// allowed CPUs, with a warning in the returned site). Threads it
    /// starts afterwards inherit the binding.
    ///
    /// # Errors
    ///
    /// [`Runtime::place`]'s errors for `target`, and
    /// [`RuntimeError::Affinity`] when `sched_setaffinity` refuses the CPUs.
    pub fn bind_current_thread(&self, target: Target) -> Result<Site, RuntimeError> {
        let site = self.place(target)?;
        crate::affinity::bind_current_thread(&site.cpus)?;
        Ok(site)
    }

    /// Binds the whole process to [`Runtime::place`]'s answer for
    /// `target`: every thread still on the calling thread's CPU set moves
    /// to the site's CPUs, and the calling thread's memory policy becomes
    /// `MPOL_BIND` to the site's node (the node its pinned memory comes
    /// from), as `numapin exec` does for one rank. Call it early, before
    /// starting workers (a memory policy is per thread). When
    /// `set_mempolicy` is refused (a seccomp profile), only the CPUs are
    /// bound and the returned site's warnings say so. For a rank plan in
    /// another [`Mode`](crate::affinity::Mode) (socket, exclusive cores,
    /// ...), plan with [`crate::affinity::plan`] and apply it with
    /// [`crate::affinity::bind_current_process`].
    ///
    /// # Errors
    ///
    /// [`Runtime::place`]'s errors for `target`, and
    /// [`RuntimeError::Affinity`] when the CPUs or the memory policy cannot
    /// be set (other than a refused `set_mempolicy`).
    pub fn bind_current_process(&self, target: Target) -> Result<Site, RuntimeError> {
        use crate::affinity::{Binding, MemPolicy, RankPlan};
        let mut site = self.place(target)?;
        let plan = RankPlan {
            local_rank: 0,
            gpu: site.gpu,
            pci_bus_id: site
                .gpu
                .and_then(|g| self.topology.gpu(g))
                .map(|g| g.pci_bus_id.clone()),
            cpus: site.cpus.clone(),
            mems: vec![site.node],
            warnings: Vec::new(),
            nics: Vec::new(),
        };
        if let Binding::CpusOnly { reason } =
            crate::affinity::bind_current_process(&plan, MemPolicy::Bind)?
        {
            site.warnings.push(reason);
        }
        Ok(site)
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
