//! Steps 4 to 6 in parts ([`RegionOptions::register_part_bytes`]): the
//! populate threads fault in one part after the other while a second
//! thread registers each part as it comes in and a third counts where its
//! pages are.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::super::{PinnedBy, PlacedBy, RuntimeError, VerifiedBy};
use super::{step_failed, verify_threads, PageCounts, Region, RegionOptions, Registration, Step};
use crate::platform::numa;

/// What the pipeline's three threads came back with: the populate time,
/// the registration time, and the page counts with their time.
type Outcome = (
    Result<Duration, RuntimeError>,
    Result<Duration, RuntimeError>,
    (std::io::Result<PageCounts>, Duration),
);

impl Region {
    /// Steps 4 to 6 in parts of `part` bytes: the populate threads fault in
    /// one part after the other; as each is in, a second thread registers
    /// it (with `register`), so that the kernel zeroing part k + 1 overlaps
    /// the driver pinning part k, and a third counts where its pages are.
    /// Registering only resident pages keeps the driver off the fault path,
    /// which an earlier attempt (registering the whole region while it was
    /// being populated) found four times slower.
    pub(super) fn create_in_parts(
        mut self,
        o: &RegionOptions,
        part: usize,
        register: bool,
    ) -> Result<Region, RuntimeError> {
        self.part = part;
        let base = self.ptr.as_ptr() as usize;
        let ranges: Vec<(usize, usize)> = (0..self.len)
            .step_by(part)
            .map(|off| (base + off, part.min(self.len - off)))
            .collect();
        let lock_after = self.lock_on_fault(o, register)?;
        let started = Instant::now();
        // The parts registered so far: kept outside the threads, so that
        // Drop unregisters them whatever happens, a panic included.
        let registered = Mutex::new(Vec::new());
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.pipeline(o, &ranges, register, &registered)
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
        self.check_injected(o, Step::Populate)?;
        if lock_after {
            let t = Instant::now();
            // SAFETY: our own mapping.
            let locked = unsafe { numa::lock(base as *mut u8, self.len) };
            self.settle_lock(locked, register, o.node)?;
            self.times.lock = t.elapsed();
        }
        self.check_injected(o, Step::Lock)?;
        self.note_parts(o, register, ranges.len(), wall);
        self.check_injected(o, Step::Register)?;
        // The per-part counts from move_pages, or, when it is refused, the
        // whole region's from numa_maps.
        let counted = match counted {
            (Err(e), _) if numa::is_refusal(&e) => self.timed_count(),
            counted => counted,
        };
        self.verify(o, Some(counted))
    }

    /// Locks the whole region before it is faulted in (MLOCK_ONFAULT: each
    /// page is locked as it comes in), so that nothing changes the mapping
    /// while the populate threads fault in it, or leaves the pinning to
    /// registration. Returns whether to lock once the region is in (a
    /// kernel without MLOCK_ONFAULT, before 4.4).
    fn lock_on_fault(&mut self, o: &RegionOptions, register: bool) -> Result<bool, RuntimeError> {
        if let Some(why) = o.pin_by_registration.as_ref().filter(|_| register) {
            self.methods.pinned = PinnedBy::Registration;
            self.notes.push(format!(
                "{why}: not locked, CUDA registration pins the pages"
            ));
            return Ok(false);
        }
        let t = Instant::now();
        // SAFETY: our own mapping.
        let lock_after = match unsafe { numa::lock_on_fault(self.ptr.as_ptr(), self.len) } {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) => true,
            r => {
                self.settle_lock(r, register, o.node)?;
                false
            }
        };
        self.times.lock = t.elapsed();
        Ok(lock_after)
    }

    /// Runs the three threads over `ranges`: this one populates each part
    /// in turn and hands it to the registering thread (with `register`) and
    /// the counting thread.
    fn pipeline(
        &self,
        o: &RegionOptions,
        ranges: &[(usize, usize)],
        register: bool,
        registered: &Mutex<Vec<usize>>,
    ) -> Outcome {
        let system = step_failed(o.node, self.len);
        // Set when registering fails: the populate threads stop too.
        let stop = AtomicBool::new(false);
        let first_touch = self.methods.placed == PlacedBy::FirstTouch;
        std::thread::scope(|s| {
            let (to_pin, pin_rx) = mpsc::channel::<(usize, usize)>();
            let (to_count, count_rx) = mpsc::channel::<(usize, usize)>();
            let (stop, len) = (&stop, self.len);
            let pinning = std::thread::Builder::new()
                .name("numapin-register".into())
                .spawn_scoped(s, move || {
                    register_parts(pin_rx, (o.node, len), registered, stop)
                });
            let counting = std::thread::Builder::new()
                .name("numapin-verify".into())
                .spawn_scoped(s, move || self.count_parts(count_rx));
            let mut populated = Ok(Duration::ZERO);
            for &(a, l) in ranges {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let t = Instant::now();
                if let Err(e) = self.populate_range(a, l, &o.cpus, o.populate_threads, first_touch)
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
            drop((to_pin, to_count));
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
    }

    /// The counting thread: where each part's pages are, as each comes in.
    fn count_parts(
        &self,
        parts: mpsc::Receiver<(usize, usize)>,
    ) -> (std::io::Result<PageCounts>, Duration) {
        let t = Instant::now();
        let mut total = Ok(PageCounts::empty(VerifiedBy::MovePages));
        for (a, l) in parts {
            if let Ok(acc) = &mut total {
                let threads = verify_threads(l).min(self.threads);
                match self.count_range_move_pages(a, l, threads) {
                    Ok(c) => acc.merge(c),
                    Err(e) => total = Err(e),
                }
            }
        }
        (total, t.elapsed())
    }

    /// Records how the region was registered (in how many parts, how long
    /// the pipeline took), or why it was not.
    fn note_parts(&mut self, o: &RegionOptions, register: bool, parts: usize, wall: Duration) {
        if register {
            self.registered = true;
            self.registration = Registration::Registered;
            self.notes.push(format!(
                "registered in {parts} parts of {} MiB while populating ({:.1} ms in all)",
                self.part >> 20,
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
    }
}

/// The registering thread: registers each part as it comes in, keeping
/// the registered ones in `registered`; the time it took, or the first
/// failure (which sets `stop`). `(node, len)` name the region in errors.
fn register_parts(
    parts: mpsc::Receiver<(usize, usize)>,
    (node, len): (u32, usize),
    registered: &Mutex<Vec<usize>>,
    stop: &AtomicBool,
) -> Result<Duration, RuntimeError> {
    let flags = crate::platform::cuda::HOST_REGISTER_PORTABLE
        | crate::platform::cuda::HOST_REGISTER_DEVICEMAP;
    let mut took = Duration::ZERO;
    for (a, l) in parts {
        let t = Instant::now();
        // SAFETY: the part stays mapped until Drop, which unregisters every
        // part in `parts` first.
        let r = unsafe { crate::platform::cuda::host_register(a as *mut libc::c_void, l, flags) };
        took += t.elapsed();
        if let Err(source) = r {
            stop.store(true, Ordering::Relaxed);
            return Err(RuntimeError::Register {
                node,
                size: len as u64,
                source,
            });
        }
        registered.lock().unwrap_or_else(|p| p.into_inner()).push(a);
    }
    Ok(took)
}
