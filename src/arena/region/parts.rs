//! Steps 4 to 6 in parts ([`RegionOptions::register_part_bytes`]): the
//! populate threads fault in one part after the other while a second
//! thread registers each part as it comes in and a third counts where its
//! pages are.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::super::{PinnedBy, PlacedBy, RuntimeError, VerifiedBy};
use super::chunks::{pipeline_verify_threads, ChunkPlan};
use super::populate::{bind_populate_thread, Gate};
use super::{step_failed, PageCounts, Region, RegionOptions, Registration, Step};
use crate::platform::numa;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the pipeline's three threads came back with: the populate time,
/// the registration time, and the page counts with their time.
type Outcome = (
    Result<Duration, RuntimeError>,
    Result<Duration, RuntimeError>,
    (std::io::Result<PageCounts>, Duration),
);

/// Where a finished part goes: the registering thread (when registering)
/// and the counting threads.
type Sinks = (
    Option<mpsc::Sender<(usize, usize)>>,
    mpsc::Sender<(usize, usize)>,
);

impl Region {
    /// Steps 4 to 6 in parts of `part` bytes (a multiple of the region's
    /// page): the populate threads fault in the parts front to back; as
    /// each is in, a second thread registers it (with `register`), so that
    /// the kernel zeroing the next parts overlaps the driver pinning this
    /// one, and counting threads check where its pages are.
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
        if self.methods.pages.hugetlb_bytes().is_some() {
            // Never swapped: neither locked nor counted by mlock.
            self.methods.pinned = PinnedBy::Hugetlb;
            return Ok(false);
        }
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

    /// Runs the pipeline over `ranges` (the parts, in order): populate
    /// threads started once and released together take the region's
    /// chunks front to back from one counter, and the thread that finishes
    /// a part's last chunk hands the part to the registering thread (with
    /// `register`) and to the counting threads. Threads are not started per
    /// part (a part of 128 MiB is only a few milliseconds of work for 16
    /// threads), and the populate threads leave CPUs to the registering
    /// and counting threads ([`pipeline_populate_threads`]).
    fn pipeline(
        &self,
        o: &RegionOptions,
        ranges: &[(usize, usize)],
        register: bool,
        registered: &Mutex<Vec<usize>>,
    ) -> Outcome {
        let system = step_failed(o.node, self.len);
        // Set when a step fails: every thread stops taking work.
        let stop = AtomicBool::new(false);
        let first_touch = self.methods.placed == PlacedBy::FirstTouch;
        let plan = ChunkPlan::new(self, ranges, o.populate_threads);
        let counters = pipeline_verify_threads(self.len).min(self.threads).max(1);
        let (to_pin, pin_rx) = mpsc::channel::<(usize, usize)>();
        let (to_count, count_rx) = mpsc::channel::<(usize, usize)>();
        let count_rx = Mutex::new(count_rx);
        std::thread::scope(|s| {
            let (stop, len, count_rx) = (&stop, self.len, &count_rx);
            let pinning = std::thread::Builder::new()
                .name("numapin-register".into())
                .spawn_scoped(s, move || {
                    register_parts(pin_rx, (o.node, len), registered, stop)
                });
            let counting: Vec<_> = (0..counters)
                .map(|_| {
                    std::thread::Builder::new()
                        .name("numapin-verify".into())
                        .spawn_scoped(s, move || self.count_parts(count_rx))
                })
                .collect();
            let sinks = (register.then_some(to_pin), to_count);
            let populated = self
                .populate_pipelined(o, &plan, first_touch, sinks, stop)
                .map_err(|e| system(Step::Populate, e));
            let pinned = match pinning {
                Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                Err(e) => Err(system(Step::Register, e)),
            };
            let mut counted = (Ok(PageCounts::empty(VerifiedBy::MovePages)), Duration::ZERO);
            for h in counting {
                let (c, t) = match h {
                    Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                    Err(e) => (Err(e), Duration::ZERO),
                };
                counted.1 = counted.1.max(t);
                counted.0 = match (counted.0, c) {
                    (Ok(mut a), Ok(b)) => {
                        a.merge(b);
                        Ok(a)
                    }
                    (Err(e), _) | (_, Err(e)) => Err(e),
                };
            }
            (populated, pinned, counted)
        })
    }

    /// The populate side of [`Region::pipeline`]: `plan.threads` threads
    /// bound to the node's CPUs fault the chunks in; each finished part goes
    /// to `sinks` (the registering thread's channel, when registering, and
    /// the counting threads'). Returns the time from the threads' release to
    /// the last chunk.
    fn populate_pipelined(
        &self,
        o: &RegionOptions,
        plan: &ChunkPlan,
        must_bind: bool,
        sinks: Sinks,
        stop: &AtomicBool,
    ) -> std::io::Result<Duration> {
        let next = AtomicUsize::new(0);
        let failed: Mutex<Option<std::io::Error>> = Mutex::new(None);
        let fault = self.fault_in_fn();
        let gate = &Gate::default();
        let started = std::thread::scope(|s| {
            let mut handles = Vec::new();
            for _ in 0..plan.threads {
                let (pin, count) = (sinks.0.clone(), sinks.1.clone());
                let (next, failed, fault, cpus) = (&next, &failed, &fault, &o.cpus);
                let b = std::thread::Builder::new().name("numapin-populate".into());
                let h = b.spawn_scoped(s, move || {
                    if !gate.arrive() {
                        return;
                    }
                    let r = bind_populate_thread(cpus, must_bind).and_then(|()| {
                        plan.run(next, stop, fault, |part| {
                            if let Some(pin) = &pin {
                                let _ = pin.send(part);
                            }
                            let _ = count.send(part);
                        })
                    });
                    if let Err(e) = r {
                        stop.store(true, Ordering::Relaxed);
                        lock(failed).get_or_insert(e);
                    }
                });
                match h {
                    Ok(h) => handles.push(h),
                    Err(e) => {
                        gate.open(false, 0);
                        stop.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                }
            }
            let t = Instant::now();
            gate.open(true, handles.len());
            for h in handles {
                if h.join().is_err() {
                    stop.store(true, Ordering::Relaxed);
                    lock(&failed)
                        .get_or_insert(std::io::Error::other("a populate thread panicked"));
                }
            }
            Ok(t.elapsed())
        });
        // The senders go here: the registering and counting threads end
        // once every part sent has been taken.
        drop(sinks);
        let failure = lock(&failed).take();
        match failure {
            Some(e) => Err(e),
            None => started,
        }
    }

    /// The counting thread: where each part's pages are, as each comes in.
    /// Several such threads share `parts`; each counts the parts it takes.
    fn count_parts(
        &self,
        parts: &Mutex<mpsc::Receiver<(usize, usize)>>,
    ) -> (std::io::Result<PageCounts>, Duration) {
        let t = Instant::now();
        let mut total = Ok(PageCounts::empty(VerifiedBy::MovePages));
        loop {
            // The lock is held only while waiting for the next part.
            let Ok((a, l)) = lock(parts).recv() else {
                break;
            };
            if let Ok(acc) = &mut total {
                match self.count_range_move_pages(a, l, 1) {
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
