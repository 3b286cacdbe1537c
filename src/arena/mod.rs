//! Per-NUMA-node pinned arenas.
//!
//! A [`NodeArena`] holds the pinned memory of one NUMA node: regions
//! ([`region`]: mmap, mbind, populate, mlock, CUDA registration, placement
//! check) carved up by a TLSF sub-allocator ([`alloc`]) under one short
//! lock. The [`crate::runtime::Runtime`] owns one arena per node with memory
//! and hands out [`PinnedBuf`]s; see `docs/arena.md` for the design, the
//! budget and what each error means.
//!
//! * Regions are backed by transparent huge pages, or by hugetlb pages from
//!   the node's pool ([`HugePages`]; `huge.rs` decides, per region, and the
//!   region records what it got).
//! * Regions are made lazily, at the configured size (256 MiB by default);
//!   a request over half a region gets a region of its own size, and one
//!   larger than a region a *dedicated* region; of the dedicated regions
//!   emptied, only the last is kept for reuse, the others go back to the
//!   system when their buffer is freed. Other empty regions are kept for reuse until
//!   [`NodeArena::trim`].
//! * The budget of pinned bytes per node defaults to half the node's
//!   memory ([`DEFAULT_BUDGET_FRACTION`]); without CAP_IPC_LOCK, a region
//!   must also fit in what RLIMIT_MEMLOCK leaves.
//! * A buffer that took part in an async copy is not reused before the
//!   copy's CUDA event has completed: dropping it with a copy in flight
//!   puts it on a deferred list, looked at on later calls and by
//!   [`NodeArena::reclaim`].
//! * Freed blocks up to 4 MiB are kept in small per-thread caches
//!   ([`cache`]), so that alloc and free of common sizes take no shared
//!   lock; the caches are bounded and drained on thread exit, trim, the
//!   budget path and when the runtime is dropped.

// Public to the fuzz target and the model test (through `internals`).
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub mod alloc;
mod buf;
pub(crate) mod cache;
mod error;
mod huge;
pub(crate) mod publish;
pub(crate) mod region;
pub(crate) mod release;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

pub use buf::PinnedBuf;
pub use cache::CacheLimits;
pub use error::ArenaError;
pub use huge::{HugePages, PageKind, ParseHugePagesError};
pub(crate) use region::{Region, RegionOptions, Registration, SharedFile, Step};

use crate::cpulist::CpuList;
use crate::platform::cuda::Event;

/// Default per-node budget: this fraction of the node's memory may be
/// pinned. Half leaves the other half to page cache, the process's own
/// heap and everyone else on the node; pinned memory cannot be reclaimed,
/// so running a node out of it invites the OOM killer.
pub const DEFAULT_BUDGET_FRACTION: f64 = 0.5;
/// Default region size: 256 MiB.
pub const DEFAULT_REGION_BYTES: usize = 256 << 20;
/// Default (and smallest) block alignment: 4 KiB.
pub const DEFAULT_ALIGNMENT: usize = 4096;
/// Largest block alignment: 2 MiB.
pub const MAX_ALIGNMENT: usize = 2 << 20;

/// What a page found off its node at region creation means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Placement {
    /// An error: the region is torn down ([`ArenaError::Placement`]).
    #[default]
    Strict,
    /// Counted in [`NodeStats::pages_off_node`], the region kept.
    Warn,
}

/// How a region's pages were put on its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PlacedBy {
    /// `mbind(MPOL_BIND)` to the node, then touched.
    Mbind,
    /// `mbind` was refused (a seccomp profile, no NUMA support): touched
    /// first by threads bound to the node's CPUs, so that the default
    /// policy allocated the pages there.
    FirstTouch,
    /// The CUDA driver placed them: `cuMemCreate` with a host NUMA
    /// location ([`Backend::DriverNuma`]).
    DriverNuma,
    /// `cuMemHostAlloc` while the calling thread's memory policy was
    /// `MPOL_BIND` to the node ([`Backend::HostAllocBound`]).
    BindPolicy,
}

/// Where a region's pinned memory comes from (the region *backend*).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Backend {
    /// numapin's own (the default): `mmap`, `mbind(MPOL_BIND)`, populated by
    /// threads on the node's CPUs, `mlock`, `cuMemHostRegister`, placement
    /// checked page by page. Works without a CUDA driver (unregistered).
    #[default]
    Mapped,
    /// The driver allocates pinned memory on the node itself: `cuMemCreate`
    /// with a `CU_MEM_LOCATION_TYPE_HOST_NUMA` location, mapped with
    /// `cuMemMap` and made accessible to the host and every GPU with
    /// `cuMemSetAccess` (CUDA 12.2+ drivers; needs a driver and a GPU).
    DriverNuma,
    /// `cuMemHostAlloc(PORTABLE | DEVICEMAP)` with the thread's memory
    /// policy bound to the node for the call (needs a driver and a GPU, and
    /// `set_mempolicy` allowed).
    HostAllocBound,
}

impl Backend {
    /// `mapped`, `driver_numa`, `host_alloc_bound`: the name in `numapin
    /// bench` parameters and on the command line.
    pub fn as_str(&self) -> &'static str {
        match self {
            Backend::Mapped => "mapped",
            Backend::DriverNuma => "driver_numa",
            Backend::HostAllocBound => "host_alloc_bound",
        }
    }

    /// Every backend, the default first.
    pub const ALL: [Backend; 3] = [
        Backend::Mapped,
        Backend::DriverNuma,
        Backend::HostAllocBound,
    ];
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Mapped => "mmap + mbind + mlock + cuMemHostRegister",
            Backend::DriverNuma => "cuMemCreate on a host NUMA node",
            Backend::HostAllocBound => "cuMemHostAlloc under MPOL_BIND",
        })
    }
}

/// What keeps a region's pages resident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PinnedBy {
    /// `mlock`.
    Mlock,
    /// CUDA registration alone: RLIMIT_MEMLOCK was too low for `mlock`,
    /// and `cuMemHostRegister` pins the pages without that limit.
    Registration,
    /// The CUDA driver allocated them pinned (a driver backend).
    Driver,
    /// hugetlb pages, which the kernel never swaps out: not locked (`mlock`
    /// does nothing for them and is not counted in VmLck), so
    /// RLIMIT_MEMLOCK does not apply.
    Hugetlb,
}

/// How a region's placement was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum VerifiedBy {
    /// `move_pages` with a null node list, page by page.
    MovePages,
    /// `move_pages` was refused: per-node page counts of the region's own
    /// VMAs from `/proc/self/numa_maps` (as exact).
    NumaMaps,
    /// Not checked: the driver's mapping hides its pages from both
    /// `move_pages` and `numa_maps` (a driver backend, which was given the
    /// node explicitly).
    Unverified,
}

impl PlacedBy {
    /// `mbind`, `first_touch`: the name in `numapin bench` parameters.
    pub fn as_str(&self) -> &'static str {
        match self {
            PlacedBy::Mbind => "mbind",
            PlacedBy::FirstTouch => "first_touch",
            PlacedBy::DriverNuma => "driver_numa",
            PlacedBy::BindPolicy => "bind_policy",
        }
    }
}

impl PinnedBy {
    /// `mlock`, `registration`.
    pub fn as_str(&self) -> &'static str {
        match self {
            PinnedBy::Mlock => "mlock",
            PinnedBy::Registration => "registration",
            PinnedBy::Driver => "driver",
            PinnedBy::Hugetlb => "hugetlb",
        }
    }
}

impl VerifiedBy {
    /// `move_pages`, `numa_maps`.
    pub fn as_str(&self) -> &'static str {
        match self {
            VerifiedBy::MovePages => "move_pages",
            VerifiedBy::NumaMaps => "numa_maps",
            VerifiedBy::Unverified => "unverified",
        }
    }
}

/// How one region was placed, pinned and verified, and which pages back
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct RegionMethods {
    /// Placement.
    pub placed: PlacedBy,
    /// What keeps the pages resident.
    pub pinned: PinnedBy,
    /// How placement was checked.
    pub verified: VerifiedBy,
    /// The pages ([`RuntimeConfig::huge_pages`](crate::runtime::RuntimeConfig::huge_pages)
    /// asks, the node's pool decides).
    pub pages: PageKind,
}

impl std::fmt::Display for RegionMethods {
    /// `placed by first touch, pinned by CUDA registration, verified
    /// through numa_maps, transparent huge pages`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let placed = match self.placed {
            PlacedBy::Mbind => "bound (mbind MPOL_BIND)",
            PlacedBy::FirstTouch => "placed by first touch",
            PlacedBy::DriverNuma => "placed by the driver (cuMemCreate, host NUMA location)",
            PlacedBy::BindPolicy => "allocated by cuMemHostAlloc under MPOL_BIND",
        };
        let pinned = match self.pinned {
            PinnedBy::Mlock => "locked (mlock)",
            PinnedBy::Registration => "pinned by CUDA registration (no mlock)",
            PinnedBy::Driver => "pinned by the driver",
            PinnedBy::Hugetlb => "hugetlb (never swapped, no mlock)",
        };
        let verified = match self.verified {
            VerifiedBy::MovePages => "verified with move_pages",
            VerifiedBy::NumaMaps => "verified through /proc/self/numa_maps",
            VerifiedBy::Unverified => "not verifiable (the driver's mapping hides its pages)",
        };
        write!(f, "{placed}, {pinned}, {verified}, {}", self.pages.words())
    }
}

/// A budget of pinned bytes shared by every node of a runtime: the share of
/// the process's memory cgroup limit that may be pinned (pinned pages are
/// charged to the cgroup whatever their node, and above `memory.max` the
/// OOM killer ends the process).
#[derive(Debug)]
pub struct SharedBudget {
    limit: u64,
    used: AtomicU64,
    source: String,
}

impl SharedBudget {
    /// A budget of `limit` bytes; `source` says where it comes from (for
    /// messages: `half of memory.max = 2 GiB (sys/fs/cgroup/memory.max)`).
    pub fn new(limit: u64, source: String) -> SharedBudget {
        SharedBudget {
            limit,
            used: AtomicU64::new(0),
            source,
        }
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }

    /// Where the limit comes from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Charges `bytes` if they fit; whether they did.
    fn try_reserve(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                u.checked_add(bytes).filter(|&n| n <= self.limit)
            })
            .is_ok()
    }

    /// The error for `requested` bytes on `node` that do not fit.
    fn exceeded(&self, node: u32, requested: u64) -> ArenaError {
        ArenaError::CgroupBudget {
            node,
            requested,
            in_use: self.used(),
            limit: self.limit,
            cgroup: self.source.clone(),
        }
    }

    /// Gives back `bytes` charged before.
    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::SeqCst);
    }
}

/// Formats a byte count for people: `64 MiB`, `1.5 GiB`, `4096 bytes`.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    if b == u64::MAX {
        return "unlimited".into();
    }
    for (u, name) in UNITS {
        if b >= u {
            return if b % u == 0 {
                format!("{} {name}", b / u)
            } else {
                format!("{:.1} {name}", b as f64 / u as f64)
            };
        }
    }
    format!("{b} bytes")
}

/// One node's counters, as [`crate::runtime::Runtime::stats`] reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct NodeStats {
    /// The node.
    pub node: u32,
    /// Regions held.
    pub regions: u64,
    /// Bytes in regions (mapped for the arena).
    pub bytes_reserved: u64,
    /// Bytes locked (mlock); regions pinned by CUDA registration alone and
    /// hugetlb regions are not counted here (see
    /// `regions_registration_pinned`, `regions_hugetlb_2m`).
    pub bytes_locked: u64,
    /// Bytes registered with CUDA.
    pub bytes_registered: u64,
    /// Bytes in buffers handed out (rounded to the alignment), including
    /// buffers dropped with a copy still in flight; not blocks in threads'
    /// caches.
    pub bytes_in_use: u64,
    /// Bytes of freed blocks kept in threads' caches for reuse (not in
    /// use, not free for other sizes until given back).
    pub bytes_cached: u64,
    /// Blocks kept in threads' caches.
    pub blocks_cached: u64,
    /// Highest bytes taken from the regions (in use plus cached) seen.
    pub bytes_peak: u64,
    /// The budget of pinned bytes.
    pub budget: u64,
    /// Allocations served.
    pub allocations: u64,
    /// Of those, allocations served from a thread's cache.
    pub cache_hits: u64,
    /// Buffers taken back.
    pub frees: u64,
    /// Allocations refused.
    pub failures: u64,
    /// Buffers dropped with a copy in flight, not yet taken back.
    pub deferred: u64,
    /// 4 KiB pages of the current regions found on the node (a hugetlb
    /// page counts as the 4 KiB pages it holds: 512 for 2 MiB).
    pub pages_on_node: u64,
    /// 4 KiB pages of the current regions found elsewhere or not present
    /// (only with [`Placement::Warn`]).
    pub pages_off_node: u64,
    /// `"registered"`, `"skipped: <why>"`, or `"none"` before any region.
    pub registration: String,
    /// Of the current regions, those bound with `mbind(MPOL_BIND)`.
    pub regions_bound: u64,
    /// Of the current regions, those placed by first touch (`mbind` was
    /// refused).
    pub regions_first_touch: u64,
    /// Of the current regions, those locked with `mlock`.
    pub regions_mlocked: u64,
    /// Of the current regions, those pinned by CUDA registration alone
    /// (RLIMIT_MEMLOCK too low for `mlock`).
    pub regions_registration_pinned: u64,
    /// Of the current regions, those whose placement `move_pages` checked.
    pub regions_verified_move_pages: u64,
    /// Of the current regions, those whose placement was checked through
    /// `/proc/self/numa_maps` (`move_pages` was refused).
    pub regions_verified_numa_maps: u64,
    /// Bytes of emptied regions of 64 MiB or more that the release thread
    /// is still tearing down (they count against the budget until gone).
    pub bytes_releasing: u64,
    /// Shared regions on the node (`numapin::shared`: memory other
    /// processes map too), counted apart from `regions`.
    pub shared_regions: u64,
    /// Their bytes (in the budget beside `bytes_reserved`).
    pub bytes_shared: u64,
    /// Of the current regions, those a driver backend allocated
    /// ([`Backend::DriverNuma`], [`Backend::HostAllocBound`]).
    pub regions_driver: u64,
    /// Of the current regions, those whose placement could not be checked
    /// (a driver backend's mapping hides its pages).
    pub regions_unverified: u64,
    /// Of the current regions, those backed by 2 MiB hugetlb pages.
    pub regions_hugetlb_2m: u64,
    /// Of the current regions, those backed by 1 GiB hugetlb pages.
    pub regions_hugetlb_1g: u64,
    /// Of the current regions, those given transparent huge pages
    /// (`MADV_HUGEPAGE`).
    pub regions_thp: u64,
    /// Of the current regions, those of 4 KiB pages (THP mode `never`, or
    /// [`HugePages::None`]).
    pub regions_base_pages: u64,
    /// Why methods other than the usual ones were used, for the latest
    /// region (`mbind refused (EPERM): placed by first touch from CPUs
    /// 0-3`); empty before any region or when none was needed.
    pub method_notes: Vec<String>,
}

impl NodeStats {
    /// The methods and pages every current region shares; `None` when the
    /// regions differ in one of them, before any region, or when a driver
    /// backend made some (its two placements are counted together).
    pub fn shared_methods(&self) -> Option<RegionMethods> {
        fn only<T: Copy>(pairs: &[(u64, T)]) -> Option<T> {
            let mut used = pairs.iter().filter(|(n, _)| *n > 0);
            let first = used.next()?;
            used.next().is_none().then_some(first.1)
        }
        if self.regions_driver > 0 {
            return None;
        }
        Some(RegionMethods {
            placed: only(&[
                (self.regions_bound, PlacedBy::Mbind),
                (self.regions_first_touch, PlacedBy::FirstTouch),
            ])?,
            pinned: only(&[
                (self.regions_mlocked, PinnedBy::Mlock),
                (self.regions_registration_pinned, PinnedBy::Registration),
                (
                    self.regions_hugetlb_2m + self.regions_hugetlb_1g,
                    PinnedBy::Hugetlb,
                ),
            ])?,
            verified: only(&[
                (self.regions_verified_move_pages, VerifiedBy::MovePages),
                (self.regions_verified_numa_maps, VerifiedBy::NumaMaps),
                (self.regions_unverified, VerifiedBy::Unverified),
            ])?,
            pages: only(&[
                (self.regions_base_pages, PageKind::Base),
                (self.regions_thp, PageKind::Transparent),
                (self.regions_hugetlb_2m, PageKind::Hugetlb2M),
                (self.regions_hugetlb_1g, PageKind::Hugetlb1G),
            ])?,
        })
    }

    /// How the current regions were placed, pinned and verified, and their
    /// pages, in words: `placed by first touch, pinned by CUDA registration
    /// (no mlock), verified through /proc/self/numa_maps, transparent huge
    /// pages`, or with counts when regions differ; `no region` before any.
    pub fn methods(&self) -> String {
        if self.regions == 0 {
            return "no region".into();
        }
        let part = |pairs: &[(u64, &str)]| -> String {
            let used: Vec<_> = pairs.iter().filter(|(n, _)| *n > 0).collect();
            match used.as_slice() {
                [(_, one)] => one.to_string(),
                _ => used
                    .iter()
                    .map(|(n, w)| format!("{n} {w}"))
                    .collect::<Vec<_>>()
                    .join(" + "),
            }
        };
        format!(
            "{}, {}, {}, {}",
            part(&[
                (self.regions_bound, "bound (mbind MPOL_BIND)"),
                (self.regions_first_touch, "placed by first touch"),
                (self.regions_driver, "placed by the CUDA driver"),
            ]),
            part(&[
                (self.regions_mlocked, "locked (mlock)"),
                (
                    self.regions_registration_pinned,
                    "pinned by CUDA registration (no mlock)"
                ),
                (self.regions_driver, "pinned by the driver"),
                (
                    self.regions_hugetlb_2m + self.regions_hugetlb_1g,
                    "hugetlb (never swapped, no mlock)"
                ),
            ]),
            part(&[
                (self.regions_verified_move_pages, "verified with move_pages"),
                (
                    self.regions_verified_numa_maps,
                    "verified through /proc/self/numa_maps"
                ),
                (self.regions_unverified, "not verifiable"),
            ]),
            part(&[
                (self.regions_thp, PageKind::Transparent.words()),
                (self.regions_hugetlb_2m, PageKind::Hugetlb2M.words()),
                (self.regions_hugetlb_1g, PageKind::Hugetlb1G.words()),
                (self.regions_base_pages, PageKind::Base.words()),
                (self.regions_driver, PageKind::Driver.words()),
            ]),
        )
    }
}

/// How one node's arena behaves.
#[derive(Debug, Clone)]
pub struct ArenaConfig {
    /// Standard region size in bytes (a multiple of 2 MiB, of 1 GiB with
    /// [`HugePages::Hugetlb1G`]).
    pub region_bytes: u64,
    /// Block alignment (power of two, 4 KiB to 2 MiB).
    pub alignment: u64,
    /// Pinned-byte budget.
    pub budget: u64,
    /// Threads that populate a region (1 = serial).
    pub populate_threads: usize,
    /// CPUs the populate threads run on.
    pub cpus: CpuList,
    /// Whether to register regions with CUDA.
    pub register: bool,
    /// What a page off the node means.
    pub placement: Placement,
    /// Where regions' memory comes from.
    pub backend: Backend,
    /// Whether RLIMIT_MEMLOCK applies (false with CAP_IPC_LOCK).
    pub memlock_applies: bool,
    /// A budget over every node of the runtime (the memory cgroup's
    /// limit), charged by each region as well as the node's own budget.
    pub shared: Option<Arc<SharedBudget>>,
    /// Bounds of each thread's cache of freed blocks.
    pub cache: CacheLimits,
    /// Which pages regions ask for.
    pub huge_pages: HugePages,
    /// Make standard regions in two halves, registered one by one (see
    /// [`NodeArena::part_bytes_for`]).
    pub register_in_parts: bool,
    /// Test hook: read the huge page pools under this root instead of `/`.
    #[doc(hidden)]
    pub pool_root: Option<std::path::PathBuf>,
    /// Test hook: fail region creation right after this step.
    #[doc(hidden)]
    pub fail_after: Option<Step>,
}

/// A block handed out: what a [`PinnedBuf`] must give back.
#[derive(Debug, Clone, Copy)]
struct Lease {
    id: u32,
    size: u64,
}

/// What [`NodeArena::admit`] decided for a new region.
struct Admitted {
    size: u64,
    pin_by_registration: Option<String>,
}

struct Deferred {
    lease: Lease,
    events: Vec<Event>,
}

struct Slot {
    region: Region,
    dedicated: bool,
}

#[derive(Default)]
struct Counters {
    allocations: u64,
    cache_hits: u64,
    frees: u64,
    failures: u64,
    peak: u64,
}

struct State {
    tlsf: alloc::Tlsf,
    slots: Vec<Option<Slot>>,
    deferred: Vec<Deferred>,
    counters: Counters,
    registration: Option<Registration>,
    /// The one empty dedicated region kept for the next large request (a
    /// loop that pins one large tensor after another reuses it instead of
    /// making a region each time); any other goes back when emptied.
    kept_dedicated: Option<u32>,
    notes: Vec<String>,
    /// The shared regions made on this node ([`NodeArena::shared_region`]):
    /// `(id, bytes)`, and the last id given.
    shared: Vec<(u64, u64)>,
    last_shared: u64,
}

impl State {
    /// Bytes held on the node: the regions of buffers and the shared ones.
    fn reserved(&self) -> u64 {
        self.tlsf.region_bytes() + self.shared.iter().map(|(_, b)| b).sum::<u64>()
    }
}

/// Keeps a value on cache lines of its own, so that writes to it do not
/// slow down readers of its neighbours.
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for Padded<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

struct Slow {
    grow: Mutex<()>,
    freed: Condvar,
}

/// The pinned memory of one NUMA node (see the module docs).
pub struct NodeArena {
    // Read on every alloc and free, written rarely (waiters: only while a
    // thread waits for the budget).
    node: u32,
    id: u64,
    cache_max: u64,
    caching: AtomicBool,
    waiters: AtomicUsize,
    cfg: ArenaConfig,
    // Written on every locked operation.
    state: Padded<Mutex<State>>,
    // Threads' caches, written when a thread first caches a block here.
    shelves: Padded<Mutex<Vec<Weak<cache::Shelf>>>>,
    slow: Padded<Slow>,
    // Large regions being torn down by the release thread.
    releasing: Arc<release::Releasing>,
}

impl std::fmt::Debug for NodeArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeArena")
            .field("node", &self.node)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The state stays consistent across a panic (no user code runs under
    // the lock), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether every event has completed. A query that fails (a context torn
/// down, a sticky device error) means the copy is no longer running.
fn all_done(events: &[Event]) -> bool {
    events.iter().all(|e| e.is_complete().unwrap_or(true))
}

impl NodeArena {
    /// An arena for `node`; no memory is touched until the first
    /// allocation.
    pub fn new(node: u32, cfg: ArenaConfig) -> Arc<NodeArena> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Arc::new(NodeArena {
            node,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            cache_max: cfg.cache.largest_cached(cfg.region_bytes),
            caching: AtomicBool::new(true),
            waiters: AtomicUsize::new(0),
            state: Padded(Mutex::new(State {
                tlsf: alloc::Tlsf::new(cfg.alignment),
                slots: Vec::new(),
                deferred: Vec::new(),
                counters: Counters::default(),
                registration: None,
                kept_dedicated: None,
                notes: Vec::new(),
                shared: Vec::new(),
                last_shared: 0,
            })),
            shelves: Padded(Mutex::new(Vec::new())),
            slow: Padded(Slow {
                grow: Mutex::new(()),
                freed: Condvar::new(),
            }),
            releasing: Arc::default(),
            cfg,
        })
    }

    /// The node.
    pub fn node(&self) -> u32 {
        self.node
    }

    /// The configuration.
    pub fn config(&self) -> &ArenaConfig {
        &self.cfg
    }

    /// Lends a buffer of `bytes`; over budget, an error at once.
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<PinnedBuf, ArenaError> {
        let r = self.alloc_inner(bytes);
        if r.is_err() {
            lock(&self.state).counters.failures += 1;
        }
        r
    }

    /// Lends a buffer of `bytes`; over budget, waits up to `timeout` for
    /// other buffers to be freed, then fails with the budget error.
    pub fn alloc_timeout(
        self: &Arc<Self>,
        bytes: usize,
        timeout: Duration,
    ) -> Result<PinnedBuf, ArenaError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.alloc_inner(bytes) {
                Err(ArenaError::BudgetExceeded { .. }) if Instant::now() < deadline => {
                    // While a thread waits, frees bypass the threads' caches
                    // and wake it.
                    self.waiters.fetch_add(1, Ordering::SeqCst);
                    let g = lock(&self.state);
                    // Short slices: deferred buffers become free when their
                    // events complete, which nothing signals, and a free
                    // that raced with the count above signals no one.
                    let slice = deadline
                        .saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(2));
                    let _ = self.slow.freed.wait_timeout(g, slice);
                    self.waiters.fetch_sub(1, Ordering::SeqCst);
                }
                r => {
                    if r.is_err() {
                        lock(&self.state).counters.failures += 1;
                    }
                    return r;
                }
            }
        }
    }

    #[inline]
    fn alloc_inner(self: &Arc<Self>, bytes: usize) -> Result<PinnedBuf, ArenaError> {
        let bad = |problem: &str| ArenaError::BadRequest {
            node: self.node,
            bytes: bytes as u64,
            problem: problem.into(),
        };
        if bytes == 0 {
            return Err(bad("a buffer must hold at least one byte"));
        }
        if bytes as u64 > u64::MAX / 4 || bytes > isize::MAX as usize / 2 {
            return Err(bad("larger than any address space"));
        }
        if bytes as u64 <= self.cache_max {
            let size = alloc::round_up(bytes as u64, self.cfg.alignment);
            if let Some(buf) = self.cache_pop(size, bytes) {
                return Ok(buf);
            }
        }
        {
            let mut st = lock(&self.state);
            if let Some(buf) = self.try_alloc(&mut st, bytes) {
                return Ok(buf);
            }
        }
        // Slow path: one thread grows the arena at a time; the others wait
        // here and then find room in what it added.
        let _grow = lock(&self.slow.grow);
        let reserved = {
            let mut st = lock(&self.state);
            if let Some(buf) = self.try_alloc(&mut st, bytes) {
                return Ok(buf);
            }
            st.reserved()
        };
        // Growing waits for regions still being released: until gone they
        // hold budget, cgroup memory and locked bytes (and growing costs
        // more than the wait).
        self.releasing.wait();
        // Blocks in threads' caches may make room: give them back before
        // growing (rare, and cheap next to making a region).
        if self.flush_all_caches() > 0 {
            let mut st = lock(&self.state);
            if let Some(buf) = self.try_alloc(&mut st, bytes) {
                return Ok(buf);
            }
        }
        let (size, dedicated) = alloc::region_size_for(bytes as u64, self.cfg.region_bytes);
        // 1 GiB hugetlb pages make every region a multiple of 1 GiB.
        let granule = self.cfg.huge_pages.granule() as u64;
        let size = alloc::round_up(size, granule);
        let fitted = alloc::round_up(bytes as u64, granule);
        let admitted = self.admit(bytes as u64, (size, fitted), reserved)?;
        let size = admitted.size;
        let created = Region::create(&RegionOptions {
            register_part_bytes: self.part_bytes_for(size, bytes as u64),
            ..self.region_options(&admitted, None)
        });
        let region = self.charged(created, size)?;
        let mut st = lock(&self.state);
        // A region made in parts is registered part by part: no block may
        // span two (CUDA refuses a copy across registrations).
        let id = st
            .tlsf
            .add_region_in_parts(region.len() as u64, region.part_bytes() as u64);
        if st.slots.len() <= id as usize {
            st.slots.resize_with(id as usize + 1, || None);
        }
        st.registration = Some(region.registration().clone());
        st.notes = region.notes().to_vec();
        st.slots[id as usize] = Some(Slot { region, dedicated });
        let buf = self
            .try_alloc(&mut st, bytes)
            .expect("a region made for this request has room for it");
        drop(st);
        publish::changed();
        Ok(buf)
    }

    /// Decides whether a region of `size` bytes (or, short of room, the
    /// `fitted` size that would still serve a request of `bytes`) may be
    /// made with `reserved` bytes held on the node already: the node's
    /// budget (after giving back empty regions), the memlock limit (too
    /// low: registration pins the region, or, without CUDA, an error) and
    /// the memory cgroup's budget over all nodes, which it reserves (the
    /// region's charge, or [`NodeArena::charged`], gives it back).
    fn admit(
        &self,
        bytes: u64,
        (size, fitted): (u64, u64),
        reserved: u64,
    ) -> Result<Admitted, ArenaError> {
        let mut size = size;
        let mut reserved = reserved;
        if reserved + size > self.cfg.budget {
            // Empty regions held for reuse make room first.
            reserved = self.trim();
            if reserved + size > self.cfg.budget && reserved + fitted <= self.cfg.budget {
                size = fitted;
            }
            if reserved + size > self.cfg.budget {
                // A budget the memory cgroup set says so, with its fix.
                if let Some(shared) = self
                    .cfg
                    .shared
                    .as_ref()
                    .filter(|s| s.limit() == self.cfg.budget)
                {
                    return Err(shared.exceeded(self.node, bytes));
                }
                return Err(ArenaError::BudgetExceeded {
                    node: self.node,
                    requested: bytes,
                    in_use: reserved,
                    limit: self.cfg.budget,
                });
            }
        }
        let (size, pin_by_registration) = self.memlock_room(size, fitted)?;
        let size = self.reserve_cgroup(bytes, size, fitted)?;
        Ok(Admitted {
            size,
            pin_by_registration,
        })
    }

    /// The memlock limit's say on a region of `size` bytes (or `fitted`):
    /// the size to make, and why registration pins it when the limit is too
    /// low and CUDA will register it. Driver backends' memory is pinned by
    /// the driver, outside RLIMIT_MEMLOCK (as registration is); hugetlb
    /// pages are not locked (never swapped): the limit does not apply.
    fn memlock_room(&self, size: u64, fitted: u64) -> Result<(u64, Option<String>), ArenaError> {
        if !self.cfg.memlock_applies
            || self.cfg.backend != Backend::Mapped
            || self.will_use_hugetlb(size)
        {
            return Ok((size, None));
        }
        let soft = crate::platform::sys::memlock_limit().map_or(0, |(s, _)| s);
        let locked = crate::platform::sys::locked_bytes();
        let room = soft.saturating_sub(locked);
        let size = if size > room && fitted <= room {
            fitted
        } else {
            size
        };
        if size <= room {
            return Ok((size, None));
        }
        // Without CUDA registration nothing else would pin the pages: then
        // the limit is an error, as before.
        if !(self.cfg.register && crate::platform::cuda::driver_version().is_ok()) {
            return Err(ArenaError::lock_failed(self.node, size, None));
        }
        Ok((
            size,
            Some(format!(
                "RLIMIT_MEMLOCK is {} with {} locked, too low for {}",
                fmt_bytes(soft),
                fmt_bytes(locked),
                fmt_bytes(size)
            )),
        ))
    }

    /// Reserves `size` bytes (or `fitted`) of the memory cgroup's budget
    /// over all nodes, if there is one; the size reserved.
    fn reserve_cgroup(&self, bytes: u64, size: u64, fitted: u64) -> Result<u64, ArenaError> {
        let Some(shared) = &self.cfg.shared else {
            return Ok(size);
        };
        if shared.try_reserve(size) {
            return Ok(size);
        }
        // Empty regions of this node make room (other nodes keep theirs
        // until their own trim).
        self.trim();
        if size > fitted && shared.try_reserve(fitted) {
            Ok(fitted)
        } else if shared.try_reserve(size) {
            Ok(size)
        } else {
            Err(shared.exceeded(self.node, bytes))
        }
    }

    /// The options of a region `admitted` (mapping `shared` when given).
    fn region_options(
        &self,
        admitted: &Admitted,
        shared: Option<region::SharedFile>,
    ) -> RegionOptions {
        RegionOptions {
            node: self.node,
            size: admitted.size as usize,
            cpus: self.cfg.cpus.clone(),
            populate_threads: self.cfg.populate_threads,
            register: self.cfg.register,
            placement: self.cfg.placement,
            pin_by_registration: admitted.pin_by_registration.clone(),
            backend: self.cfg.backend,
            huge_pages: self.cfg.huge_pages,
            register_part_bytes: 0,
            shared,
            pool_root: self.cfg.pool_root.clone(),
            fail_after: self.cfg.fail_after,
        }
    }

    /// The region `created` (of `size` bytes reserved by [`admit`](Self::admit)),
    /// charged to the cgroup's budget until dropped; on failure the
    /// reservation is given back.
    fn charged(
        &self,
        created: Result<Region, ArenaError>,
        size: u64,
    ) -> Result<Region, ArenaError> {
        match created {
            Ok(mut region) => {
                if let Some(shared) = &self.cfg.shared {
                    region.charge(shared.clone(), size);
                }
                Ok(region)
            }
            Err(e) => {
                if let Some(shared) = &self.cfg.shared {
                    shared.release(size);
                }
                Err(e)
            }
        }
    }

    /// Bytes per part of a region of `size` bytes made for a request of
    /// `bytes`: half a standard region (rounded up to 2 MiB by the region)
    /// for a standard region made for a request of at most half of one,
    /// when [`ArenaConfig::register_in_parts`] is on; 0 (one piece)
    /// otherwise. Every request a standard region serves (at most half a
    /// region, see [`alloc::region_size_for`]) fits in one part.
    pub fn part_bytes_for(&self, size: u64, bytes: u64) -> usize {
        let half = self.cfg.region_bytes / 2;
        if self.cfg.register_in_parts && size == self.cfg.region_bytes && bytes <= half {
            half as usize
        } else {
            0
        }
    }

    /// Whether a region of `size` bytes made now would be of hugetlb pages
    /// (a preview of the choice region creation makes; an explicit hugetlb
    /// choice always is, or fails).
    fn will_use_hugetlb(&self, size: u64) -> bool {
        match self.cfg.huge_pages {
            HugePages::Hugetlb2M | HugePages::Hugetlb1G => true,
            HugePages::Auto => {
                let root = self
                    .cfg
                    .pool_root
                    .as_deref()
                    .unwrap_or(std::path::Path::new("/"));
                huge::choose(HugePages::Auto, self.node, size as usize, root)
                    .is_ok_and(|c| c.kind.hugetlb_bytes().is_some())
            }
            HugePages::Transparent | HugePages::None => false,
        }
    }

    #[inline]
    fn try_alloc(self: &Arc<Self>, st: &mut State, bytes: usize) -> Option<PinnedBuf> {
        if !st.deferred.is_empty() {
            Self::reclaim_locked(st);
        }
        let b = st.tlsf.alloc(bytes as u64)?;
        let slot = st.slots[b.region as usize]
            .as_ref()
            .expect("a block lies in a live region");
        // The offset is inside the region (the bookkeeping tiles it).
        let ptr = slot.region.ptr().wrapping_add(b.offset as usize);
        let registered = slot.region.registered();
        st.counters.allocations += 1;
        st.counters.peak = st.counters.peak.max(st.tlsf.used_bytes());
        Some(PinnedBuf::new(
            ptr,
            bytes,
            registered,
            Lease {
                id: b.id,
                size: b.size,
            },
            self.clone(),
        ))
    }

    /// Takes back the block of a dropped buffer: into the dropping
    /// thread's cache when it may go there, else into the bookkeeping;
    /// with copies in flight, onto the deferred list.
    #[inline]
    fn give_back(c: cache::Cached, events: Vec<Event>) {
        let pending = !events.is_empty() && !all_done(&events);
        let a = &c.arena;
        let c = if !pending
            && c.lease.size <= a.cache_max
            && a.waiters.load(Ordering::Relaxed) == 0
            && a.caching.load(Ordering::Relaxed)
        {
            match Self::cache_push(c) {
                Ok(()) => return,
                Err(c) => c,
            }
        } else {
            c
        };
        c.arena.give_back_locked(c.lease, events, pending);
    }

    fn give_back_locked(&self, lease: Lease, events: Vec<Event>, pending: bool) {
        let mut released = None;
        {
            let mut st = lock(&self.state);
            if pending {
                st.deferred.push(Deferred { lease, events });
                return;
            }
            if !st.deferred.is_empty() {
                Self::reclaim_locked(&mut st);
            }
            if let Some(r) = Self::free_locked(&mut st, lease, true) {
                released = Some(r);
            }
        }
        self.notify_waiters();
        // A dedicated region is torn down outside the lock (a large one by
        // the release thread).
        if let Some(r) = released {
            release::release(r, &self.releasing);
        }
    }

    /// Wakes threads waiting for the budget, if any.
    #[inline]
    fn notify_waiters(&self) {
        if self.waiters.load(Ordering::Relaxed) > 0 {
            self.slow.freed.notify_all();
        }
    }

    /// Frees a block (`count`: as a buffer taken back, not a block leaving
    /// a thread's cache). A dedicated region that is now empty is kept for
    /// the next large request, and the one kept before it (if still empty)
    /// is returned, to be dropped by the caller outside the lock.
    #[inline]
    fn free_locked(st: &mut State, lease: Lease, count: bool) -> Option<Region> {
        let region = st.tlsf.block_region(lease.id);
        st.tlsf.free(lease.id);
        st.counters.frees += u64::from(count);
        let dedicated = st.slots[region as usize]
            .as_ref()
            .is_some_and(|s| s.dedicated);
        if !dedicated || !st.tlsf.region_is_empty(region) {
            return None;
        }
        let older = st.kept_dedicated.replace(region)?;
        if older != region && st.slots[older as usize].is_some() && st.tlsf.remove_region(older) {
            return st.slots[older as usize].take().map(|s| s.region);
        }
        None
    }

    fn reclaim_locked(st: &mut State) -> Vec<Region> {
        let mut released = Vec::new();
        let mut i = 0;
        while i < st.deferred.len() {
            if all_done(&st.deferred[i].events) {
                let d = st.deferred.swap_remove(i);
                released.extend(Self::free_locked(st, d.lease, true));
            } else {
                i += 1;
            }
        }
        released
    }

    /// Takes back the buffers whose copies have completed; returns how many
    /// are still waiting.
    pub fn reclaim(&self) -> usize {
        let (released, left) = {
            let mut st = lock(&self.state);
            let r = Self::reclaim_locked(&mut st);
            (r, st.deferred.len())
        };
        for r in released {
            release::release(r, &self.releasing);
        }
        self.notify_waiters();
        left
    }

    /// Gives the blocks in threads' caches back, then empty regions back to
    /// the system; returns the bytes still reserved.
    pub fn trim(&self) -> u64 {
        self.flush_all_caches();
        self.releasing.wait();
        let (released, left) = {
            let mut st = lock(&self.state);
            Self::reclaim_locked(&mut st);
            let mut released = Vec::new();
            for id in st.tlsf.empty_regions() {
                if st.tlsf.remove_region(id) {
                    released.extend(st.slots[id as usize].take().map(|s| s.region));
                }
            }
            (released, st.reserved())
        };
        if !released.is_empty() {
            drop(released);
            publish::changed();
        }
        left
    }

    /// A region of `bytes` (rounded up to 2 MiB) over `file` (a shared
    /// file's window: another process may map the same pages), made by the
    /// same steps as every region (bound to the node, faulted in on its
    /// CPUs, locked, registered with CUDA, its placement checked) and
    /// charged to the node's budget, the memory cgroup's and
    /// [`NodeStats::bytes_shared`] until the part is dropped. The file must
    /// hold `file.offset` plus the rounded size. Registered with CUDA when
    /// `register` and the runtime's configuration both ask for it.
    ///
    /// # Errors
    ///
    /// As an allocation that makes a region: [`ArenaError::BudgetExceeded`]
    /// (or [`ArenaError::CgroupBudget`]), [`ArenaError::Memlock`] and any
    /// error of [`Region::create`].
    pub(crate) fn shared_region(
        self: &Arc<Self>,
        file: region::SharedFile,
        bytes: usize,
        register: bool,
    ) -> Result<SharedPart, ArenaError> {
        let size = alloc::round_up(bytes.max(1) as u64, region::HUGE_PAGE as u64);
        let _grow = lock(&self.slow.grow);
        self.releasing.wait();
        let reserved = lock(&self.state).reserved();
        let admitted = self.admit(bytes as u64, (size, size), reserved)?;
        let mut options = self.region_options(&admitted, Some(file));
        options.register &= register;
        let created = Region::create(&options);
        let region = self.charged(created, admitted.size)?;
        let mut st = lock(&self.state);
        st.last_shared += 1;
        let id = st.last_shared;
        st.shared.push((id, region.len() as u64));
        drop(st);
        publish::changed();
        Ok(SharedPart {
            region: Some(region),
            arena: self.clone(),
            id,
        })
    }

    /// The node's counters.
    pub fn stats(&self) -> NodeStats {
        // Every shelf locked, then the state: one consistent snapshot (a
        // block moves between a shelf and the bookkeeping only under both
        // locks).
        let shelves = self.live_shelves();
        let guards: Vec<_> = shelves.iter().map(|s| lock(&s.state)).collect();
        let (mut hits, mut frees, mut blocks, mut cached) = (0, 0, 0, 0);
        for g in &guards {
            hits += g.hits;
            frees += g.frees;
            blocks += g.blocks() as u64;
            cached += g.bytes();
        }
        let st = lock(&self.state);
        drop(guards);
        let regions = st.slots.iter().flatten();
        let mut s = NodeStats {
            node: self.node,
            bytes_reserved: st.tlsf.region_bytes(),
            bytes_in_use: st.tlsf.used_bytes() - cached,
            bytes_cached: cached,
            blocks_cached: blocks,
            bytes_peak: st.counters.peak,
            budget: self.cfg.budget,
            allocations: st.counters.allocations + hits,
            cache_hits: st.counters.cache_hits + hits,
            frees: st.counters.frees + frees,
            failures: st.counters.failures,
            deferred: st.deferred.len() as u64,
            registration: match &st.registration {
                None => "none".into(),
                Some(Registration::Registered) => "registered".into(),
                Some(Registration::Skipped(why)) => format!("skipped: {why}"),
            },
            method_notes: st.notes.clone(),
            bytes_releasing: self.releasing.bytes(),
            shared_regions: st.shared.len() as u64,
            bytes_shared: st.shared.iter().map(|(_, b)| b).sum(),
            ..NodeStats::default()
        };
        for slot in regions {
            let r = &slot.region;
            s.regions += 1;
            let m = r.methods();
            match m.placed {
                PlacedBy::Mbind => s.regions_bound += 1,
                PlacedBy::FirstTouch => s.regions_first_touch += 1,
                PlacedBy::DriverNuma | PlacedBy::BindPolicy => s.regions_driver += 1,
            }
            match m.pinned {
                PinnedBy::Mlock => {
                    s.regions_mlocked += 1;
                    s.bytes_locked += r.len() as u64;
                }
                PinnedBy::Registration => s.regions_registration_pinned += 1,
                PinnedBy::Driver | PinnedBy::Hugetlb => {}
            }
            match m.pages {
                PageKind::Base => s.regions_base_pages += 1,
                PageKind::Transparent => s.regions_thp += 1,
                PageKind::Hugetlb2M => s.regions_hugetlb_2m += 1,
                PageKind::Hugetlb1G => s.regions_hugetlb_1g += 1,
                PageKind::Driver => {}
            }
            match m.verified {
                VerifiedBy::MovePages => s.regions_verified_move_pages += 1,
                VerifiedBy::NumaMaps => s.regions_verified_numa_maps += 1,
                VerifiedBy::Unverified => s.regions_unverified += 1,
            }
            if r.registered() {
                s.bytes_registered += r.len() as u64;
            }
            s.pages_on_node += r.pages_on_node();
            s.pages_off_node += r.pages_off_node();
        }
        s
    }
}

/// A region over a shared file's window, charged to its node until dropped
/// ([`NodeArena::shared_region`]). Dropping it unregisters, unlocks and
/// unmaps this process's mapping; the file's pages live on while another
/// process maps them.
#[derive(Debug)]
pub(crate) struct SharedPart {
    region: Option<Region>,
    arena: Arc<NodeArena>,
    id: u64,
}

impl SharedPart {
    /// The region.
    pub(crate) fn region(&self) -> &Region {
        self.region
            .as_ref()
            .expect("a part holds its region until dropped")
    }
}

impl Drop for SharedPart {
    fn drop(&mut self) {
        drop(self.region.take());
        lock(&self.arena.state)
            .shared
            .retain(|(id, _)| *id != self.id);
        self.arena.notify_waiters();
        publish::changed();
    }
}

impl Drop for NodeArena {
    fn drop(&mut self) {
        // Every PinnedBuf holds an Arc to its arena, so none is alive here;
        // deferred buffers may still have copies in flight: wait for them
        // before the regions are unregistered and unmapped (the only
        // blocking wait, at teardown, never on the allocation path).
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for d in &st.deferred {
            for e in &d.events {
                let _ = e.synchronize();
            }
        }
        // Nothing outlives the arena: its regions in the release thread
        // are gone before this returns.
        self.releasing.wait();
        publish::changed();
    }
}
