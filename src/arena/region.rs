//! A region: one mapping of pinned memory on one NUMA node, and the only
//! place in the arena that touches raw memory.
//!
//! [`Region::create`] runs the steps in order, each checked:
//!
//! 1. `mmap` anonymous private memory (2 MiB-aligned, size a multiple of
//!    2 MiB);
//! 2. `madvise(MADV_HUGEPAGE)` when transparent huge pages are in `always`
//!    or `madvise` mode, and `madvise(MADV_DONTFORK)` always, so a forked
//!    child never shares pages a device may be reading;
//! 3. `mbind(MPOL_BIND, {node}, MPOL_MF_STRICT)`;
//! 4. populate: every page is touched by a few threads bound to the node's
//!    CPUs (so the kernel zeroes it on the node's own cores), then `mlock`;
//! 5. `cuMemHostRegister(PORTABLE | DEVICEMAP)` when the CUDA driver is
//!    present (skipped, and said so, when it is not);
//! 6. verify placement: `move_pages` with a null node list tells where
//!    each 4 KiB page is, and the pages are counted per node.
//!
//! A failure at any step undoes the steps before it (the [`Region`] value
//! exists from step 1 on and its `Drop` is the teardown): nothing stays
//! mapped, bound, locked or registered. Teardown is the reverse order:
//! `cuMemHostUnregister`, `munlock`, `munmap`. The arena drops a region only
//! when no buffer in it is in use and no copy may still read it.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::{ArenaError, Placement};
use crate::cpulist::CpuList;
use crate::platform::numa;

/// Regions are multiples of this, and aligned to it (the x86-64 and
/// aarch64-with-4K-pages huge page size).
pub const HUGE_PAGE: usize = 2 << 20;
/// The base page size placement is checked at.
pub const PAGE: usize = 4096;

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
    /// Bytes; rounded up to [`HUGE_PAGE`].
    pub size: usize,
    /// The CPUs populate threads run on (empty: leave them unbound).
    pub cpus: CpuList,
    /// How many threads touch the pages (1 = serial).
    pub populate_threads: usize,
    /// Whether to register with CUDA when the driver is present.
    pub register: bool,
    /// What a page off the node means.
    pub placement: Placement,
    /// Test hook: fail right after this step, as if it had failed.
    #[doc(hidden)]
    pub fail_after: Option<Step>,
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
    registration: Registration,
    pages_on_node: u64,
    pages_off_node: u64,
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
        let len = o.size.div_ceil(HUGE_PAGE).max(1) * HUGE_PAGE;
        let fail = |step: Step| o.fail_after == Some(step);
        let system = |step: Step, source: std::io::Error| ArenaError::System {
            node: o.node,
            size: len as u64,
            step,
            source,
        };
        let injected =
            |step: Step| system(step, std::io::Error::other("failure injected by a test"));

        // 1. Map, over-asking by one huge page to align the start.
        let map_len = len + HUGE_PAGE;
        let raw = numa::map_anonymous(map_len).map_err(|e| system(Step::Map, e))?;
        let start = raw as usize;
        let aligned = start.next_multiple_of(HUGE_PAGE);
        // Give back the unaligned head and the tail beyond `len`.
        let head = aligned - start;
        let tail = map_len - head - len;
        // SAFETY: both ranges lie inside the mapping just made and are
        // outside the part kept; a failure leaves them mapped, unused.
        unsafe {
            if head > 0 {
                let _ = numa::unmap(raw, head);
            }
            if tail > 0 {
                let _ = numa::unmap((aligned + len) as *mut u8, tail);
            }
        }
        LAST_MAPPED.store(aligned, Ordering::Relaxed);
        let mut region = Region {
            ptr: NonNull::new(aligned as *mut u8).expect("mmap never returns null on success"),
            len,
            node: o.node,
            locked: false,
            registered: false,
            registration: Registration::Skipped("not registered yet".into()),
            pages_on_node: 0,
            pages_off_node: 0,
        };
        if fail(Step::Map) {
            return Err(injected(Step::Map));
        }

        // 2. Advise.
        let addr = region.ptr.as_ptr();
        if thp_enabled() {
            // SAFETY: the range is our own mapping; advice changes no data.
            unsafe { numa::advise(addr, len, libc::MADV_HUGEPAGE) }
                .map_err(|e| system(Step::Advise, e))?;
        }
        // SAFETY: as above.
        unsafe { numa::advise(addr, len, libc::MADV_DONTFORK) }
            .map_err(|e| system(Step::Advise, e))?;
        if fail(Step::Advise) {
            return Err(injected(Step::Advise));
        }

        // 3. Bind.
        // SAFETY: the range is our own mapping.
        if let Err(e) = unsafe { numa::mbind_node(region.ptr.as_ptr(), len, o.node) } {
            return Err(ArenaError::NoMemory {
                node: o.node,
                size: len as u64,
                reason: "mbind(MPOL_BIND) refused it".into(),
                source: Some(e),
            });
        }
        if fail(Step::Bind) {
            return Err(injected(Step::Bind));
        }

        // 4. Populate, then lock.
        region
            .populate(&o.cpus, o.populate_threads)
            .map_err(|e| system(Step::Populate, e))?;
        if fail(Step::Populate) {
            return Err(injected(Step::Populate));
        }
        // SAFETY: the range is our own mapping.
        if let Err(e) = unsafe { numa::lock(addr, len) } {
            return Err(ArenaError::lock_failed(o.node, len as u64, Some(e)));
        }
        region.locked = true;
        if fail(Step::Lock) {
            return Err(injected(Step::Lock));
        }

        // 5. Register.
        region.registration = if !o.register {
            Registration::Skipped("registration turned off in the configuration".into())
        } else {
            match crate::platform::cuda::driver_version() {
                Err(e) => Registration::Skipped(e.to_string()),
                Ok(_) => {
                    let flags = crate::platform::cuda::HOST_REGISTER_PORTABLE
                        | crate::platform::cuda::HOST_REGISTER_DEVICEMAP;
                    // SAFETY: the range stays mapped until Drop, which
                    // unregisters it first.
                    match unsafe { crate::platform::cuda::host_register(addr.cast(), len, flags) } {
                        Ok(()) => {
                            region.registered = true;
                            Registration::Registered
                        }
                        Err(source) => {
                            return Err(ArenaError::Register {
                                node: o.node,
                                size: len as u64,
                                source,
                            })
                        }
                    }
                }
            }
        };
        if fail(Step::Register) {
            return Err(injected(Step::Register));
        }

        // 6. Verify.
        let (mut on, mut off, mut missing) = (0u64, 0u64, 0u64);
        let mut elsewhere: Vec<(u32, u64)> = Vec::new();
        // SAFETY: the range is mapped (and locked) for the whole call.
        unsafe {
            numa::page_nodes(region.ptr.as_ptr(), len, PAGE, |batch| {
                for &s in batch {
                    if s == o.node as i32 {
                        on += 1;
                    } else if s >= 0 {
                        off += 1;
                        match elsewhere.iter_mut().find(|(n, _)| *n == s as u32) {
                            Some((_, c)) => *c += 1,
                            None => elsewhere.push((s as u32, 1)),
                        }
                    } else {
                        missing += 1;
                    }
                }
            })
        }
        .map_err(|e| system(Step::Verify, e))?;
        region.pages_on_node = on;
        region.pages_off_node = off + missing;
        if fail(Step::Verify) {
            return Err(injected(Step::Verify));
        }
        if off + missing > 0 && o.placement == Placement::Strict {
            return Err(ArenaError::Placement {
                node: o.node,
                size: len as u64,
                pages: on + off + missing,
                on_node: on,
                elsewhere,
                missing,
            });
        }
        Ok(region)
    }

    /// Touches every page from up to `threads` threads bound to `cpus`.
    fn populate(&self, cpus: &CpuList, threads: usize) -> std::io::Result<()> {
        let base = self.ptr.as_ptr() as usize;
        let chunks = self.len / HUGE_PAGE;
        let threads = threads.clamp(1, chunks);
        let per = chunks.div_ceil(threads) * HUGE_PAGE;
        let touch = move |from: usize, to: usize| {
            let mut a = from;
            while a < to {
                // SAFETY: `a` is inside the region (from..to is a slice of
                // it), which is mapped writable and owned by this Region;
                // each thread writes its own disjoint part, before any
                // buffer is handed out.
                unsafe { std::ptr::write_volatile(a as *mut u8, 0) };
                a += PAGE;
            }
        };
        if threads == 1 {
            let _restore = bind_thread(cpus);
            touch(base, base + self.len);
            return Ok(());
        }
        std::thread::scope(|s| {
            let mut handles = Vec::new();
            for t in 0..threads {
                let from = base + t * per;
                let to = (from + per).min(base + self.len);
                if from >= to {
                    break;
                }
                let b = std::thread::Builder::new().name("numapin-populate".into());
                handles.push(b.spawn_scoped(s, move || {
                    if !cpus.is_empty() {
                        // Best effort: placement is mbind's job; binding
                        // only makes the zeroing run on the node's cores.
                        let _ = crate::platform::sys::sched_setaffinity(0, cpus);
                    }
                    touch(from, to)
                })?);
            }
            for h in handles {
                h.join()
                    .map_err(|_| std::io::Error::other("a populate thread panicked"))?;
            }
            Ok(())
        })
    }

    /// The first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes (a multiple of [`HUGE_PAGE`]).
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

    /// Reads where each 4 KiB page of the region is now (`move_pages`,
    /// moving nothing): `visit` gets batches of node numbers, or negative
    /// errnos for pages that report one, in address order.
    pub fn read_placement(&self, visit: impl FnMut(&[i32])) -> std::io::Result<()> {
        // SAFETY: the region's mapping lives as long as `self`.
        unsafe { numa::page_nodes(self.ptr.as_ptr(), self.len, PAGE, visit) }
    }

    /// 4 KiB pages found on the node at creation.
    pub fn pages_on_node(&self) -> u64 {
        self.pages_on_node
    }

    /// 4 KiB pages found elsewhere (or not present) at creation.
    pub fn pages_off_node(&self) -> u64 {
        self.pages_off_node
    }
}

/// Binds the calling thread to `cpus` for the guard's life (no-op for an
/// empty set or a refused call).
fn bind_thread(cpus: &CpuList) -> Option<impl Drop> {
    struct Restore(CpuList);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = crate::platform::sys::sched_setaffinity(0, &self.0);
        }
    }
    if cpus.is_empty() {
        return None;
    }
    let old = crate::platform::sys::sched_getaffinity_self().ok()?;
    crate::platform::sys::sched_setaffinity(0, cpus).ok()?;
    Some(Restore(old))
}

impl Drop for Region {
    fn drop(&mut self) {
        let addr = self.ptr.as_ptr();
        if self.registered {
            // SAFETY: registered by create() at this address; the arena
            // drops a region only when no copy may still use it. A failure
            // here cannot be reported from Drop; munmap below still frees
            // the memory.
            let _ = unsafe { crate::platform::cuda::host_unregister(addr.cast()) };
        }
        if self.locked {
            // SAFETY: our own mapping. A failure cannot be reported from
            // Drop; munmap below unlocks the pages anyway.
            let _ = unsafe { numa::unlock(addr, self.len) };
        }
        // SAFETY: our own mapping, no longer referenced by any buffer.
        let _ = unsafe { numa::unmap(addr, self.len) };
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
