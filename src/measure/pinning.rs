//! Measurements of pinning itself, for `numapin bench --only pinning`:
//! region creation per step and per backend, release, the two placement
//! checks, and CUDA registration in one call against several concurrent
//! calls on parts of a region. Figures are milliseconds per GiB.

use std::time::Instant;

use super::arena::Stats;
use super::ms_per_gib;
use crate::arena::region::{Region, RegionOptions, StepTimes};
use crate::arena::{Backend, OffNode, RegionMethods, RuntimeError};
use crate::platform::cuda;
use crate::runtime::Runtime;

/// What [`region_create`] measured.
#[derive(Debug, Clone)]
pub struct CreateFigures {
    /// Wall time of `Region::create`, ms per GiB.
    pub create: Stats,
    /// Each step's time, ms per GiB, by step name (steps that took no time
    /// in every repetition are left out).
    pub steps: Vec<(&'static str, Stats)>,
    /// Dropping the region (unregister, unlock, unmap; or the driver's
    /// free), ms per GiB.
    pub release: Stats,
    /// How the last region was placed, pinned and verified.
    pub methods: RegionMethods,
    /// 4 KiB pages of the last region, and how many were found on the node.
    pub pages: (u64, u64),
    /// Bytes of each region (rounded as the backend rounds).
    pub bytes: usize,
}

/// The options the runtime's arena on `node` would use, with `backend`.
pub(super) fn options(
    rt: &Runtime,
    node: u32,
    bytes: usize,
    backend: Backend,
) -> crate::Result<RegionOptions> {
    let arena = rt.arena(node)?;
    let cfg = arena.config().clone();
    Ok(RegionOptions {
        node,
        size: bytes,
        cpus: cfg.cpus,
        populate_threads: cfg.populate_threads,
        register: cfg.register,
        off_node: OffNode::Strict,
        pin_by_registration: None,
        backend,
        huge_pages: cfg.huge_pages,
        // As the arena makes a region of this size for a small request.
        register_part_bytes: arena.part_bytes_for(bytes as u64, 0),
        pool_root: cfg.pool_root,
        shared: None,
        fail_after: None,
    })
}

/// The threads the runtime's arena on `node` populates a region with
/// (what the figures compare other settings against).
///
/// # Errors
///
/// [`Error::Runtime`](crate::Error::Runtime) for a node without an arena
/// ([`RuntimeError::UnknownNode`], [`RuntimeError::NoMemory`]).
pub fn populate_threads(rt: &Runtime, node: u32) -> crate::Result<usize> {
    Ok(rt.arena(node)?.config().populate_threads)
}

/// Creates and drops `reps` regions of `bytes` on `node` with `backend`
/// (the runtime's other settings), timing every step and the release.
///
/// # Errors
///
/// [`Error::Runtime`](crate::Error::Runtime): a node without an arena, and the
/// region's errors ([`RuntimeError::System`] naming the step,
/// [`RuntimeError::Memlock`], [`RuntimeError::Backend`] for a driver backend,
/// ...).
pub fn region_create(
    rt: &Runtime,
    node: u32,
    bytes: usize,
    backend: Backend,
    reps: usize,
) -> crate::Result<CreateFigures> {
    let opts = options(rt, node, bytes, backend)?;
    let mut create = Vec::new();
    let mut release = Vec::new();
    let mut times: Vec<StepTimes> = Vec::new();
    let mut last = None;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let r = Region::create(&opts)?;
        create.push(ms_per_gib(t.elapsed(), r.len()));
        times.push(*r.times());
        last = Some((
            r.methods(),
            (r.len() / crate::arena::region::PAGE) as u64,
            r.pages_on_node(),
            r.len(),
        ));
        let t = Instant::now();
        let len = r.len();
        drop(r);
        release.push(ms_per_gib(t.elapsed(), len));
    }
    let (methods, pages, on, len) = last.expect("at least one repetition");
    let names = StepTimes::default().steps().map(|(n, _)| n);
    let steps = names
        .iter()
        .enumerate()
        .filter(|(i, _)| times.iter().any(|t| !t.steps()[*i].1.is_zero()))
        .map(|(i, name)| {
            let v = times
                .iter()
                .map(|t| ms_per_gib(t.steps()[i].1, len))
                .collect();
            (*name, Stats::of(v))
        })
        .collect();
    Ok(CreateFigures {
        create: Stats::of(create),
        steps,
        release: Stats::of(release),
        methods,
        pages: (pages, on),
        bytes: len,
    })
}

/// The exact placement checks of one region of `bytes` on `node`, ms per
/// GiB: `move_pages` page by page on 1, 2, 4 and the populate threads
/// (`None` when it is refused, as under Docker's default seccomp
/// profile), and the region's `numa_maps` counts (whose cost also grows
/// with the memory of every mapping below the region).
///
/// # Errors
///
/// As [`region_create`].
pub fn verify_costs(
    rt: &Runtime,
    node: u32,
    bytes: usize,
    reps: usize,
) -> crate::Result<VerifyCosts> {
    let mut opts = options(rt, node, bytes, Backend::Mapped)?;
    opts.register = false;
    let r = Region::create(&opts)?;
    let io = |source| {
        crate::Error::from(RuntimeError::System {
            node,
            size: r.len() as u64,
            step: crate::arena::Step::Verify,
            source,
        })
    };
    let mut counts: Vec<usize> = vec![1, 2, 4, opts.populate_threads.max(1)];
    counts.sort_unstable();
    counts.dedup();
    let mut samples = vec![Vec::new(); counts.len()];
    let mut nm = Vec::new();
    let mut refused = false;
    for _ in 0..reps.max(1) {
        for (i, &n) in counts.iter().enumerate() {
            let t = Instant::now();
            match r.count_pages_move_pages_on(n) {
                Ok(_) => samples[i].push(ms_per_gib(t.elapsed(), r.len())),
                Err(e) if crate::platform::numa::is_refusal(&e) => refused = true,
                Err(e) => return Err(io(e)),
            }
        }
        let t = Instant::now();
        r.count_pages_numa_maps().map_err(io)?;
        nm.push(ms_per_gib(t.elapsed(), r.len()));
    }
    Ok(VerifyCosts {
        move_pages: (!refused).then(|| {
            counts
                .into_iter()
                .zip(samples.into_iter().map(Stats::of))
                .collect()
        }),
        numa_maps: Stats::of(nm),
    })
}

/// What [`verify_costs`] measured, ms per GiB.
#[derive(Debug, Clone)]
pub struct VerifyCosts {
    /// `move_pages` by thread count (`None` when it is refused).
    pub move_pages: Option<Vec<(usize, Stats)>>,
    /// `/proc/self/numa_maps`.
    pub numa_maps: Stats,
}

/// Creates and drops one region per setting, the settings in turn, for
/// `reps` rounds (so that a VM's first, slower faults do not all land on
/// one setting), `make` making the region of a setting: per setting, the
/// creation and its placement check, ms per GiB.
fn in_turn<S: Copy>(
    settings: &[S],
    reps: usize,
    mut make: impl FnMut(S) -> crate::Result<Region>,
) -> crate::Result<Vec<(Stats, Stats)>> {
    let mut create = vec![Vec::new(); settings.len()];
    let mut verify = vec![Vec::new(); settings.len()];
    for _ in 0..reps.max(1) {
        for (i, &setting) in settings.iter().enumerate() {
            let t = Instant::now();
            let r = make(setting)?;
            create[i].push(ms_per_gib(t.elapsed(), r.len()));
            verify[i].push(ms_per_gib(r.times().verify, r.len()));
        }
    }
    Ok(create
        .into_iter()
        .zip(verify)
        .map(|(c, v)| (Stats::of(c), Stats::of(v)))
        .collect())
}

/// Region creation (the arena's settings) with the `move_pages` check on
/// each of `threads` threads, in turn in each repetition: ms per GiB of the
/// whole creation and of the check (which runs beside the registration).
///
/// # Errors
///
/// As [`region_create`].
pub fn region_create_verify_threads(
    rt: &Runtime,
    node: u32,
    bytes: usize,
    threads: &[usize],
    reps: usize,
) -> crate::Result<Vec<(usize, Stats, Stats)>> {
    /// Puts the rule back however the measurement ends.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            crate::arena::region::set_verify_threads(0);
        }
    }
    let opts = options(rt, node, bytes, Backend::Mapped)?;
    // The check never runs on more threads than the region's populate
    // threads: measure (and report) what can run.
    let cap = opts.populate_threads.max(1);
    let mut threads: Vec<usize> = threads.iter().map(|&n| n.clamp(1, cap)).collect();
    threads.dedup();
    let _reset = Reset;
    let figures = in_turn(&threads, reps, |n| {
        crate::arena::region::set_verify_threads(n);
        Ok(Region::create(&opts)?)
    })?;
    Ok(threads
        .into_iter()
        .zip(figures)
        .map(|(n, (c, v))| (n, c, v))
        .collect())
}

/// `cuMemHostRegister` of one populated, locked region of `bytes` on
/// `node` in `parts` equal parts, each registered by its own thread at
/// once, ms per GiB for the whole (unregistering is not timed). One part
/// is a single call on the whole region.
///
/// # Errors
///
/// As [`region_create`]; [`RuntimeError::Register`] when `cuMemHostRegister`
/// fails.
pub fn register_parts(
    rt: &Runtime,
    node: u32,
    bytes: usize,
    parts: usize,
    reps: usize,
) -> crate::Result<Stats> {
    let mut opts = options(rt, node, bytes, Backend::Mapped)?;
    opts.register = false;
    let r = Region::create(&opts)?;
    let parts = parts.clamp(1, r.len() / crate::arena::region::HUGE_PAGE);
    let per = (r.len() / parts).next_multiple_of(crate::arena::region::HUGE_PAGE);
    let base = r.ptr() as usize;
    let len = r.len();
    let fail = |source| {
        crate::Error::from(RuntimeError::Register {
            node,
            size: len as u64,
            source,
        })
    };
    let mut samples = Vec::new();
    for _ in 0..reps.max(1) {
        let ranges: Vec<(usize, usize)> = (0..parts)
            .map(|i| (base + i * per, per.min(base + len - (base + i * per))))
            .filter(|(_, l)| *l > 0)
            .collect();
        let t = Instant::now();
        let results: Vec<cuda::CudaResult<()>> = std::thread::scope(|s| {
            let hs: Vec<_> = ranges
                .iter()
                .map(|&(a, l)| {
                    s.spawn(move || {
                        // SAFETY: a..a+l lies in the region, mapped until
                        // it is dropped below, after every part is
                        // unregistered.
                        unsafe {
                            cuda::host_register(
                                a as *mut std::ffi::c_void,
                                l,
                                cuda::HOST_REGISTER_PORTABLE | cuda::HOST_REGISTER_DEVICEMAP,
                            )
                        }
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let d = t.elapsed();
        let mut first_err = None;
        for (&(a, _), res) in ranges.iter().zip(results) {
            match res {
                Ok(()) => {
                    // SAFETY: registered just above at this address; no
                    // copy uses it.
                    let _ = unsafe { cuda::host_unregister(a as *mut std::ffi::c_void) };
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(fail(e));
        }
        samples.push(ms_per_gib(d, len));
    }
    drop(r);
    Ok(Stats::of(samples))
}

/// Region creation with registration in parts of each of `part_bytes` (0:
/// one registration after populating), ms per GiB, the settings in turn in
/// each repetition.
///
/// # Errors
///
/// As [`region_create`].
pub fn region_create_parts(
    rt: &Runtime,
    node: u32,
    bytes: usize,
    part_bytes: &[usize],
    reps: usize,
) -> crate::Result<Vec<(usize, Stats)>> {
    let opts = options(rt, node, bytes, Backend::Mapped)?;
    let figures = in_turn(part_bytes, reps, |part| {
        Ok(Region::create(&RegionOptions {
            register_part_bytes: part,
            shared: None,
            ..opts.clone()
        })?)
    })?;
    Ok(part_bytes
        .iter()
        .copied()
        .zip(figures.into_iter().map(|(c, _)| c))
        .collect())
}

/// What [`span_copy`] measured: H2D GB/s of `bytes` from inside one
/// registered part, and from a range across two parts (or the driver's
/// refusal of that copy), and whether the data arrived intact.
#[derive(Debug, Clone)]
pub struct SpanCopy {
    /// Bytes per copy.
    pub bytes: usize,
    /// Copies of a range inside one part.
    pub inside: Stats,
    /// Copies of a range whose halves lie in two parts, or the error the
    /// driver returned for the first of them.
    pub across: Result<Stats, crate::gpu::CudaError>,
    /// Every copy that ran delivered what was copied.
    pub verified: bool,
}

/// Copies from a region registered in parts of `part` bytes: a range inside
/// the first part against one straddling the first two (synchronous
/// `cuMemcpyHtoD` of `part` bytes to GPU `gpu`).
///
/// # Errors
///
/// As [`region_create`]; [`Error::Loader`](crate::Error::Loader) naming the
/// driver call that failed (a copy across two registrations is not an error: it
/// is the figure's `across`).
pub fn span_copy(
    rt: &Runtime,
    node: u32,
    gpu: crate::CudaOrdinal,
    part: usize,
    reps: usize,
) -> crate::Result<SpanCopy> {
    let cuda_err = |e: crate::gpu::CudaError| {
        crate::Error::from(RuntimeError::Register {
            node,
            size: part as u64,
            source: e,
        })
    };
    // As the region rounds it.
    let part = part.next_multiple_of(crate::arena::region::HUGE_PAGE);
    let mut opts = options(rt, node, 4 * part, Backend::Mapped)?;
    opts.register_part_bytes = part;
    let r = Region::create(&opts)?;
    // SAFETY: the region is mapped, readable and writable for its whole
    // length, owned by `r` (alive until the end of this function), and no
    // other reference to its memory exists.
    let mem = unsafe { std::slice::from_raw_parts_mut(r.ptr(), r.len()) };
    for (i, b) in mem.iter_mut().enumerate() {
        *b = (i % 251).to_le_bytes()[0];
    }
    let _ctx = cuda::ContextGuard::push(gpu.0).map_err(cuda_err)?;
    let dev = cuda::DeviceBuffer::new(part).map_err(cuda_err)?;
    let mut back = vec![0u8; part];
    let mut verified = true;
    // One copy unmeasured (checked), then `reps` timed.
    let mut copies = |off: usize| -> Result<Stats, crate::gpu::CudaError> {
        let src = &mem[off..off + part];
        let mut v = Vec::new();
        for rep in 0..=reps.max(1) {
            let t = Instant::now();
            dev.write(src)?;
            let took = t.elapsed().as_secs_f64();
            if rep == 0 {
                dev.read(&mut back)?;
                verified &= back == src;
            } else {
                v.push(crate::num::f64_from_usize(part) / took / 1e9);
            }
        }
        Ok(Stats::of(v))
    };
    let inside = copies(0).map_err(cuda_err)?;
    let across = copies(part / 2);
    Ok(SpanCopy {
        bytes: part,
        inside,
        across,
        verified,
    })
}
