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
mod budget;
mod buf;
pub(crate) mod cache;
mod error;
mod huge;
pub(crate) mod machine;
mod methods;
pub(crate) mod publish;
pub(crate) mod region;
pub(crate) mod release;
mod shared;
mod stats;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

pub(crate) use budget::CgroupCap;
pub use buf::PinnedBuf;
pub use cache::CacheLimits;
pub use error::RuntimeError;
pub use huge::{HugePages, PageKind, ParseHugePagesError};
pub(crate) use machine::{MachineCharge, MachineLimit};
pub use methods::{Backend, OffNode, PinnedBy, PlacedBy, RegionMethods, VerifiedBy};
pub(crate) use region::{Region, RegionOptions, Registration, SharedFile, Step};
pub(crate) use shared::SharedPart;
pub use stats::NodeStats;

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
/// Most bytes per registered part of a standard region made in parts
/// ([`RuntimeConfig::register_in_parts`](crate::runtime::RuntimeConfig::register_in_parts)):
/// parts of 128 MiB to 1 GiB made
/// 4 GiB regions in 33-44 ms per GiB against 49 in one piece, and a 16 GiB
/// region in 256 MiB parts took 30 (`numapin bench --only cold-pinning`,
/// H100 VM; docs/BENCHMARKS.md, "cold pinning").
pub const MAX_PART_BYTES: u64 = 256 << 20;
/// Largest block alignment: 2 MiB.
pub const MAX_ALIGNMENT: usize = 2 << 20;

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
                format!("{:.1} {name}", crate::num::ratio(b, u))
            };
        }
    }
    format!("{b} bytes")
}

/// How one node's arena behaves.
#[derive(Debug, Clone)]
pub(crate) struct ArenaConfig {
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
    pub off_node: OffNode,
    /// Where regions' memory comes from.
    pub backend: Backend,
    /// Whether RLIMIT_MEMLOCK applies (false with CAP_IPC_LOCK).
    pub memlock_applies: bool,
    /// The cap over every node of the runtime (under the memory cgroup's
    /// limit), charged by each region as well as the node's own budget.
    pub cgroup_cap: Option<Arc<CgroupCap>>,
    /// The machine budget on the node (every numapin process of the user
    /// together), charged by each region; `None` when off.
    pub(crate) machine: Option<MachineLimit>,
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
    /// The region's charge to the machine budget, if there is one.
    machine: Option<MachineCharge>,
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
pub(crate) struct NodeArena {
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
    pub(crate) fn new(node: u32, cfg: ArenaConfig) -> Arc<NodeArena> {
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
    pub(crate) fn node(&self) -> u32 {
        self.node
    }

    /// The configuration (the measurements make regions as it would).
    #[cfg(feature = "measure")]
    pub(crate) fn config(&self) -> &ArenaConfig {
        &self.cfg
    }

    /// Lends a buffer of `bytes`; over budget, an error at once.
    pub(crate) fn alloc(self: &Arc<Self>, bytes: usize) -> Result<PinnedBuf, RuntimeError> {
        let r = self.alloc_inner(bytes, false);
        if r.is_err() {
            lock(&self.state).counters.failures += 1;
        }
        r
    }

    /// Lends a buffer of `bytes` as [`alloc`](Self::alloc) does, except
    /// that a region made for it is of the buffer's own size (rounded up
    /// to 2 MiB) rather than a standard region: for staging buffers that
    /// must not pin more than they hold. Such a region is kept for reuse
    /// until [`trim`](Self::trim), as other regions are.
    pub(crate) fn alloc_fitted(self: &Arc<Self>, bytes: usize) -> Result<PinnedBuf, RuntimeError> {
        let r = self.alloc_inner(bytes, true);
        if r.is_err() {
            lock(&self.state).counters.failures += 1;
        }
        r
    }

    /// Lends a buffer of `bytes` (a [`fitted`](Self::alloc_fitted) one
    /// with `fitted`); over budget, waits up to `timeout` for other
    /// buffers to be freed, then fails with the budget error. Over the
    /// machine budget, other processes' frees are polled for with a growing
    /// pause (2 to 64 ms) between looks at the state file.
    pub(crate) fn alloc_waiting(
        self: &Arc<Self>,
        bytes: usize,
        fitted: bool,
        timeout: Duration,
    ) -> Result<PinnedBuf, RuntimeError> {
        let deadline = Instant::now() + timeout;
        let mut machine_pause = Duration::from_millis(2);
        loop {
            match self.alloc_inner(bytes, fitted) {
                Err(RuntimeError::MachineBudget { .. }) if Instant::now() < deadline => {
                    self.wait_for_frees(deadline, machine_pause);
                    machine_pause = (machine_pause * 2).min(Duration::from_millis(64));
                }
                Err(RuntimeError::BudgetExceeded { .. }) if Instant::now() < deadline => {
                    // Short slices: deferred buffers become free when their
                    // events complete, which nothing signals, and a free
                    // that raced with the waiters' count signals no one.
                    self.wait_for_frees(deadline, Duration::from_millis(2));
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

    /// Waits for a free of this arena's, at most `slice` and never past
    /// `deadline`. While a thread waits, frees bypass the threads' caches
    /// and wake it.
    fn wait_for_frees(&self, deadline: Instant, slice: Duration) {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let g = lock(&self.state);
        let slice = deadline
            .saturating_duration_since(Instant::now())
            .min(slice);
        let _ = self.slow.freed.wait_timeout(g, slice);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }

    #[inline]
    fn alloc_inner(
        self: &Arc<Self>,
        bytes: usize,
        fitted: bool,
    ) -> Result<PinnedBuf, RuntimeError> {
        let bad = |problem: &str| RuntimeError::BadRequest {
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
        let (size, dedicated) = if fitted {
            let size = alloc::round_up(bytes as u64, region::HUGE_PAGE as u64);
            (size, size > self.cfg.region_bytes)
        } else {
            alloc::region_size_for(bytes as u64, self.cfg.region_bytes)
        };
        // 1 GiB hugetlb pages make every region a multiple of 1 GiB.
        let granule = self.cfg.huge_pages.granule() as u64;
        let size = alloc::round_up(size, granule);
        let fitted = alloc::round_up(bytes as u64, granule);
        let mut admitted = self.admit(bytes as u64, (size, fitted), reserved)?;
        let size = admitted.size;
        let created = Region::create(&RegionOptions {
            register_part_bytes: self.part_bytes_for(size, bytes as u64),
            ..self.region_options(&admitted, None)
        });
        let mut region = self.charged(created, size)?;
        region.charge_machine(admitted.machine.take());
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

    /// The options of a region `admitted` (mapping `shared` when given).
    fn region_options(
        &self,
        admitted: &Admitted,
        shared: Option<region::SharedFile>,
    ) -> RegionOptions {
        RegionOptions {
            node: self.node,
            size: crate::num::usize_from(admitted.size),
            cpus: self.cfg.cpus.clone(),
            populate_threads: self.cfg.populate_threads,
            register: self.cfg.register,
            off_node: self.cfg.off_node,
            pin_by_registration: admitted.pin_by_registration.clone(),
            backend: self.cfg.backend,
            huge_pages: self.cfg.huge_pages,
            register_part_bytes: 0,
            shared,
            pool_root: self.cfg.pool_root.clone(),
            fail_after: self.cfg.fail_after,
        }
    }

    /// Bytes per part of a region of `size` bytes made for a request of
    /// `bytes`: half a standard region, at most [`MAX_PART_BYTES`] (rounded
    /// up to the region's page by the region), for a standard region made
    /// for a request that fits in one part, when
    /// [`ArenaConfig::register_in_parts`] is on; 0 (one piece) otherwise.
    /// A standard region in parts serves only requests that fit in a part
    /// (the bookkeeping never places a block across two); a larger request
    /// gets a standard region in one piece, or a region of its own.
    pub(crate) fn part_bytes_for(&self, size: u64, bytes: u64) -> usize {
        let part = (self.cfg.region_bytes / 2).min(MAX_PART_BYTES);
        if self.cfg.register_in_parts && size == self.cfg.region_bytes && bytes <= part {
            part as usize
        } else {
            0
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
        let ptr = slot
            .region
            .ptr()
            .wrapping_add(crate::num::usize_from(b.offset));
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
    pub(crate) fn reclaim(&self) -> usize {
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
    pub(crate) fn trim(&self) -> u64 {
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
