//! Steps 4 to 6 in parts ([`RegionOptions::register_part_bytes`]): the
//! populate threads fault in one part after the other while a second
//! thread registers each part as it comes in and a third counts where its
//! pages are.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::super::{ArenaError, PinnedBy, PlacedBy, VerifiedBy};
use super::{
    fail_after, step_failed, verify_threads, PageCounts, Region, RegionOptions, Registration, Step,
};
use crate::platform::numa;

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
}
