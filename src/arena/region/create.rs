//! Steps 1 to 5 of [`Region::create`] for the mapped backend (see the
//! module docs of [`super`]): map, advise, bind, populate and lock,
//! register (with the placement count beside it).

use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::super::huge::{self, thp_enabled, PageKind};
use super::super::{Backend, PinnedBy, PlacedBy, RegionMethods, RuntimeError, VerifiedBy};
use super::{
    step_failed, PageCounts, Region, RegionOptions, Registration, Step, StepTimes, HUGE_PAGE,
    LAST_MAPPED, PAGE,
};
use crate::platform::numa;

/// What step 1 chose: the pages and the region's length.
struct Layout {
    pages: huge::Choice,
    len: usize,
}

impl Region {
    /// Builds a region (see the module docs for the steps).
    ///
    /// # Errors
    ///
    /// The [`RuntimeError`] of the step that failed (every earlier step is
    /// undone): [`RuntimeError::System`] naming the step,
    /// [`RuntimeError::AddressLimit`] when `mmap` runs out under
    /// `RLIMIT_AS` or `RLIMIT_DATA`, [`RuntimeError::HugePages`], [`RuntimeError::NoMemory`] when `mbind`
    /// fails, [`RuntimeError::Memlock`], [`RuntimeError::Register`] and
    /// [`RuntimeError::OffNode`].
    pub fn create(o: &RegionOptions) -> Result<Region, RuntimeError> {
        if o.backend != Backend::Mapped {
            return Self::create_by_driver(o);
        }
        let layout = Self::layout(o)?;
        let mut region = Self::map_step(o, layout)?;
        region.check_injected(o, Step::Map)?;
        region.advise_step(o)?;
        region.check_injected(o, Step::Advise)?;
        region.bind_step(o)?;
        region.check_injected(o, Step::Bind)?;
        let will_register = o.register && crate::platform::cuda::driver_version().is_ok();
        let part = o
            .register_part_bytes
            .next_multiple_of(region.methods.pages.granule());
        if part > 0 && region.len > part && o.shared.is_none() {
            return region.create_in_parts(o, part, will_register);
        }
        region.populate_step(o)?;
        region.check_injected(o, Step::Populate)?;
        region.lock_step(o, will_register)?;
        region.check_injected(o, Step::Lock)?;
        let counted = region.register_step(o, will_register)?;
        region.check_injected(o, Step::Register)?;
        region.verify(o, counted)
    }

    /// The pages and length of the region `o` asks for: the pool's or
    /// THP's choice, or 4 KiB pages of a shared file.
    fn layout(o: &RegionOptions) -> Result<Layout, RuntimeError> {
        let pages = if o.shared.is_some() {
            huge::Choice {
                kind: PageKind::Base,
                note: None,
            }
        } else {
            huge::choose(o.huge_pages, o.node, o.size, pool_root(o))?
        };
        let granule = pages.kind.granule();
        let len = o.size.div_ceil(granule).max(1) * granule;
        Ok(Layout { pages, len })
    }

    /// The error a test asked for right after `step`, if it did.
    pub(super) fn check_injected(&self, o: &RegionOptions, step: Step) -> Result<(), RuntimeError> {
        if o.fail_after == Some(step) {
            return Err(step_failed(o.node, self.len)(
                step,
                std::io::Error::other("failure injected by a test"),
            ));
        }
        Ok(())
    }

    /// Step 1: Map: hugetlb pages from the pool (aligned by the kernel); the
    /// shared file at its offset; or anonymous memory, over-asking by one
    /// huge page (to align the start) and one page (the guard pages around
    /// the region).
    fn map_step(o: &RegionOptions, layout: Layout) -> Result<Region, RuntimeError> {
        let Layout { pages, len } = layout;
        let system = step_failed(o.node, len);
        let started = Instant::now();
        let addr = match (o.shared, pages.kind.hugetlb_bytes()) {
            (Some(f), _) => {
                numa::map_shared(f.fd, len, f.offset).map_err(|e| system(Step::Map, e))? as usize
            }
            (None, Some(page)) => numa::map_hugetlb(len, page).map_err(|e| {
                hugetlb_failed(pool_root(o), o.node, len, page, "mmap(MAP_HUGETLB)", e)
            })? as usize,
            (None, None) => map_guarded(len).map_err(|e| system(Step::Map, e))?,
        };
        LAST_MAPPED.store(addr, Ordering::Relaxed);
        let mut region = Region {
            ptr: NonNull::new(addr as *mut u8).expect("mmap never returns null on success"),
            len,
            node: o.node,
            locked: false,
            registered: false,
            shared: o.shared.is_some(),
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
            machine: None,
            pid: std::process::id(),
            times: StepTimes::default(),
            threads: o.populate_threads.max(1),
            driver: None,
        };
        if region.guard() > 0 {
            // SAFETY: the page before the region and the page after it are
            // part of the mapping kept (and unmapped with it on Drop);
            // nothing lives in them.
            unsafe {
                numa::protect_none((addr - PAGE) as *mut u8, PAGE)
                    .and_then(|()| numa::protect_none((addr + len) as *mut u8, PAGE))
            }
            .map_err(|e| system(Step::Map, e))?;
        }
        region.times.map = started.elapsed();
        Ok(region)
    }

    /// Step 2: Advise: transparent huge pages (or not), and never into a forked
    /// child.
    fn advise_step(&mut self, o: &RegionOptions) -> Result<(), RuntimeError> {
        let system = step_failed(o.node, self.len);
        let started = Instant::now();
        let (addr, len) = (self.ptr.as_ptr(), self.len);
        let thp_advice = match self.methods.pages {
            PageKind::Transparent => Some(libc::MADV_HUGEPAGE),
            PageKind::Base if thp_enabled() && !self.shared => Some(libc::MADV_NOHUGEPAGE),
            _ => None,
        };
        if let Some(advice) = thp_advice {
            // SAFETY: the range is our own mapping; advice changes no data.
            unsafe { numa::advise(addr, len, advice) }.map_err(|e| system(Step::Advise, e))?;
        }
        // SAFETY: as above.
        unsafe { numa::advise(addr, len, libc::MADV_DONTFORK) }
            .map_err(|e| system(Step::Advise, e))?;
        self.times.advise = started.elapsed();
        Ok(())
    }

    /// Step 3: Bind (or, when mbind is refused, first touch in step 4).
    fn bind_step(&mut self, o: &RegionOptions) -> Result<(), RuntimeError> {
        let started = Instant::now();
        // SAFETY: the range is our own mapping.
        match unsafe { numa::mbind_node(self.ptr.as_ptr(), self.len, o.node) } {
            Ok(()) => {}
            Err(e) if numa::is_refusal(&e) => {
                self.methods.placed = PlacedBy::FirstTouch;
                self.notes.push(if o.cpus.is_empty() {
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
                return Err(RuntimeError::NoMemory {
                    node: o.node,
                    size: self.len as u64,
                    reason: "mbind(MPOL_BIND) refused it".into(),
                    source: Some(e),
                })
            }
        }
        self.times.bind = started.elapsed();
        Ok(())
    }

    /// Step 4a: Populate: every page faulted in on the node's CPUs.
    fn populate_step(&mut self, o: &RegionOptions) -> Result<(), RuntimeError> {
        let first_touch = self.methods.placed == PlacedBy::FirstTouch;
        let started = Instant::now();
        let (len, hugetlb) = (self.len, self.methods.pages.hugetlb_bytes());
        self.populate(&o.cpus, o.populate_threads, first_touch)
            .map_err(|e| match (e.raw_os_error(), hugetlb) {
                (Some(libc::EFAULT | libc::ENOMEM), Some(page)) => {
                    hugetlb_failed(pool_root(o), o.node, len, page, "faulting the pages in", e)
                }
                _ => step_failed(o.node, len)(Step::Populate, e),
            })?;
        self.times.populate = started.elapsed();
        Ok(())
    }

    /// Step 4b: Lock (or leave the pinning to registration; hugetlb pages need
    /// neither).
    fn lock_step(&mut self, o: &RegionOptions, will_register: bool) -> Result<(), RuntimeError> {
        let started = Instant::now();
        if self.methods.pages.hugetlb_bytes().is_some() {
            self.methods.pinned = PinnedBy::Hugetlb;
        } else if let Some(why) = o.pin_by_registration.as_ref().filter(|_| will_register) {
            self.methods.pinned = PinnedBy::Registration;
            self.notes.push(format!(
                "{why}: not locked, CUDA registration pins the pages"
            ));
        } else {
            // SAFETY: the range is our own mapping.
            let locked = unsafe { numa::lock(self.ptr.as_ptr(), self.len) };
            self.settle_lock(locked, will_register, o.node)?;
        }
        self.times.lock = started.elapsed();
        Ok(())
    }

    /// Step 5: Register, while another thread runs step 6's count (the pages
    /// are placed and resident; registration moves none, and the two cost
    /// about the same). Returns that count, when it ran.
    #[allow(clippy::type_complexity)]
    fn register_step(
        &mut self,
        o: &RegionOptions,
        will_register: bool,
    ) -> Result<Option<(std::io::Result<PageCounts>, Duration)>, RuntimeError> {
        let (registered, counted) = if will_register {
            let region = &*self;
            std::thread::scope(|s| {
                let counting = std::thread::Builder::new()
                    .name("numapin-verify".into())
                    .spawn_scoped(s, move || region.timed_count());
                let registered = region.register_whole(o);
                let counted = match counting {
                    Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                    Err(e) => (Err(e), Duration::ZERO),
                };
                (registered, Some(counted))
            })
        } else {
            (self.register_whole(o), None)
        };
        let (registration, took) = registered;
        self.registration = registration?;
        self.registered = self.registration == Registration::Registered;
        self.times.register = took;
        Ok(counted)
    }

    /// `cuMemHostRegister` of the whole region (or why it was skipped),
    /// timed.
    fn register_whole(&self, o: &RegionOptions) -> (Result<Registration, RuntimeError>, Duration) {
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
                    unsafe {
                        crate::platform::cuda::host_register(
                            self.ptr.as_ptr().cast(),
                            self.len,
                            flags,
                        )
                    }
                    .map(|()| Registration::Registered)
                    .map_err(|source| RuntimeError::Register {
                        node: o.node,
                        size: self.len as u64,
                        source,
                    })
                }
            }
        };
        (r, started.elapsed())
    }

    /// Settles the outcome `r` of locking the whole region: locked; or,
    /// when the memlock limit refused it and `register` will pin the pages,
    /// not locked and said so in the notes; any other failure is the error.
    pub(super) fn settle_lock(
        &mut self,
        r: std::io::Result<()>,
        register: bool,
        node: u32,
    ) -> Result<(), RuntimeError> {
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
            Err(e) => Err(RuntimeError::lock_failed(node, self.len as u64, Some(e))),
        }
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
) -> RuntimeError {
    let pool = crate::platform::hugetlb::availability(root, node, page as u64)
        .map(|a| {
            format!(
                "; the node's pool has {} free of {}, the machine's {} free with {} reserved by mappings",
                a.node.free, a.node.total, a.global.free, a.global.reserved
            )
        })
        .unwrap_or_default();
    RuntimeError::HugePages {
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

/// The root the huge page pools are read under (a test's, or `/`).
fn pool_root(o: &RegionOptions) -> &std::path::Path {
    o.pool_root.as_deref().unwrap_or(std::path::Path::new("/"))
}

/// Maps `len` bytes of anonymous memory 2 MiB-aligned with a `PROT_NONE`-to-be
/// page on each side: over-asks by one huge page and one page, then gives
/// back what lies before the front guard and after the back one. Returns
/// the region's start.
fn map_guarded(len: usize) -> std::io::Result<usize> {
    let map_len = len + HUGE_PAGE + PAGE;
    let raw = numa::map_anonymous(map_len)?;
    let start = raw as usize;
    let aligned = (start + PAGE).next_multiple_of(HUGE_PAGE);
    let head = aligned - PAGE - start;
    let tail = map_len - head - len - 2 * PAGE;
    // SAFETY: both ranges lie inside the mapping just made and are outside
    // the part kept; a failure leaves them mapped, unused.
    unsafe {
        if head > 0 {
            let _ = numa::unmap(raw, head);
        }
        if tail > 0 {
            let _ = numa::unmap((aligned + len + PAGE) as *mut u8, tail);
        }
    }
    Ok(aligned)
}
