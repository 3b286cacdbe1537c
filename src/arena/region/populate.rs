//! Step 4's faulting in: every page touched (or, for hugetlb and shared
//! pages, populated with `MADV_POPULATE_WRITE`) by threads bound to the
//! node's CPUs, released together.

use super::{Region, PAGE};
use crate::cpulist::CpuList;
use crate::platform::numa;

impl Region {
    /// Touches every page from up to `threads` threads bound to `cpus`.
    /// With `must_bind` (first touch places the pages) a thread that cannot
    /// be bound is an error; otherwise binding is best effort (placement is
    /// mbind's job, binding only makes the zeroing run on the node's cores).
    pub(super) fn populate(
        &self,
        cpus: &CpuList,
        threads: usize,
        must_bind: bool,
    ) -> std::io::Result<()> {
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
    pub(super) fn populate_range(
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
        let touch = self.fault_in_fn();
        let touch = &touch;
        let bind = move || bind_populate_thread(cpus, must_bind);
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
}

impl Region {
    /// What faults in `from..to` (a slice of the region of whole pages of
    /// its kind): `MADV_POPULATE_WRITE` for hugetlb pages (which fails
    /// where a touch would raise `SIGBUS`; on older kernels one byte per
    /// huge page is touched, the pool was checked first) and for the pages
    /// of a shared file (one call per share instead of a fault per 4 KiB
    /// page); a write of one byte per page otherwise, or, with the
    /// measurement hook [`super::set_populate_write`], the same call.
    pub(super) fn fault_in_fn(&self) -> impl Fn(usize, usize) -> std::io::Result<()> + Sync {
        let hugetlb = self.methods.pages.hugetlb_bytes();
        let populate_write = (hugetlb.is_some() || self.shared || super::populate_write_forced())
            && numa::populate_write_supported();
        let step = hugetlb.unwrap_or(PAGE);
        move |from: usize, to: usize| -> std::io::Result<()> {
            if populate_write {
                // SAFETY: from..to is a slice of the region, mapped
                // writable and owned by this Region, of whole pages.
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
        }
    }
}

/// Binds a populate thread to `cpus` (none: left unbound). With
/// `must_bind` (first touch places the pages) a failure is an error;
/// otherwise binding is best effort (placement is mbind's job, binding only
/// makes the zeroing run on the node's cores).
pub(super) fn bind_populate_thread(cpus: &CpuList, must_bind: bool) -> std::io::Result<()> {
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
}

/// Holds the populate threads until every one has started. A thread that
/// faults its share in with `MADV_POPULATE_WRITE` holds the process's mmap
/// lock (for reading) for the whole share, and a thread starting up maps
/// its stack and its signal stack (the lock for writing): threads let go
/// while others still start run one after another (a 1 GiB hugetlb region
/// on 16 cores of an H200 VM: 60-77 ms, against 23-25 ms with all 16
/// released once every one has started).
#[derive(Default)]
pub(super) struct Gate {
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
    pub(super) fn arrive(&self) -> bool {
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
    pub(super) fn open(&self, go: bool, threads: usize) {
        let mut g = self.lock();
        while go && g.arrived < threads {
            g = self.changed.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        g.open = Some(go);
        self.changed.notify_all();
    }
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
