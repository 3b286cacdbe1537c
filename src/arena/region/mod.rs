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
//!    then fails with [`RuntimeError::HugePages`]. On kernels before 5.14
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
//! the region is locked with `mlock2(MLOCK_ONFAULT)` first (hugetlb pages
//! need no lock), populate threads started once (all but two of the
//! region's, which the registering and counting threads run on) take 4 MiB
//! chunks front to back, and as each part is in, a second thread registers
//! it while counting threads check where its pages are. Each part is its
//! own registration, and CUDA refuses a copy across two, so a buffer must
//! lie inside one part ([`Region::part_bytes`]). On an H100 VM a 4 GiB
//! region took 33-44 ms per GiB in parts of 128 MiB to 1 GiB against 49 in
//! one piece, and a 16 GiB one 30 against 47 (`numapin bench --only
//! cold-pinning`): the registration, about 26 ms per GiB alone and 30
//! beside the faulting in, is what is left.
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
use std::time::Duration;

use super::huge::{HugePages, PageKind};
use super::{Backend, CgroupCap, OffNode, RegionMethods, RuntimeError, VerifiedBy};
use crate::cpulist::CpuList;
use crate::platform::numa;

mod chunks;
mod create;
mod driver;
mod parts;
mod populate;
mod verify;

pub use super::huge::{thp_enabled, HUGE_PAGE, PAGE};

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
#[cfg(feature = "measure")]
pub(crate) fn set_verify_threads(n: usize) {
    VERIFY_THREADS_NOW.store(n, Ordering::Relaxed);
}

/// Measurement hook: fault transparent and 4 KiB pages in with
/// `MADV_POPULATE_WRITE` instead of a write per page.
static POPULATE_WRITE_NOW: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Measurement hook: fault in with `MADV_POPULATE_WRITE` (`true`) or by
/// touching each page (`false`, the default) for `numapin bench --only
/// pinning` to compare them in one run.
#[cfg(feature = "measure")]
pub(crate) fn set_populate_write(on: bool) {
    POPULATE_WRITE_NOW.store(on, Ordering::Relaxed);
}

fn populate_write_forced() -> bool {
    POPULATE_WRITE_NOW.load(Ordering::Relaxed)
}

/// Measurement hook: the populate and counting threads of regions made in
/// parts (0: the rules of `chunks`).
#[cfg(feature = "measure")]
pub(crate) fn set_pipeline_threads(populate: usize, verify: usize) {
    chunks::PIPE_POPULATE_NOW.store(populate, Ordering::Relaxed);
    chunks::PIPE_VERIFY_NOW.store(verify, Ordering::Relaxed);
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
    pub off_node: OffNode,
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
    /// (rounded up to the region's page: 2 MiB, or 1 GiB for 1 GiB hugetlb
    /// pages), each as soon as its pages are in, while the populate threads
    /// fault in the next parts; 0: populate the whole region, then register
    /// it in one call. [`Backend::Mapped`] anonymous memory (not shared
    /// files). CUDA refuses a copy whose range spans two registrations, so
    /// a region in parts may only hold buffers that each lie inside one
    /// part (the arena's standard regions with `register_in_parts`).
    pub register_part_bytes: usize,
    /// Map this shared file (a memfd other processes may map too) instead
    /// of anonymous memory: the region's pages are the file's pages from
    /// `offset` on, 4 KiB pages, placed, pinned and checked by the same
    /// steps (`None`: anonymous memory).
    pub shared: Option<SharedFile>,
    /// Test hook: read the huge page pools under this root instead of `/`.
    #[doc(hidden)]
    pub pool_root: Option<std::path::PathBuf>,
    /// Test hook: fail right after this step, as if it had failed.
    #[doc(hidden)]
    pub fail_after: Option<Step>,
}

/// A shared file a region maps ([`RegionOptions::shared`]): the caller
/// keeps the descriptor open while the region is made (the mapping keeps
/// the file alive after that), and the file is at least `offset` plus the
/// region's length long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedFile {
    /// The file's descriptor.
    pub fd: std::os::fd::RawFd,
    /// Where the region starts in the file (a multiple of 4 KiB).
    pub offset: u64,
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
    /// A mapping of a shared file ([`RegionOptions::shared`]).
    shared: bool,
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
    charge: Option<(std::sync::Arc<CgroupCap>, u64)>,
    /// Its charge to the machine budget: given back when the region is
    /// dropped (after the teardown, as fields drop after `drop`).
    machine: Option<super::MachineCharge>,
    times: StepTimes,
    /// Threads that populated the region (and check its placement).
    threads: usize,
    /// Set for a driver backend: the memory is the driver's, not a mapping
    /// of ours.
    driver: Option<DriverMemory>,
    /// The process that made it. Its pages are `MADV_DONTFORK`: a forked
    /// child that drops an inherited copy (the garbage collector of a
    /// DataLoader worker, say) must not unmap the range, which the child
    /// may have mapped anew since, nor call the driver.
    pid: u32,
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
#[cfg(feature = "internals")]
#[doc(hidden)]
pub fn last_mapped_addr() -> usize {
    LAST_MAPPED.load(Ordering::Relaxed)
}

impl Region {
    /// Time each creation step took.
    pub fn times(&self) -> &StepTimes {
        &self.times
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
    /// pages and shared files (their mappings have files of their own and
    /// never merge with a neighbour).
    fn guard(&self) -> usize {
        if self.shared || self.methods.pages.hugetlb_bytes().is_some() {
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
    pub(crate) fn charge(&mut self, budget: std::sync::Arc<CgroupCap>, bytes: u64) {
        self.charge = Some((budget, bytes));
    }

    /// Charges the region to the machine budget until it is dropped.
    pub(crate) fn charge_machine(&mut self, charge: Option<super::MachineCharge>) {
        self.machine = charge;
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
/// bytes on `node`: an `mmap` refused for want of memory where the region
/// would pass an address-space or data limit is that limit's error.
fn step_failed(node: u32, len: usize) -> impl Fn(Step, std::io::Error) -> RuntimeError {
    move |step, source| {
        let limit = (step == Step::Map && source.raw_os_error() == Some(libc::ENOMEM))
            .then(|| crate::platform::sys::address_limit(len as u64))
            .flatten();
        match limit {
            Some((limit, bytes)) => RuntimeError::AddressLimit {
                node,
                size: len as u64,
                limit,
                bytes,
                source,
            },
            None => RuntimeError::System {
                node,
                size: len as u64,
                step,
                source,
            },
        }
    }
}

fn fail_after(o: &RegionOptions, step: Step) -> bool {
    o.fail_after == Some(step)
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // An inherited copy in a forked child: nothing of it is mapped
            // or registered here (see `pid`).
            std::mem::forget(self.driver.take());
            return;
        }
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

/// Baseline for measurements: `mmap` + `mlock` of `len` bytes (the kernel
/// faulting every page in serially, on whatever node the default policy
/// picks), timed, then unlocked and unmapped outside the timing.
#[cfg(feature = "measure")]
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
