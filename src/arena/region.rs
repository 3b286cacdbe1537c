//! A region: one mapping of pinned memory on one NUMA node, and the only
//! place in the arena that touches raw memory.
//!
//! [`Region::create`] runs the steps in order, each checked:
//!
//! 1. choose the pages ([`HugePages`](super::HugePages): hugetlb pages from
//!    the node's pool when asked for and, for `Auto`, when the pool has
//!    enough free pages; otherwise transparent huge pages), then `mmap`
//!    anonymous private memory. Transparent and 4 KiB pages: 2 MiB-aligned,
//!    size a multiple of 2 MiB, with a `PROT_NONE` guard page on each side
//!    so that the kernel never merges it with a neighbouring mapping (which
//!    would make its `numa_maps` counts inexact). hugetlb pages:
//!    `MAP_HUGETLB | MAP_HUGE_2MB` (or `_1GB`), size a multiple of the page,
//!    aligned to it by the kernel, no guard pages (a hugetlb mapping has a
//!    file of its own and never merges); the pool's free pages on the node
//!    are checked first, and `mmap` reserves the pages from the machine's
//!    pool (not the node's);
//! 2. `madvise(MADV_HUGEPAGE)` for transparent huge pages when THP is in
//!    `always` or `madvise` mode (`MADV_NOHUGEPAGE` for 4 KiB pages), and
//!    `madvise(MADV_DONTFORK)` always, so a forked child never shares pages
//!    a device may be reading;
//! 3. `mbind(MPOL_BIND, {node}, MPOL_MF_STRICT)`. When the call is refused
//!    (`EPERM`/`EACCES` from a seccomp profile such as Docker's default
//!    without CAP_SYS_NICE, or `ENOSYS`), the region is placed by *first
//!    touch* instead: see step 4;
//! 4. populate: every page is touched by a few threads bound to the node's
//!    CPUs (so the kernel zeroes it on the node's own cores; with first
//!    touch, so the default policy allocates it there: binding must then
//!    succeed, and a node without CPUs this process may use cannot be
//!    placed that way, which the check of step 6 judges), then `mlock`.
//!    When the caller found RLIMIT_MEMLOCK too low, or `mlock` fails for
//!    the limit, and the region will be registered with CUDA, `mlock` is
//!    skipped: registration pins the pages. hugetlb pages are faulted in
//!    with `madvise(MADV_POPULATE_WRITE)` by the same threads (one call per
//!    thread's share of whole pages, all threads released together once
//!    every one has started), which returns an error where a touch would
//!    raise `SIGBUS` (the bound node ran out of free huge pages after the
//!    check of step 1, because the kernel reserved the pages over the
//!    machine, not on the node, or another process took them): the region
//!    then fails with [`ArenaError::HugePages`]. On kernels before 5.14
//!    (no `MADV_POPULATE_WRITE`) `Auto` never takes hugetlb pages, and an
//!    explicit choice touches one byte per page after the check, so a
//!    process taking the node's free pages in between would end this one
//!    with `SIGBUS` (the region's notes say so). hugetlb pages are never
//!    swapped, and `mlock` neither locks nor counts them: they are not
//!    locked ([`PinnedBy::Hugetlb`]);
//! 5. `cuMemHostRegister(PORTABLE | DEVICEMAP)` when the CUDA driver is
//!    present (skipped, and said so, when it is not);
//! 6. verify placement: `move_pages` with a null node list tells where
//!    each 4 KiB page is (one address per hugetlb page, which lies on one
//!    node), and the pages are counted per node in 4 KiB units; when
//!    `move_pages` is refused, the same counts come from
//!    `/proc/self/numa_maps` (exact: the guards, or for hugetlb its own
//!    file, keep the region's VMAs its own; `numa_maps` counts hugetlb VMAs
//!    in huge pages, converted by their `kernelpagesize_kB`). When the region is registered, the count runs on a second
//!    thread during step 5 (each costs about 15-30 ms per GiB, measured
//!    with `numapin bench --only pinning`; one `move_pages` thread below
//!    [`VERIFY_SPLIT_BYTES`] and [`VERIFY_THREADS`] from there, since each
//!    extra thread costs a few milliseconds and more contend, and one
//!    registration call, since concurrent registrations of parts were no
//!    faster).
//!
//! With [`RegionOptions::register_part_bytes`], steps 4 to 6 run as a
//! pipeline over parts of the region instead (`Region::create_in_parts`):
//! the region is locked with `mlock2(MLOCK_ONFAULT)` first, the populate
//! threads fault in one part after the other, and as each is in, a second
//! thread registers it and a third counts where its pages are. Each part is
//! its own registration, and CUDA refuses a copy across two, so a buffer
//! must lie inside one part ([`Region::part_bytes`]).
//!
//! The driver backends ([`Backend::DriverNuma`], [`Backend::HostAllocBound`])
//! replace steps 1 to 5 with one driver allocation, then run step 6.
//!
//! Each region records how it was placed, pinned and verified
//! ([`RegionMethods`]). A failure at any step undoes the steps before it
//! (the [`Region`] value exists from step 1 on and its `Drop` is the
//! teardown): nothing stays mapped, bound, locked or registered. Teardown
//! is the reverse order: `cuMemHostUnregister`, `munlock`, `munmap`. The
//! arena drops a region only when no buffer in it is in use and no copy
//! may still read it.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use std::time::{Duration, Instant};

use super::huge::{self, HugePages, PageKind};
use super::{
    ArenaError, Backend, PinnedBy, PlacedBy, Placement, RegionMethods, SharedBudget, VerifiedBy,
};
use crate::cpulist::CpuList;
use crate::platform::{numa, numa_maps};

/// Regions are multiples of this, and aligned to it (the x86-64 and
/// aarch64-with-4K-pages huge page size).
pub const HUGE_PAGE: usize = 2 << 20;
/// The base page size placement is checked at.
pub const PAGE: usize = 4096;
/// Most threads the `move_pages` placement check runs on: it costs about
/// 15-30 ms per GiB on one thread, and more threads add a few milliseconds
/// whatever the size (`numapin bench --only pinning`, on an H100 VM: a
/// 256 MiB region checked in 5.5 ms on one thread and 11.5 on two, a 4 GiB
/// one in 89 ms on one and 49 on two or four), so regions of at least
/// [`VERIFY_SPLIT_BYTES`] are checked on two threads, smaller ones on one.
pub const VERIFY_THREADS: usize = 2;

/// Regions this large or larger are checked on [`VERIFY_THREADS`] threads.
pub const VERIFY_SPLIT_BYTES: usize = 2 << 30;

/// 0: the rule above; otherwise the threads every check runs on.
static VERIFY_THREADS_NOW: AtomicUsize = AtomicUsize::new(0);

/// Measurement hook: run the `move_pages` placement check of new regions
/// on `n` threads (0: back to the rule of [`VERIFY_THREADS`]), for
/// `numapin bench --only pinning` to compare settings in one run.
pub(crate) fn set_verify_threads(n: usize) {
    VERIFY_THREADS_NOW.store(n, Ordering::Relaxed);
}

/// Threads for the placement check of `len` bytes.
fn verify_threads(len: usize) -> usize {
    match VERIFY_THREADS_NOW.load(Ordering::Relaxed) {
        0 if len >= VERIFY_SPLIT_BYTES => VERIFY_THREADS,
        0 => 1,
        n => n,
    }
}

/// A step of region creation (for error messages and failure-injection
/// tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `mmap`.
    Map,
    /// `madvise`.
    Advise,
    /// `mbind`.
    Bind,
    /// Touching every page.
    Populate,
    /// `mlock`.
    Lock,
    /// `cuMemHostRegister`.
    Register,
    /// `move_pages` placement check.
    Verify,
}

/// How to build a region.
#[derive(Debug, Clone)]
pub struct RegionOptions {
    /// The NUMA node to bind to.
    pub node: u32,
    /// Bytes; rounded up to [`HUGE_PAGE`] (to the hugetlb page size for
    /// hugetlb pages).
    pub size: usize,
    /// The CPUs populate threads run on (empty: leave them unbound).
    pub cpus: CpuList,
    /// How many threads touch the pages (1 = serial).
    pub populate_threads: usize,
    /// Whether to register with CUDA when the driver is present.
    pub register: bool,
    /// What a page off the node means.
    pub placement: Placement,
    /// Skip `mlock` and let CUDA registration pin the pages (the caller
    /// found RLIMIT_MEMLOCK too low for the region and registration will
    /// happen); the reason, for [`Region::notes`].
    pub pin_by_registration: Option<String>,
    /// Where the memory comes from (steps 1 to 5 for [`Backend::Mapped`];
    /// one driver call for the others, then step 6).
    pub backend: Backend,
    /// Which pages to ask for ([`Backend::Mapped`] only: the driver
    /// backends' pages are the driver's).
    pub huge_pages: HugePages,
    /// Register a region larger than this in parts of this many bytes
    /// (rounded up to [`HUGE_PAGE`]), each as soon as its pages are in,
    /// while the populate threads fault in the next part; 0: populate the
    /// whole region, then register it in one call. Transparent and 4 KiB
    /// pages only ([`Backend::Mapped`]; hugetlb regions are registered in
    /// one call). Measured by `numapin bench --only pinning` and not used
    /// by the arena: CUDA refuses a copy whose range spans two
    /// registrations, so a region in parts may only hold buffers that each
    /// lie inside one part.
    pub register_part_bytes: usize,
    /// Test hook: read the huge page pools under this root instead of `/`.
    #[doc(hidden)]
    pub pool_root: Option<std::path::PathBuf>,
    /// Test hook: fail right after this step, as if it had failed.
    #[doc(hidden)]
    pub fail_after: Option<Step>,
}

/// Time each step of a region's creation took (zero for a step not run).
/// For a driver backend, `map` is the driver's allocation call. `register`
/// and `verify` run at the same time (on two threads) when the region is
/// registered, so the creation takes less than the sum; for a region made in
/// parts, `populate`, `register` and `verify` are each the sum over the
/// parts, and all three overlap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepTimes {
    /// `mmap` and the guard pages (or the driver's allocation).
    pub map: Duration,
    /// `madvise`.
    pub advise: Duration,
    /// `mbind`.
    pub bind: Duration,
    /// Touching every page.
    pub populate: Duration,
    /// `mlock`.
    pub lock: Duration,
    /// `cuMemHostRegister`.
    pub register: Duration,
    /// The placement check.
    pub verify: Duration,
}

impl StepTimes {
    /// The steps by name (`map`, `advise`, `bind`, `populate`, `lock`,
    /// `register`, `verify`), in order.
    pub fn steps(&self) -> [(&'static str, Duration); 7] {
        [
            ("map", self.map),
            ("advise", self.advise),
            ("bind", self.bind),
            ("populate", self.populate),
            ("lock", self.lock),
            ("register", self.register),
            ("verify", self.verify),
        ]
    }

    /// All steps together.
    pub fn total(&self) -> Duration {
        self.steps().iter().map(|(_, d)| *d).sum()
    }
}

/// Pinned memory a driver backend allocated (freed by its own drop).
#[derive(Debug)]
enum DriverMemory {
    Numa(crate::platform::cuda::host_numa::NumaAlloc),
    HostAlloc(crate::platform::cuda::HostAlloc),
}

/// Whether a region is registered with CUDA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// Registered (`PORTABLE | DEVICEMAP`).
    Registered,
    /// Not registered, and why (no driver, or turned off).
    Skipped(String),
}

/// A mapping of pinned memory bound to one node (see the module docs).
#[derive(Debug)]
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    node: u32,
    locked: bool,
    registered: bool,
    /// The start of each registration when the region was registered in
    /// parts (empty when it was registered in one call).
    parts: Vec<usize>,
    /// Bytes per part when it was made in parts, else 0.
    part: usize,
    registration: Registration,
    pages_on_node: u64,
    pages_off_node: u64,
    methods: RegionMethods,
    notes: Vec<String>,
    charge: Option<(std::sync::Arc<SharedBudget>, u64)>,
    times: StepTimes,
    /// Threads that populated the region (and check its placement).
    threads: usize,
    /// Set for a driver backend: the memory is the driver's, not a mapping
    /// of ours.
    driver: Option<DriverMemory>,
}

/// Where a region's 4 KiB pages are, and how that was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageCounts {
    /// How it was read.
    pub by: VerifiedBy,
    /// 4 KiB pages of the region.
    pub pages: u64,
    /// Pages present on each node, `(node, pages)`, by node number.
    pub nodes: Vec<(u32, u64)>,
    /// Pages not present, or whose node could not be read (`move_pages`
    /// reports an error for them, or `numa_maps` counts cannot place them).
    pub missing: u64,
}

impl PageCounts {
    /// Pages on `node`.
    pub fn on(&self, node: u32) -> u64 {
        self.nodes
            .iter()
            .find(|(n, _)| *n == node)
            .map_or(0, |(_, c)| *c)
    }

    /// Pages on nodes other than `node`, per node.
    pub fn elsewhere(&self, node: u32) -> Vec<(u32, u64)> {
        self.nodes
            .iter()
            .copied()
            .filter(|(n, _)| *n != node)
            .collect()
    }

    fn empty(by: VerifiedBy) -> PageCounts {
        PageCounts {
            by,
            pages: 0,
            nodes: Vec::new(),
            missing: 0,
        }
    }

    fn merge(&mut self, other: PageCounts) {
        self.pages += other.pages;
        self.missing += other.missing;
        for (n, p) in other.nodes {
            self.add(n, p);
        }
    }

    fn add(&mut self, node: u32, pages: u64) {
        match self.nodes.binary_search_by_key(&node, |(n, _)| *n) {
            Ok(i) => self.nodes[i].1 += pages,
            Err(i) => self.nodes.insert(i, (node, pages)),
        }
    }
}

// SAFETY: a Region owns its mapping outright (no aliasing handle exists
// outside it); the raw pointer is only an address. Using the memory from
// several threads is coordinated by the arena's bookkeeping.
unsafe impl Send for Region {}
// SAFETY: &Region only exposes the address and counters.
unsafe impl Sync for Region {}

static LAST_MAPPED: AtomicUsize = AtomicUsize::new(0);

/// Test hook: the address of the last region mapped by this process (to
/// check that a failed creation left nothing mapped).
#[doc(hidden)]
pub fn last_mapped_addr() -> usize {
    LAST_MAPPED.load(Ordering::Relaxed)
}

/// Whether transparent huge pages may back an `madvise(MADV_HUGEPAGE)`
/// range (mode `always` or `madvise`).
pub fn thp_enabled() -> bool {
    static MODE: OnceLock<bool> = OnceLock::new();
    *MODE.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .map(|s| s.contains("[always]") || s.contains("[madvise]"))
            .unwrap_or(false)
    })
}

impl Region {
    /// Builds a region (see the module docs for the steps).
    pub fn create(o: &RegionOptions) -> Result<Region, ArenaError> {
        if o.backend != Backend::Mapped {
            return Self::create_by_driver(o);
        }
        let root = o.pool_root.as_deref().unwrap_or(std::path::Path::new("/"));
        let pages = huge::choose(o.huge_pages, o.node, o.size, root)?;
        let granule = pages.kind.granule();
        let len = o.size.div_ceil(granule).max(1) * granule;
        let fail = |step: Step| o.fail_after == Some(step);
        let system = step_failed(o.node, len);
        let injected =
            |step: Step| system(step, std::io::Error::other("failure injected by a test"));

        // 1. Map: hugetlb pages from the pool (aligned by the kernel), or
        // over-asking by one huge page (to align the start) and one page
        // (the guard pages around the region).
        let started = Instant::now();
        let aligned = match pages.kind.hugetlb_bytes() {
            Some(page) => numa::map_hugetlb(len, page)
                .map_err(|e| hugetlb_failed(root, o.node, len, page, "mmap(MAP_HUGETLB)", e))?
                as usize,
            None => {
                let map_len = len + HUGE_PAGE + PAGE;
                let raw = numa::map_anonymous(map_len).map_err(|e| system(Step::Map, e))?;
                let start = raw as usize;
                let aligned = (start + PAGE).next_multiple_of(HUGE_PAGE);
                // Give back what lies before the front guard and after the
                // back one.
                let head = aligned - PAGE - start;
                let tail = map_len - head - len - 2 * PAGE;
                // SAFETY: both ranges lie inside the mapping just made and
                // are outside the part kept; a failure leaves them mapped,
                // unused.
                unsafe {
                    if head > 0 {
                        let _ = numa::unmap(raw, head);
                    }
                    if tail > 0 {
                        let _ = numa::unmap((aligned + len + PAGE) as *mut u8, tail);
                    }
                }
                aligned
            }
        };
        LAST_MAPPED.store(aligned, Ordering::Relaxed);
        let mut region = Region {
            ptr: NonNull::new(aligned as *mut u8).expect("mmap never returns null on success"),
            len,
            node: o.node,
            locked: false,
            registered: false,
            parts: Vec::new(),
            part: 0,
            registration: Registration::Skipped("not registered yet".into()),
            pages_on_node: 0,
            pages_off_node: 0,
            methods: RegionMethods {
                placed: PlacedBy::Mbind,
                pinned: PinnedBy::Mlock,
                verified: VerifiedBy::MovePages,
                pages: pages.kind,
            },
            notes: pages.note.into_iter().collect(),
            charge: None,
            times: StepTimes::default(),
            threads: o.populate_threads.max(1),
            driver: None,
        };
        if region.guard() > 0 {
            // SAFETY: the page before the region and the page after it are
            // part of the mapping kept (and unmapped with it on Drop);
            // nothing lives in them.
            unsafe {
                numa::protect_none((aligned - PAGE) as *mut u8, PAGE)
                    .and_then(|()| numa::protect_none((aligned + len) as *mut u8, PAGE))
            }
            .map_err(|e| system(Step::Map, e))?;
        }
        region.times.map = started.elapsed();
        if fail(Step::Map) {
            return Err(injected(Step::Map));
        }

        // 2. Advise.
        let started = Instant::now();
        let addr = region.ptr.as_ptr();
        let thp_advice = match pages.kind {
            PageKind::Transparent => Some(libc::MADV_HUGEPAGE),
            PageKind::Base if thp_enabled() => Some(libc::MADV_NOHUGEPAGE),
            _ => None,
        };
        if let Some(advice) = thp_advice {
            // SAFETY: the range is our own mapping; advice changes no data.
            unsafe { numa::advise(addr, len, advice) }.map_err(|e| system(Step::Advise, e))?;
        }
        // SAFETY: as above.
        unsafe { numa::advise(addr, len, libc::MADV_DONTFORK) }
            .map_err(|e| system(Step::Advise, e))?;
        region.times.advise = started.elapsed();
        if fail(Step::Advise) {
            return Err(injected(Step::Advise));
        }

        // 3. Bind (or, when mbind is refused, first touch in step 4).
        let started = Instant::now();
        // SAFETY: the range is our own mapping.
        match unsafe { numa::mbind_node(region.ptr.as_ptr(), len, o.node) } {
            Ok(()) => {}
            Err(e) if numa::is_refusal(&e) => {
                region.methods.placed = PlacedBy::FirstTouch;
                region.notes.push(if o.cpus.is_empty() {
                    format!(
                        "mbind refused ({}); first touch cannot place it: node {} has no CPU this process may use",
                        numa::errno_name(&e),
                        o.node
                    )
                } else {
                    format!(
                        "mbind refused ({}): touched first from CPUs {}",
                        numa::errno_name(&e),
                        o.cpus
                    )
                });
            }
            Err(e) => {
                return Err(ArenaError::NoMemory {
                    node: o.node,
                    size: len as u64,
                    reason: "mbind(MPOL_BIND) refused it".into(),
                    source: Some(e),
                })
            }
        }
        region.times.bind = started.elapsed();
        if fail(Step::Bind) {
            return Err(injected(Step::Bind));
        }

        let will_register = o.register && crate::platform::cuda::driver_version().is_ok();
        let part = o.register_part_bytes.next_multiple_of(HUGE_PAGE);
        if part > 0 && len > part && pages.kind.hugetlb_bytes().is_none() {
            return region.create_in_parts(o, part, will_register);
        }

        // 4. Populate, then lock (or leave the pinning to registration).
        let first_touch = region.methods.placed == PlacedBy::FirstTouch;
        let started = Instant::now();
        region
            .populate(&o.cpus, o.populate_threads, first_touch)
            .map_err(|e| match (e.raw_os_error(), pages.kind.hugetlb_bytes()) {
                (Some(libc::EFAULT | libc::ENOMEM), Some(page)) => {
                    hugetlb_failed(root, o.node, len, page, "faulting the pages in", e)
                }
                _ => system(Step::Populate, e),
            })?;
        region.times.populate = started.elapsed();
        if fail(Step::Populate) {
            return Err(injected(Step::Populate));
        }
        let started = Instant::now();
        if pages.kind.hugetlb_bytes().is_some() {
            region.methods.pinned = PinnedBy::Hugetlb;
        } else if let Some(why) = o.pin_by_registration.as_ref().filter(|_| will_register) {
            region.methods.pinned = PinnedBy::Registration;
            region.notes.push(format!(
                "{why}: not locked, CUDA registration pins the pages"
            ));
        } else {
            // SAFETY: the range is our own mapping.
            let locked = unsafe { numa::lock(addr, len) };
            region.settle_lock(locked, will_register, o.node)?;
        }
        region.times.lock = started.elapsed();
        if fail(Step::Lock) {
            return Err(injected(Step::Lock));
        }

        // 5. Register, while another thread runs step 6's count (the
        // pages are placed and resident; registration moves none, and the
        // two cost about the same).
        let register = || -> (Result<Registration, ArenaError>, Duration) {
            let started = Instant::now();
            let r = if !o.register {
                Ok(Registration::Skipped(
                    "registration turned off in the configuration".into(),
                ))
            } else {
                match crate::platform::cuda::driver_version() {
                    Err(e) => Ok(Registration::Skipped(e.to_string())),
                    Ok(_) => {
                        let flags = crate::platform::cuda::HOST_REGISTER_PORTABLE
                            | crate::platform::cuda::HOST_REGISTER_DEVICEMAP;
                        // SAFETY: the range stays mapped until Drop, which
                        // unregisters it first.
                        unsafe { crate::platform::cuda::host_register(addr.cast(), len, flags) }
                            .map(|()| Registration::Registered)
                            .map_err(|source| ArenaError::Register {
                                node: o.node,
                                size: len as u64,
                                source,
                            })
                    }
                }
            };
            (r, started.elapsed())
        };
        let (registered, counted) = if will_register {
            let region = &region;
            std::thread::scope(|s| {
                let counting = std::thread::Builder::new()
                    .name("numapin-verify".into())
                    .spawn_scoped(s, move || region.timed_count());
                let registered = register();
                let counted = match counting {
                    Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                    Err(e) => (Err(e), Duration::ZERO),
                };
                (registered, Some(counted))
            })
        } else {
            (register(), None)
        };
        let (registration, took) = registered;
        region.registration = registration?;
        region.registered = region.registration == Registration::Registered;
        region.times.register = took;
        if fail(Step::Register) {
            return Err(injected(Step::Register));
        }
        region.verify(o, counted)
    }

    /// Steps 4 to 6 in parts of `part` bytes: the populate threads fault in
    /// one part after the other; as each is in, a second thread registers
    /// it (with `register`), so that the kernel zeroing part k + 1 overlaps
    /// the driver pinning part k, and a third counts where its pages are.
    /// Registering only resident pages keeps the driver off the fault path,
    /// which an earlier attempt (registering the whole region while it was
    /// being populated) found four times slower.
    fn create_in_parts(
        mut self,
        o: &RegionOptions,
        part: usize,
        register: bool,
    ) -> Result<Region, ArenaError> {
        use std::sync::mpsc;
        let len = self.len;
        let system = step_failed(o.node, len);
        self.part = part;
        let base = self.ptr.as_ptr() as usize;
        let ranges: Vec<(usize, usize)> = (0..len)
            .step_by(part)
            .map(|off| (base + off, part.min(len - off)))
            .collect();
        let first_touch = self.methods.placed == PlacedBy::FirstTouch;
        // Lock the whole region before faulting it in (MLOCK_ONFAULT: each
        // page is locked as it comes in), so that nothing changes the
        // mapping while the populate threads fault in it; a kernel without
        // MLOCK_ONFAULT (before 4.4) locks it once it is in.
        let mut lock_after = false;
        if let Some(why) = o.pin_by_registration.as_ref().filter(|_| register) {
            self.methods.pinned = PinnedBy::Registration;
            self.notes.push(format!(
                "{why}: not locked, CUDA registration pins the pages"
            ));
        } else {
            let t = Instant::now();
            // SAFETY: our own mapping.
            match unsafe { numa::lock_on_fault(base as *mut u8, len) } {
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) => {
                    lock_after = true;
                }
                r => self.settle_lock(r, register, o.node)?,
            }
            self.times.lock = t.elapsed();
        }
        let flags = crate::platform::cuda::HOST_REGISTER_PORTABLE
            | crate::platform::cuda::HOST_REGISTER_DEVICEMAP;
        let started = Instant::now();
        // The parts registered so far: kept outside the threads, so that
        // Drop unregisters them whatever happens, a panic included.
        let registered = std::sync::Mutex::new(Vec::new());
        // Set when registering fails: the populate threads stop too.
        let stop = std::sync::atomic::AtomicBool::new(false);
        let this = &self;
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            std::thread::scope(|s| {
                let (registered, stop) = (&registered, &stop);
                let (to_pin, pin_rx) = mpsc::channel::<(usize, usize)>();
                let (to_count, count_rx) = mpsc::channel::<(usize, usize)>();
                // Registers each part as it comes in: the time it took, or
                // the first failure.
                let pinning = std::thread::Builder::new()
                    .name("numapin-register".into())
                    .spawn_scoped(s, move || -> Result<Duration, ArenaError> {
                        let mut took = Duration::ZERO;
                        for (a, l) in pin_rx {
                            let t = Instant::now();
                            // SAFETY: the part stays mapped until Drop,
                            // which unregisters every part in `parts` first.
                            let r = unsafe {
                                crate::platform::cuda::host_register(
                                    a as *mut libc::c_void,
                                    l,
                                    flags,
                                )
                            };
                            took += t.elapsed();
                            if let Err(source) = r {
                                stop.store(true, Ordering::Relaxed);
                                return Err(ArenaError::Register {
                                    node: o.node,
                                    size: len as u64,
                                    source,
                                });
                            }
                            registered.lock().unwrap_or_else(|p| p.into_inner()).push(a);
                        }
                        Ok(took)
                    });
                // Counts where each part's pages are as it comes in.
                let counting = std::thread::Builder::new()
                    .name("numapin-verify".into())
                    .spawn_scoped(s, move || {
                        let t = Instant::now();
                        let mut total = Ok(PageCounts::empty(VerifiedBy::MovePages));
                        for (a, l) in count_rx {
                            if let Ok(acc) = &mut total {
                                let threads = verify_threads(l).min(this.threads);
                                match this.count_range_move_pages(a, l, threads) {
                                    Ok(c) => acc.merge(c),
                                    Err(e) => total = Err(e),
                                }
                            }
                        }
                        (total, t.elapsed())
                    });
                let mut populated = Ok(Duration::ZERO);
                for &(a, l) in &ranges {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let t = Instant::now();
                    if let Err(e) =
                        this.populate_range(a, l, &o.cpus, o.populate_threads, first_touch)
                    {
                        populated = Err(system(Step::Populate, e));
                        break;
                    }
                    populated = populated.map(|d| d + t.elapsed());
                    // A thread that stopped on an error takes no more parts.
                    if register {
                        let _ = to_pin.send((a, l));
                    }
                    let _ = to_count.send((a, l));
                }
                drop(to_pin);
                drop(to_count);
                let pinned = match pinning {
                    Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                    Err(e) => Err(system(Step::Register, e)),
                };
                let counted = match counting {
                    Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                    Err(e) => (Err(e), Duration::ZERO),
                };
                (populated, pinned, counted)
            })
        }));
        let wall = started.elapsed();
        // Whatever failed (a panic included), Drop unregisters the parts
        // registered so far and unlocks what is locked.
        self.parts = registered.into_inner().unwrap_or_else(|p| p.into_inner());
        let (populated, pinned, counted) = match outcome {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        self.times.populate = populated?;
        self.times.register = pinned?;
        if fail_after(o, Step::Populate) {
            return Err(system(
                Step::Populate,
                std::io::Error::other("failure injected by a test"),
            ));
        }
        if lock_after {
            let t = Instant::now();
            // SAFETY: our own mapping.
            let locked = unsafe { numa::lock(base as *mut u8, len) };
            self.settle_lock(locked, register, o.node)?;
            self.times.lock = t.elapsed();
        }
        if fail_after(o, Step::Lock) {
            return Err(system(
                Step::Lock,
                std::io::Error::other("failure injected by a test"),
            ));
        }
        if register {
            self.registered = true;
            self.registration = Registration::Registered;
            self.notes.push(format!(
                "registered in {} parts of {} MiB while populating ({:.1} ms in all)",
                ranges.len(),
                part >> 20,
                wall.as_secs_f64() * 1e3
            ));
        } else {
            self.registration = Registration::Skipped(if o.register {
                crate::platform::cuda::driver_version()
                    .err()
                    .map_or_else(|| "no CUDA driver".into(), |e| e.to_string())
            } else {
                "registration turned off in the configuration".into()
            });
        }
        if fail_after(o, Step::Register) {
            return Err(system(
                Step::Register,
                std::io::Error::other("failure injected by a test"),
            ));
        }
        // The per-part counts from move_pages, or, when it is refused, the
        // whole region's from numa_maps.
        let counted = match counted {
            (Err(e), _) if numa::is_refusal(&e) => self.timed_count(),
            counted => counted,
        };
        self.verify(o, Some(counted))
    }

    /// Settles the outcome `r` of locking the whole region: locked; or,
    /// when the memlock limit refused it and `register` will pin the pages,
    /// not locked and said so in the notes; any other failure is the error.
    fn settle_lock(
        &mut self,
        r: std::io::Result<()>,
        register: bool,
        node: u32,
    ) -> Result<(), ArenaError> {
        match r {
            Ok(()) => {
                self.locked = true;
                Ok(())
            }
            Err(e)
                if register
                    && matches!(
                        e.raw_os_error(),
                        Some(libc::ENOMEM) | Some(libc::EPERM) | Some(libc::EAGAIN)
                    ) =>
            {
                self.methods.pinned = PinnedBy::Registration;
                self.notes.push(format!(
                    "mlock failed ({}): not locked, CUDA registration pins the pages",
                    numa::errno_name(&e)
                ));
                Ok(())
            }
            Err(e) => Err(ArenaError::lock_failed(node, self.len as u64, Some(e))),
        }
    }

    /// Counts where the pages are, timed.
    fn timed_count(&self) -> (std::io::Result<PageCounts>, Duration) {
        let started = Instant::now();
        (self.count_pages(), started.elapsed())
    }

    /// Step 6, for every backend: counts where the pages are (unless
    /// `counted` already did, beside registration) and judges it by
    /// `o.placement`.
    fn verify(
        mut self,
        o: &RegionOptions,
        counted: Option<(std::io::Result<PageCounts>, Duration)>,
    ) -> Result<Region, ArenaError> {
        let region = &mut self;
        let len = region.len;
        let system = step_failed(o.node, len);
        let (counts, took) = counted.unwrap_or_else(|| region.timed_count());
        let counts = counts.map_err(|e| system(Step::Verify, e))?;
        region.times.verify = took;
        if region.driver.is_some() && counts.missing == counts.pages {
            // The driver's mapping shows no page to move_pages or
            // numa_maps: nothing to judge.
            region.methods.verified = VerifiedBy::Unverified;
            region.notes.push(format!(
                "placement not verifiable: {} reports none of the driver's pages",
                counts.by.as_str()
            ));
            if fail_after(o, Step::Verify) {
                return Err(system(
                    Step::Verify,
                    std::io::Error::other("failure injected by a test"),
                ));
            }
            return Ok(self);
        }
        region.methods.verified = counts.by;
        let on = counts.on(o.node);
        let elsewhere = counts.elsewhere(o.node);
        let off: u64 = elsewhere.iter().map(|(_, c)| c).sum();
        region.pages_on_node = on;
        region.pages_off_node = off + counts.missing;
        if fail_after(o, Step::Verify) {
            return Err(system(
                Step::Verify,
                std::io::Error::other("failure injected by a test"),
            ));
        }
        if off + counts.missing > 0 && o.placement == Placement::Strict {
            return Err(ArenaError::Placement {
                node: o.node,
                size: len as u64,
                pages: counts.pages,
                on_node: on,
                elsewhere,
                missing: counts.missing,
                how: region.how(),
            });
        }
        Ok(self)
    }

    /// A region from a driver backend: one allocation call (timed as the
    /// `map` step), then the placement check.
    fn create_by_driver(o: &RegionOptions) -> Result<Region, ArenaError> {
        use crate::platform::cuda::{self, host_numa};
        let len = o.size.div_ceil(HUGE_PAGE).max(1) * HUGE_PAGE;
        let driver_err = |source| ArenaError::Backend {
            node: o.node,
            size: len as u64,
            backend: o.backend,
            source,
        };
        let started = Instant::now();
        let mut notes = Vec::new();
        let (memory, placed) = match o.backend {
            Backend::DriverNuma => {
                let devices: Vec<u32> = (0..cuda::device_count().map_err(driver_err)?).collect();
                let a = host_numa::NumaAlloc::new(o.node, len, &devices).map_err(driver_err)?;
                (DriverMemory::Numa(a), PlacedBy::DriverNuma)
            }
            _ => {
                let (a, refused) =
                    host_numa::host_alloc_on_node(o.node, len).map_err(driver_err)?;
                if let Some(e) = refused {
                    notes.push(format!(
                        "set_mempolicy refused ({}): cuMemHostAlloc placed the pages where the kernel chose",
                        numa::errno_name(&e)
                    ));
                }
                (DriverMemory::HostAlloc(a), PlacedBy::BindPolicy)
            }
        };
        let (ptr, got) = match &memory {
            DriverMemory::Numa(a) => (a.ptr(), a.len()),
            DriverMemory::HostAlloc(a) => (a.ptr().cast::<u8>(), a.len()),
        };
        let region = Region {
            ptr: NonNull::new(ptr).expect("the driver never returns null on success"),
            len: got,
            node: o.node,
            locked: false,
            registered: false,
            parts: Vec::new(),
            part: 0,
            registration: Registration::Registered,
            pages_on_node: 0,
            pages_off_node: 0,
            methods: RegionMethods {
                placed,
                pinned: PinnedBy::Driver,
                verified: VerifiedBy::MovePages,
                pages: PageKind::Driver,
            },
            notes,
            charge: None,
            times: StepTimes {
                map: started.elapsed(),
                ..StepTimes::default()
            },
            threads: o.populate_threads.max(1),
            driver: Some(memory),
        };
        if fail_after(o, Step::Map) {
            return Err(ArenaError::System {
                node: o.node,
                size: len as u64,
                step: Step::Map,
                source: std::io::Error::other("failure injected by a test"),
            });
        }
        region.verify(o, None)
    }

    /// Time each creation step took.
    pub fn times(&self) -> &StepTimes {
        &self.times
    }

    /// Touches every page from up to `threads` threads bound to `cpus`.
    /// With `must_bind` (first touch places the pages) a thread that cannot
    /// be bound is an error; otherwise binding is best effort (placement is
    /// mbind's job, binding only makes the zeroing run on the node's cores).
    fn populate(&self, cpus: &CpuList, threads: usize, must_bind: bool) -> std::io::Result<()> {
        self.populate_range(
            self.ptr.as_ptr() as usize,
            self.len,
            cpus,
            threads,
            must_bind,
        )
    }

    /// [`Region::populate`] of `base..base + len`, a part of the region
    /// starting and ending on a granule boundary.
    fn populate_range(
        &self,
        base: usize,
        len: usize,
        cpus: &CpuList,
        threads: usize,
        must_bind: bool,
    ) -> std::io::Result<()> {
        let granule = self.methods.pages.granule();
        let chunks = len / granule;
        let threads = threads.clamp(1, chunks);
        let per = chunks.div_ceil(threads) * granule;
        // hugetlb pages: fault them in with MADV_POPULATE_WRITE, which
        // fails where a touch would raise SIGBUS; on older kernels touch
        // one byte per huge page (the pool was checked first).
        let hugetlb = self.methods.pages.hugetlb_bytes();
        let populate_write = hugetlb.is_some() && numa::populate_write_supported();
        let step = hugetlb.unwrap_or(PAGE);
        let bind = move || -> std::io::Result<()> {
            if cpus.is_empty() {
                return Ok(());
            }
            match crate::platform::sys::sched_setaffinity(0, cpus) {
                Err(e) if must_bind => Err(std::io::Error::new(
                    e.kind(),
                    format!("binding a first-touch thread to CPUs {cpus} failed: {e}"),
                )),
                _ => Ok(()),
            }
        };
        let touch = move |from: usize, to: usize| -> std::io::Result<()> {
            if populate_write {
                // SAFETY: from..to is a slice of the region, mapped
                // writable and owned by this Region, of whole huge pages.
                return unsafe { numa::populate_write(from as *mut u8, to - from) };
            }
            let mut a = from;
            while a < to {
                // SAFETY: `a` is inside the region (from..to is a slice of
                // it), which is mapped writable and owned by this Region;
                // each thread writes its own disjoint part, before any
                // buffer is handed out.
                unsafe { std::ptr::write_volatile(a as *mut u8, 0) };
                a += step;
            }
            Ok(())
        };
        let gate = &Gate::default();
        std::thread::scope(|s| {
            let mut handles = Vec::new();
            for t in 0..threads {
                let from = base + t * per;
                let to = (from + per).min(base + len);
                if from >= to {
                    break;
                }
                // Always a thread of its own, even for one: the caller's
                // CPU set stays as it was.
                let b = std::thread::Builder::new().name("numapin-populate".into());
                let started = b.spawn_scoped(s, move || {
                    if !gate.arrive() {
                        return Ok(());
                    }
                    bind()?;
                    touch(from, to)
                });
                match started {
                    Ok(h) => handles.push(h),
                    Err(e) => {
                        gate.open(false, 0);
                        return Err(e);
                    }
                }
            }
            gate.open(true, handles.len());
            for h in handles {
                h.join()
                    .map_err(|_| std::io::Error::other("a populate thread panicked"))??;
            }
            Ok(())
        })
    }

    /// Where each 4 KiB page of the region is now: `move_pages` (moving
    /// nothing), or, when that is refused, `/proc/self/numa_maps`.
    pub fn count_pages(&self) -> std::io::Result<PageCounts> {
        match self.count_pages_move_pages() {
            Err(e) if numa::is_refusal(&e) => self.count_pages_numa_maps(),
            r => r,
        }
    }

    /// Where each 4 KiB page is, from `move_pages` with a null node list
    /// (one status per page; per hugetlb page for hugetlb pages, counted
    /// as the 4 KiB pages it holds), on one thread, or on
    /// [`VERIFY_THREADS`] for a region of [`VERIFY_SPLIT_BYTES`] or more.
    pub fn count_pages_move_pages(&self) -> std::io::Result<PageCounts> {
        self.count_pages_move_pages_on(verify_threads(self.len).min(self.threads))
    }

    /// [`Region::count_pages_move_pages`] with the region split between
    /// `threads` threads.
    pub fn count_pages_move_pages_on(&self, threads: usize) -> std::io::Result<PageCounts> {
        self.count_range_move_pages(self.ptr.as_ptr() as usize, self.len, threads)
    }

    /// [`Region::count_pages_move_pages_on`] of `base..base + len`, a part
    /// of the region starting and ending on a granule boundary.
    fn count_range_move_pages(
        &self,
        base: usize,
        len: usize,
        threads: usize,
    ) -> std::io::Result<PageCounts> {
        let granule = self.methods.pages.granule();
        let chunks = len / granule;
        let threads = threads.clamp(1, chunks.max(1));
        let per = chunks.div_ceil(threads) * granule;
        // One address per hugetlb page (it lies on one node), counted as
        // the 4 KiB pages it holds.
        let step = self.methods.pages.hugetlb_bytes().unwrap_or(PAGE);
        let each = (step / PAGE) as u64;
        let count = |from: usize, len: usize| -> std::io::Result<PageCounts> {
            let mut c = PageCounts {
                by: VerifiedBy::MovePages,
                pages: (len / PAGE) as u64,
                nodes: Vec::new(),
                missing: 0,
            };
            // SAFETY: from..from+len lies in the region, whose mapping
            // lives as long as `self`.
            unsafe {
                numa::page_nodes(from as *mut u8, len, step, |batch| {
                    for &s in batch {
                        if s >= 0 {
                            c.add(s as u32, each);
                        } else {
                            c.missing += each;
                        }
                    }
                })
            }?;
            Ok(c)
        };
        let parts: Vec<(usize, usize)> = (0..threads)
            .map(|t| (base + t * per, per.min(len.saturating_sub(t * per))))
            .filter(|(_, l)| *l > 0)
            .collect();
        let results: Vec<std::io::Result<PageCounts>> = if parts.len() == 1 {
            vec![count(parts[0].0, parts[0].1)]
        } else {
            std::thread::scope(|s| {
                let hs: Vec<_> = parts
                    .iter()
                    .map(|&(a, l)| s.spawn(move || count(a, l)))
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .collect()
            })
        };
        let mut total = PageCounts::empty(VerifiedBy::MovePages);
        for r in results {
            total.merge(r?);
        }
        Ok(total)
    }

    /// Per-node page counts of the region's own VMAs from
    /// `/proc/self/numa_maps` (exact: the guard pages, or a hugetlb
    /// mapping's own file, keep its VMAs its own; hugetlb VMAs are counted
    /// in huge pages there, converted to bytes by their page size).
    pub fn count_pages_numa_maps(&self) -> std::io::Result<PageCounts> {
        let start = self.ptr.as_ptr() as u64;
        let p = numa_maps::read_self(start..start + self.len as u64, 5)?;
        let mut c = PageCounts {
            by: VerifiedBy::NumaMaps,
            pages: (self.len / PAGE) as u64,
            nodes: Vec::new(),
            missing: 0,
        };
        // Should the counts ever be bounds, only what is certain counts as
        // on a node and the rest as unknown.
        for (&node, b) in &p.nodes {
            if b.min >= PAGE as u64 {
                c.add(node, b.min / PAGE as u64);
            }
        }
        c.missing = c.pages - c.nodes.iter().map(|(_, n)| n).sum::<u64>().min(c.pages);
        Ok(c)
    }

    /// How the region was placed, pinned and verified, and its pages.
    pub fn methods(&self) -> RegionMethods {
        self.methods
    }

    /// The pages that back it.
    pub fn page_kind(&self) -> PageKind {
        self.methods.pages
    }

    /// Bytes of `PROT_NONE` guard on each side: one page, none for hugetlb
    /// pages (their mapping never merges with a neighbour).
    fn guard(&self) -> usize {
        if self.methods.pages.hugetlb_bytes().is_some() {
            0
        } else {
            PAGE
        }
    }

    /// Why a method other than the usual one was used (`mbind refused
    /// (EPERM): placed by first touch from CPUs 0-3`), in step order.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The methods and notes in a phrase, for messages.
    fn how(&self) -> String {
        let mut s = self.methods.to_string();
        if !self.notes.is_empty() {
            s.push_str(&format!(" ({})", self.notes.join("; ")));
        }
        s
    }

    /// Charges the region's bytes to `budget` until it is dropped (the
    /// caller reserved them).
    pub(crate) fn charge(&mut self, budget: std::sync::Arc<SharedBudget>, bytes: u64) {
        self.charge = Some((budget, bytes));
    }

    /// Bytes per part of a region made (and, with a driver, registered) in
    /// parts; 0 for a region in one piece. A buffer must lie inside one
    /// part: CUDA refuses a copy whose range spans two registrations.
    pub fn part_bytes(&self) -> usize {
        self.part
    }

    /// The first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes (a multiple of [`HUGE_PAGE`], and of the hugetlb page size for
    /// hugetlb pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a region holds at least one huge page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The node it is bound to.
    pub fn node(&self) -> u32 {
        self.node
    }

    /// Whether CUDA registration succeeded.
    pub fn registered(&self) -> bool {
        self.registered
    }

    /// Registration outcome.
    pub fn registration(&self) -> &Registration {
        &self.registration
    }

    /// 4 KiB pages found on the node at creation (a hugetlb page counts as
    /// the 4 KiB pages it holds).
    pub fn pages_on_node(&self) -> u64 {
        self.pages_on_node
    }

    /// 4 KiB pages found elsewhere (or not present) at creation.
    pub fn pages_off_node(&self) -> u64 {
        self.pages_off_node
    }
}

/// The error of a step that failed with `source`, for a region of `len`
/// bytes on `node`.
fn step_failed(node: u32, len: usize) -> impl Fn(Step, std::io::Error) -> ArenaError {
    move |step, source| ArenaError::System {
        node,
        size: len as u64,
        step,
        source,
    }
}

fn fail_after(o: &RegionOptions, step: Step) -> bool {
    o.fail_after == Some(step)
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some(memory) = self.driver.take() {
            // The driver's own teardown (cuMemUnmap, cuMemAddressFree,
            // cuMemRelease; or cuMemFreeHost).
            drop(memory);
            if let Some((budget, bytes)) = self.charge.take() {
                budget.release(bytes);
            }
            return;
        }
        let addr = self.ptr.as_ptr();
        if self.registered && self.parts.is_empty() {
            // SAFETY: registered by create() at this address; the arena
            // drops a region only when no copy may still use it. A failure
            // here cannot be reported from Drop; munmap below still frees
            // the memory.
            let _ = unsafe { crate::platform::cuda::host_unregister(addr.cast()) };
        }
        for &part in &self.parts {
            // SAFETY: as above, for each part create_in_parts registered
            // (whether or not the whole region was).
            let _ = unsafe { crate::platform::cuda::host_unregister(part as *mut libc::c_void) };
        }
        if self.locked {
            // SAFETY: our own mapping. A failure cannot be reported from
            // Drop; munmap below unlocks the pages anyway.
            let _ = unsafe { numa::unlock(addr, self.len) };
        }
        let guard = self.guard();
        // SAFETY: our own mapping with its guard pages (if any), no longer
        // referenced by any buffer.
        let _ = unsafe { numa::unmap(addr.wrapping_sub(guard), self.len + 2 * guard) };
        if let Some((budget, bytes)) = self.charge.take() {
            budget.release(bytes);
        }
    }
}

/// Holds the populate threads until every one has started. A thread that
/// faults its share in with `MADV_POPULATE_WRITE` holds the process's mmap
/// lock (for reading) for the whole share, and a thread starting up maps
/// its stack and its signal stack (the lock for writing): threads let go
/// while others still start run one after another (a 1 GiB hugetlb region
/// on 16 cores of an H200 VM: 60-77 ms, against 23-25 ms with all 16
/// released once every one has started).
#[derive(Default)]
struct Gate {
    state: std::sync::Mutex<GateState>,
    changed: std::sync::Condvar,
}

#[derive(Default)]
struct GateState {
    arrived: usize,
    open: Option<bool>,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called by a started thread: counts it, then waits until the gate is
    /// opened; whether to go on (`false`: starting the others failed).
    fn arrive(&self) -> bool {
        let mut g = self.lock();
        g.arrived += 1;
        self.changed.notify_all();
        loop {
            if let Some(go) = g.open {
                return go;
            }
            g = self.changed.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Waits until `threads` threads have arrived, then lets them go on
    /// (`go`); with `go` false, at once: every thread gives up.
    fn open(&self, go: bool, threads: usize) {
        let mut g = self.lock();
        while go && g.arrived < threads {
            g = self.changed.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        g.open = Some(go);
        self.changed.notify_all();
    }
}

/// The error for hugetlb pages that `what` (`mmap`, faulting in) could not
/// get: the pool's figures read now, the system's error kept.
fn hugetlb_failed(
    root: &std::path::Path,
    node: u32,
    len: usize,
    page: usize,
    what: &str,
    e: std::io::Error,
) -> ArenaError {
    let pool = crate::platform::hugetlb::availability(root, node, page as u64)
        .map(|a| {
            format!(
                "; the node's pool has {} free of {}, the machine's {} free with {} reserved by mappings",
                a.node.free, a.node.total, a.global.free, a.global.reserved
            )
        })
        .unwrap_or_default();
    ArenaError::HugePages {
        node,
        size: len as u64,
        page_bytes: page as u64,
        needed: (len / page) as u64,
        usable: None,
        pool: None,
        problem: format!(
            "{what} failed ({}): the node could not supply the pages (taken since the pool was checked, reserved by other mappings, or outside this process's cpuset){pool}",
            numa::errno_name(&e)
        ),
        source: Some(e),
    }
}

/// Baseline for measurements: `mmap` + `mlock` of `len` bytes (the kernel
/// faulting every page in serially, on whatever node the default policy
/// picks), timed, then unlocked and unmapped outside the timing.
pub(crate) fn mmap_mlock_baseline(len: usize) -> std::io::Result<std::time::Duration> {
    let t = std::time::Instant::now();
    let p = numa::map_anonymous(len)?;
    // SAFETY: p..p+len is the mapping just made.
    let locked = unsafe { numa::lock(p, len) };
    let d = t.elapsed();
    // SAFETY: our own mapping, referenced by nothing else.
    unsafe {
        let _ = numa::unlock(p, len);
        let _ = numa::unmap(p, len);
    }
    locked.map(|()| d)
}

#[cfg(test)]
mod tests {
    use super::Gate;

    /// The gate lets threads go only once every one has arrived, and a
    /// closed gate sends them all home.
    #[test]
    fn the_populate_gate_waits_for_every_thread() {
        let gate = Gate::default();
        let went = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    if gate.arrive() {
                        went.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                });
            }
            gate.open(true, 4);
            assert_eq!(gate.lock().arrived, 4, "opened before every thread arrived");
        });
        assert_eq!(went.into_inner(), 4);
        let gate = Gate::default();
        std::thread::scope(|s| {
            let h = s.spawn(|| gate.arrive());
            gate.open(false, 0);
            assert!(!h.join().unwrap());
        });
    }
}
