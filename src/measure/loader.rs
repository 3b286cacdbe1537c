//! Measurements of loaders and staged copies, for `numapin bench` and
//! `examples/loader_gpu.rs`, each with its same-run baseline:
//!
//! * [`loader_gbps`]: delivered GB/s of a loader (host or GPU mode), every
//!   byte checked (`verified`): on the GPU by the checksum kernel queued on
//!   the consumer's stream after each batch (part of the consumer's work,
//!   about 1/50 of a batch's copy time), in host mode by the consumer
//!   reading every byte. Optionally with a busy-wait kernel running on
//!   another stream the whole time, timed per launch ([`spin_kernel_ms`]
//!   is the same kernel alone).
//! * [`loader_gbps_all`]: one loader per GPU at once, aggregate GB/s.
//! * [`pinned_copy_gbps`]: the bare `cuMemcpyHtoDAsync` loop from an arena
//!   buffer, the loader's ceiling.
//! * [`staged_gbps`] against [`pageable_gbps`] (the driver's own copy from
//!   a plain `Vec`), both directions, each verified by a round trip.
//!
//! GB/s are 10^9 bytes per second. Copies and loaders on the GPU are timed
//! with CUDA events; the blocking staged and pageable copies (and host
//! mode) with the host clock around each call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

pub use super::arena::Stats;
use crate::error::{Error, Result};
use crate::gpu::{CudaError, CudaOrdinal};
use crate::loader::{Loader, LoaderConfig, LoaderError, Target};
use crate::num::{f64_from, usize_from};
use crate::platform::cuda::{self, ContextGuard, DeviceBuffer, Event, Stream};
use crate::runtime::Runtime;
use crate::staged::StagedOptions;

use super::kernels::{
    batch_key, checksum_host, fill_pattern, fill_pattern_cached, pattern_checksum,
    pattern_sample_ok, pattern_tail_ok, Kernels,
};

const MIB: usize = 1 << 20;
/// Words between the words a sampled check reads (16 KiB).
const SAMPLE_STRIDE_WORDS: usize = 4096;
/// Length of one busy-wait kernel launch.
pub const SPIN_MS: f64 = 10.0;
/// Fraction of the SMs the busy-wait kernel occupies (one block each).
pub const SPIN_SM_FRACTION: f64 = 1.0;

/// Where a loader delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Mode {
    /// Host mode on the calling thread's node.
    Host,
    /// To the GPU with this CUDA ordinal.
    Gpu(CudaOrdinal),
}

impl Mode {
    /// `"host"` or `"gpu"`.
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Host => "host",
            Mode::Gpu(_) => "gpu",
        }
    }
}

/// What the producer costs per batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum Cost {
    /// Fill the batch with the check pattern: memory-bound, one store per
    /// 4 bytes.
    #[default]
    Fill,
    /// [`Fill`](Self::Fill) with ordinary stores instead of streaming
    /// ones: the end of each batch is still in the cache when the copy
    /// engine reads it, if the cache is large enough.
    FillCached,
    /// Write nothing (the slot keeps what it held): the pipeline's own
    /// ceiling, with no producer cost. Such a run is never `verified`.
    Nothing,
    /// Fill, then keep the CPU busy this many nanoseconds per MiB (a
    /// producer that decodes or augments).
    Busy {
        /// Busy time per MiB of batch.
        ns_per_mib: u64,
    },
}

/// A loader measurement.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LoaderBench {
    /// Bytes per batch (default 64 MiB).
    pub batch_bytes: usize,
    /// Batches timed per repetition (default 64).
    pub batches: u64,
    /// Batches delivered before the clock starts (default 4, at least 1).
    pub warmup: u64,
    /// Workers (0: the loader's default).
    pub workers: usize,
    /// Pinned slots (0: the loader's default).
    pub depth: usize,
    /// Device buffers (0: the loader's default).
    pub ring: usize,
    /// Repetitions, each a fresh loader (default 3).
    pub reps: usize,
    /// The producer's cost.
    pub cost: Cost,
    /// Whether a busy-wait kernel runs on another stream meanwhile.
    pub spin_kernel: bool,
    /// Host mode: check one word per 16 KiB of each batch (and its end)
    /// instead of every byte. The full check is one thread reading every
    /// batch (about 3 GB/s): measuring the producers alone, it would time
    /// the check, not them.
    pub sampled_check: bool,
}

impl Default for LoaderBench {
    fn default() -> Self {
        LoaderBench {
            batch_bytes: 64 * MIB,
            batches: 64,
            warmup: 4,
            workers: 0,
            depth: 0,
            ring: 0,
            reps: 3,
            cost: Cost::Fill,
            spin_kernel: false,
            sampled_check: false,
        }
    }
}

/// What [`loader_gbps`] found.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LoaderFigure {
    /// `"host"` or `"gpu"`.
    pub mode: &'static str,
    /// Delivered GB/s over the repetitions.
    pub gbps: Stats,
    /// Whether every byte of every batch (warm-up included) was checked
    /// and right.
    pub verified: bool,
    /// Workers used.
    pub workers: usize,
    /// Milliseconds per busy-wait kernel while the loader ran, when
    /// [`LoaderBench::spin_kernel`].
    pub kernel_ms: Option<Stats>,
}

/// What [`loader_gbps_all`] found.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AggregateFigure {
    /// Sum of the timed bytes of every GPU over the host-clock span from
    /// the first GPU's start to the last one's end, per repetition.
    pub gbps: Stats,
    /// Each GPU's own figure, by the order of the ordinals given.
    pub per_gpu: Vec<LoaderFigure>,
    /// Whether every GPU verified every byte.
    pub verified: bool,
}

/// What [`staged_gbps`] and [`pageable_gbps`] found.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CopyFigure {
    /// GB/s over the repetitions.
    pub gbps: Stats,
    /// Whether the data came through intact (a round trip compared).
    pub verified: bool,
}

/// Copy direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Direction {
    /// Host to device.
    ToDevice,
    /// Device to host.
    FromDevice,
}

fn cuda_err(gpu: CudaOrdinal, what: &'static str) -> impl Fn(CudaError) -> Error {
    move |e| {
        LoaderError::setup(
            format!("measuring on GPU {gpu}: {what}"),
            "check the GPU (`nvidia-smi`) and that the NVIDIA driver is loaded",
            e,
        )
        .into()
    }
}

fn gbps(bytes: u64, seconds: f64) -> f64 {
    f64_from(bytes) / seconds.max(1e-12) / 1e9
}

fn busy(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

fn producer(
    cost: Cost,
) -> impl Fn(u64, &mut [u8]) -> std::result::Result<usize, String> + Send + Sync {
    move |i, s| {
        if cost == Cost::Nothing {
            return Ok(s.len());
        }
        match cost {
            Cost::FillCached => fill_pattern_cached(batch_key(i), s),
            _ => fill_pattern(batch_key(i), s),
        }
        if let Cost::Busy { ns_per_mib } = cost {
            busy(Duration::from_nanos(
                ns_per_mib.saturating_mul(s.len() as u64) / MIB as u64,
            ));
        }
        Ok(s.len())
    }
}

fn loader_config(b: &LoaderBench) -> LoaderConfig {
    LoaderConfig::default()
        .with_batch_bytes(b.batch_bytes)
        .with_workers(b.workers)
        .with_depth(b.depth)
        .with_ring(b.ring)
        .with_total_batches(Some(b.warmup.max(1) + b.batches))
}

/// One timed run: GB/s, verified, kernel samples, host-clock span, timed
/// bytes, workers.
struct Run {
    gbps: f64,
    verified: bool,
    kernel_ms: Vec<f64>,
    start: Instant,
    end: Instant,
    bytes: u64,
    workers: usize,
}

fn host_run(rt: &Runtime, b: &LoaderBench) -> Result<Run> {
    let warmup = b.warmup.max(1);
    let loader = Loader::new(rt, Target::Host, loader_config(b), producer(b.cost))?;
    let mut verified = true;
    let mut count = 0;
    let mut start = Instant::now();
    for batch in &loader {
        let batch = batch?;
        let bytes = batch.host_bytes().expect("host mode");
        let words = (bytes.len() / 4) as u64;
        let key = batch_key(batch.index());
        verified &= if b.sampled_check {
            pattern_sample_ok(key, bytes, SAMPLE_STRIDE_WORDS)
        } else {
            checksum_host(bytes) == pattern_checksum(key, words)
                && pattern_tail_ok(key, words, &bytes[words as usize * 4..])
        };
        count += 1;
        if batch.index() + 1 == warmup {
            start = Instant::now();
        }
    }
    let end = Instant::now();
    let bytes = b.batches * b.batch_bytes as u64;
    Ok(Run {
        gbps: gbps(bytes, (end - start).as_secs_f64()),
        verified: verified && count == warmup + b.batches,
        kernel_ms: Vec::new(),
        start,
        end,
        bytes,
        workers: loader.config().workers,
    })
}

fn gpu_run(
    rt: &Runtime,
    gpu: CudaOrdinal,
    b: &LoaderBench,
    kernels: &Kernels,
    barrier: Option<&Barrier>,
) -> Result<Run> {
    let err = |what| cuda_err(gpu, what);
    let warmup = b.warmup.max(1);
    let total = warmup + b.batches;
    let _ctx = ContextGuard::push(gpu.0).map_err(err("context"))?;
    let stream = Stream::new().map_err(err("stream"))?;
    let sums = DeviceBuffer::new(usize_from(total) * 8).map_err(err("cuMemAlloc"))?;
    sums.memset(0).map_err(err("cuMemsetD8"))?;
    let (t0, t1) = (
        Event::new(true).map_err(err("event"))?,
        Event::new(true).map_err(err("event"))?,
    );
    let loader = Loader::new(rt, Target::Gpu(gpu), loader_config(b), producer(b.cost))?;
    if let Some(barrier) = barrier {
        barrier.wait();
    }
    let stop = AtomicBool::new(false);
    let mut start = Instant::now();
    let (consumed, kernel_ms) = std::thread::scope(|s| {
        let spin = b.spin_kernel.then(|| {
            s.spawn(|| -> Result<Vec<f64>> {
                cuda::set_device(gpu.0).map_err(err("context"))?;
                let timer = SpinTimer::new(gpu)?;
                let mut v = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    v.push(timer.time(kernels)?);
                }
                Ok(v)
            })
        });
        let consumed = (|| -> Result<u64> {
            let mut count = 0;
            for batch in &loader {
                let mut batch = batch?;
                // SAFETY: the stream outlives the batch (the loop drops
                // each batch before the stream goes); sums holds one u64
                // per batch and the batch buffer len bytes.
                unsafe {
                    batch.wait_on(stream.raw())?;
                    if batch.index() + 1 == warmup {
                        t0.record(stream.raw()).map_err(err("cuEventRecord"))?;
                        start = Instant::now();
                    }
                    kernels
                        .checksum_async(
                            batch.device_ptr().expect("GPU mode"),
                            (batch.len() / 4) as u64,
                            sums.ptr() + 8 * batch.index(),
                            stream.raw(),
                        )
                        .map_err(err("cuLaunchKernel"))?;
                }
                count += 1;
            }
            // SAFETY: as above.
            unsafe { t1.record(stream.raw()) }.map_err(err("cuEventRecord"))?;
            t1.synchronize().map_err(err("cuEventSynchronize"))?;
            Ok(count)
        })();
        stop.store(true, Ordering::SeqCst);
        let kernel_ms = spin.map(|h| h.join().expect("spin thread")).transpose();
        (consumed, kernel_ms)
    });
    let end = Instant::now();
    let count = consumed?;
    let kernel_ms = kernel_ms?.unwrap_or_default();
    let ms = f64::from(
        t1.elapsed_ms_since(&t0)
            .map_err(err("cuEventElapsedTime"))?,
    );
    let mut raw = vec![0u8; usize_from(total) * 8];
    sums.read(&mut raw).map_err(err("cuMemcpyDtoH"))?;
    let words = (b.batch_bytes / 4) as u64;
    let sums_ok = (0..total).all(|i| {
        let got = u64::from_le_bytes(raw[usize_from(i) * 8..][..8].try_into().expect("8 bytes"));
        got == pattern_checksum(batch_key(i), words)
    });
    // A tail under one word is not summed by the kernel: measure with
    // batch sizes that are multiples of 4 for `verified` to cover it all.
    let bytes = b.batches * b.batch_bytes as u64;
    Ok(Run {
        gbps: gbps(bytes, ms / 1e3),
        verified: sums_ok && count == total && b.batch_bytes % 4 == 0,
        kernel_ms,
        start,
        end,
        bytes,
        workers: loader.config().workers,
    })
}

fn figure(mode: Mode, runs: &[Run], spin: bool) -> LoaderFigure {
    LoaderFigure {
        mode: mode.name(),
        gbps: Stats::of(runs.iter().map(|r| r.gbps).collect()),
        verified: !runs.is_empty() && runs.iter().all(|r| r.verified),
        workers: runs.first().map_or(0, |r| r.workers),
        kernel_ms: spin.then(|| {
            Stats::of(
                runs.iter()
                    .flat_map(|r| r.kernel_ms.iter().copied())
                    .collect(),
            )
        }),
    }
}

/// Delivered GB/s of a loader (see the module docs): `b.reps` runs of a
/// fresh loader, each timed over `b.batches` batches after `b.warmup`.
///
/// # Errors
///
/// [`Error::Loader`] when a loader cannot start or fails (its set-up, the
/// driver, the kernels), [`Error::Runtime`] when its
/// slots cannot be had.
pub fn loader_gbps(rt: &Runtime, mode: Mode, b: &LoaderBench) -> Result<LoaderFigure> {
    let mut runs = Vec::with_capacity(b.reps);
    match mode {
        Mode::Host => {
            for _ in 0..b.reps {
                runs.push(host_run(rt, b)?);
            }
        }
        Mode::Gpu(g) => {
            let kernels = Kernels::load(g).map_err(cuda_err(g, "loading the PTX kernels"))?;
            for _ in 0..b.reps {
                runs.push(gpu_run(rt, g, b, &kernels, None)?);
            }
        }
    }
    Ok(figure(
        mode,
        &runs,
        b.spin_kernel && matches!(mode, Mode::Gpu(_)),
    ))
}

/// One loader per GPU in `gpus`, all at once, each consumed by its own
/// thread (see [`AggregateFigure`]).
///
/// # Errors
///
/// As [`loader_gbps`], for any of the GPUs.
pub fn loader_gbps_all(
    rt: &Runtime,
    gpus: &[CudaOrdinal],
    b: &LoaderBench,
) -> Result<AggregateFigure> {
    let kernels = gpus
        .iter()
        .map(|&g| Kernels::load(g).map_err(cuda_err(g, "loading the PTX kernels")))
        .collect::<Result<Vec<_>>>()?;
    let mut per: Vec<Vec<Run>> = gpus.iter().map(|_| Vec::new()).collect();
    let mut agg = Vec::new();
    for _ in 0..b.reps {
        let barrier = Barrier::new(gpus.len());
        let runs: Vec<Result<Run>> = std::thread::scope(|s| {
            let hs: Vec<_> = gpus
                .iter()
                .zip(&kernels)
                .map(|(&g, k)| {
                    let barrier = &barrier;
                    s.spawn(move || gpu_run(rt, g, b, k, Some(barrier)))
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("loader thread"))
                .collect()
        });
        let runs = runs.into_iter().collect::<Result<Vec<_>>>()?;
        let first = runs.iter().map(|r| r.start).min().expect("a GPU");
        let last = runs.iter().map(|r| r.end).max().expect("a GPU");
        agg.push(gbps(
            runs.iter().map(|r| r.bytes).sum(),
            (last - first).as_secs_f64(),
        ));
        for (p, r) in per.iter_mut().zip(runs) {
            p.push(r);
        }
    }
    let per_gpu: Vec<_> = per
        .iter()
        .map(|r| figure(Mode::Gpu(CudaOrdinal(0)), r, false))
        .collect();
    Ok(AggregateFigure {
        gbps: Stats::of(agg),
        verified: per_gpu.iter().all(|f| f.verified),
        per_gpu,
    })
}

/// A stream and two timing events of one GPU, for timing busy-wait
/// kernel launches one at a time.
struct SpinTimer {
    gpu: CudaOrdinal,
    stream: Stream,
    a: Event,
    z: Event,
}

impl SpinTimer {
    /// Made in the GPU's context, which must be current.
    fn new(gpu: CudaOrdinal) -> Result<SpinTimer> {
        let err = |what| cuda_err(gpu, what);
        Ok(SpinTimer {
            gpu,
            stream: Stream::new().map_err(err("stream"))?,
            a: Event::new(true).map_err(err("event"))?,
            z: Event::new(true).map_err(err("event"))?,
        })
    }

    /// Milliseconds of one launch of [`SPIN_MS`].
    fn time(&self, kernels: &Kernels) -> Result<f64> {
        let err = |what| cuda_err(self.gpu, what);
        let st = self.stream.raw();
        // SAFETY: the stream and events are alive and of this GPU's
        // context, as are the kernels.
        unsafe {
            self.a.record(st).map_err(err("cuEventRecord"))?;
            kernels
                .spin_async(SPIN_MS, SPIN_SM_FRACTION, st)
                .map_err(err("cuLaunchKernel"))?;
            self.z.record(st).map_err(err("cuEventRecord"))?;
        }
        self.z.synchronize().map_err(err("cuEventSynchronize"))?;
        let ms = self.z.elapsed_ms_since(&self.a);
        Ok(f64::from(ms.map_err(err("cuEventElapsedTime"))?))
    }
}

/// Copies queued back to back per repetition in [`pinned_copy_gbps`].
pub const PINNED_COPIES: u32 = 8;

/// GB/s of a bare loop of `cuMemcpyHtoDAsync` of `bytes` from an arena
/// buffer on the GPU's node to one device buffer: [`PINNED_COPIES`]
/// copies per repetition, timed with events.
///
/// # Errors
///
/// [`Error::Loader`] ([`LoaderError::Setup`]) naming the driver call that
/// failed, [`Error::Runtime`] when the arena buffer
/// cannot be had.
pub fn pinned_copy_gbps(
    rt: &Runtime,
    gpu: CudaOrdinal,
    bytes: usize,
    reps: usize,
) -> Result<Stats> {
    let err = |what| cuda_err(gpu, what);
    let _ctx = ContextGuard::push(gpu.0).map_err(err("context"))?;
    let mut src = rt.alloc(Target::Gpu(gpu), bytes)?;
    fill_pattern(1, &mut src);
    let dev = DeviceBuffer::new(bytes).map_err(err("cuMemAlloc"))?;
    let stream = Stream::new().map_err(err("stream"))?;
    let (a, z) = (
        Event::new(true).map_err(err("event"))?,
        Event::new(true).map_err(err("event"))?,
    );
    let mut samples = Vec::with_capacity(reps);
    for rep in 0..=reps {
        // SAFETY: src (pinned, bytes long) and dev (bytes long) outlive the
        // copies, which are waited for (z) before the next repetition and
        // before either is dropped; the context is current.
        unsafe {
            a.record(stream.raw()).map_err(err("cuEventRecord"))?;
            for _ in 0..PINNED_COPIES {
                cuda::memcpy_htod_async(dev.ptr(), src.as_ptr().cast(), bytes, stream.raw())
                    .map_err(err("cuMemcpyHtoDAsync"))?;
            }
            z.record(stream.raw()).map_err(err("cuEventRecord"))?;
        }
        z.synchronize().map_err(err("cuEventSynchronize"))?;
        let ms = f64::from(z.elapsed_ms_since(&a).map_err(err("cuEventElapsedTime"))?);
        if rep > 0 {
            // The first is a warm-up.
            samples.push(gbps(bytes as u64 * u64::from(PINNED_COPIES), ms / 1e3));
        }
    }
    Ok(Stats::of(samples))
}

/// [`pinned_copy_gbps`] while `writers` threads (bound to the GPU's CPUs)
/// write a private 64 MiB buffer each with streaming stores, paced to
/// `target_gbps` between them (0: as fast as they can). Returns the copy rate and the writers'
/// own rate, GB/s: how much a producer's writes slow the DMA engine's
/// reads of the same memory.
///
/// # Errors
///
/// As [`pinned_copy_gbps`]; [`Error::Loader`] when a writer thread cannot be
/// started.
pub fn pinned_copy_under_writes(
    rt: &Runtime,
    gpu: CudaOrdinal,
    bytes: usize,
    reps: usize,
    writers: usize,
    target_gbps: f64,
) -> Result<(Stats, f64)> {
    use std::sync::atomic::AtomicU64;
    const BUF: usize = 64 * MIB;
    const PIECE: usize = MIB;
    let cpus = rt.place(crate::runtime::Target::Gpu(gpu))?.cpus;
    let stop = AtomicBool::new(false);
    let written = AtomicU64::new(0);
    let per_thread = target_gbps * 1e9 / crate::num::f64_from_usize(writers.max(1));
    let started = Instant::now();
    let copy = std::thread::scope(|s| {
        for _ in 0..writers {
            let (stop, written, cpus) = (&stop, &written, &cpus);
            s.spawn(move || {
                let _ = crate::affinity::bind_current_thread(cpus);
                let mut v = vec![0u8; BUF + 64];
                let a = v.as_ptr().align_offset(64);
                let buf = &mut v[a..a + BUF];
                let t = Instant::now();
                let mut done = 0u64;
                let mut key = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    for piece in buf.chunks_mut(PIECE) {
                        fill_pattern(key, piece);
                        done += piece.len() as u64;
                        if per_thread > 0.0 {
                            let due = Duration::from_secs_f64(f64_from(done) / per_thread);
                            if let Some(ahead) = due.checked_sub(t.elapsed()) {
                                std::thread::sleep(ahead);
                            }
                        }
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                    }
                    key = key.wrapping_add(1);
                }
                written.fetch_add(done, Ordering::Relaxed);
            });
        }
        // Let the writers reach their pace first.
        std::thread::sleep(Duration::from_millis(50));
        let r = pinned_copy_gbps(rt, gpu, bytes, reps);
        stop.store(true, Ordering::Relaxed);
        r
    })?;
    let secs = started.elapsed().as_secs_f64();
    Ok((copy, f64_from(written.load(Ordering::Relaxed)) / secs / 1e9))
}

/// Milliseconds of one busy-wait kernel launch ([`SPIN_MS`] on
/// [`SPIN_SM_FRACTION`] of the SMs) with nothing else running, `reps`
/// launches.
///
/// # Errors
///
/// [`Error::Loader`] ([`LoaderError::Setup`]) naming the driver call that
/// failed (loading the kernels, a stream, an event).
pub fn spin_kernel_ms(gpu: CudaOrdinal, reps: usize) -> Result<Stats> {
    let err = |what| cuda_err(gpu, what);
    let kernels = Kernels::load(gpu).map_err(err("loading the PTX kernels"))?;
    let _ctx = ContextGuard::push(gpu.0).map_err(err("context"))?;
    let timer = SpinTimer::new(gpu)?;
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        v.push(timer.time(&kernels)?);
    }
    Ok(Stats::of(v))
}

/// Times `copy` `reps` times (plus a warm-up) with the host clock, then
/// checks a round trip: `bytes` of pattern in a plain `Vec` (touched
/// before timing) to and from a device buffer.
fn copy_figure(
    gpu: CudaOrdinal,
    bytes: usize,
    reps: usize,
    dir: Direction,
    to: &dyn Fn(&[u8], &DeviceBuffer) -> Result<()>,
    from: &dyn Fn(&DeviceBuffer, &mut [u8]) -> Result<()>,
) -> Result<CopyFigure> {
    let err = |what| cuda_err(gpu, what);
    let _ctx = ContextGuard::push(gpu.0).map_err(err("context"))?;
    let dev = DeviceBuffer::new(bytes).map_err(err("cuMemAlloc"))?;
    let mut src = vec![0u8; bytes];
    fill_pattern(batch_key(bytes as u64), &mut src);
    let mut dst = vec![0u8; bytes];
    dst.fill(1);
    let mut samples = Vec::with_capacity(reps);
    for rep in 0..=reps {
        let t = Instant::now();
        match dir {
            Direction::ToDevice => to(&src, &dev)?,
            Direction::FromDevice => from(&dev, &mut dst)?,
        }
        if rep > 0 {
            samples.push(gbps(bytes as u64, t.elapsed().as_secs_f64()));
        }
    }
    to(&src, &dev)?;
    from(&dev, &mut dst)?;
    Ok(CopyFigure {
        gbps: Stats::of(samples),
        verified: dst == src,
    })
}

/// GB/s of [`copy_to_device_with`](crate::staged::copy_to_device_with) (or `copy_from_device_with`)
/// of `bytes` between a plain `Vec` and device memory.
///
/// # Errors
///
/// [`Error::Staged`] from the staged copies,
/// [`Error::Loader`] ([`LoaderError::Setup`]) naming the driver call that
/// failed.
pub fn staged_gbps(
    rt: &Runtime,
    gpu: CudaOrdinal,
    bytes: usize,
    reps: usize,
    dir: Direction,
    opts: &StagedOptions,
) -> Result<CopyFigure> {
    copy_figure(
        gpu,
        bytes,
        reps,
        dir,
        &|s, d| {
            Ok(crate::staged::copy_to_device_with(
                rt,
                s,
                d.ptr(),
                gpu,
                opts,
            )?)
        },
        &|d, s| {
            Ok(crate::staged::copy_from_device_with(
                rt,
                d.ptr(),
                s,
                gpu,
                opts,
            )?)
        },
    )
}

/// Baseline: GB/s of the driver's own pageable copy (`cuMemcpyHtoD` /
/// `cuMemcpyDtoH` of a plain `Vec`).
///
/// # Errors
///
/// [`Error::Loader`] ([`LoaderError::Setup`]) naming the driver call that
/// failed.
pub fn pageable_gbps(
    gpu: CudaOrdinal,
    bytes: usize,
    reps: usize,
    dir: Direction,
) -> Result<CopyFigure> {
    copy_figure(
        gpu,
        bytes,
        reps,
        dir,
        &|s, d| d.write(s).map_err(cuda_err(gpu, "cuMemcpyHtoD")),
        &|d, s| d.read(s).map_err(cuda_err(gpu, "cuMemcpyDtoH")),
    )
}
