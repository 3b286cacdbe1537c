//! Copy rates between host memory and a GPU: pageable, driver-pinned
//! (`cuMemAllocHost`) and arena memory, one GPU or every GPU at once, and
//! the driver's own pinning cost, each timed with CUDA events.

use std::time::Instant;

use super::arena::Stats;
use crate::error::{Error, Result};
use crate::gpu::CudaOrdinal;
use crate::loader::LoaderError;
use crate::num::f64_from_usize;
use crate::platform::cuda::{
    ensure_context, memcpy_dtoh_async, memcpy_htod_async, set_device, CudaError, DeviceBuffer,
    Event, HostAlloc, Stream,
};
use crate::runtime::{PinnedBuf, Runtime, Target};

/// Where a copy reads from (host to device) or writes to.
#[derive(Debug, Clone, Copy)]
pub enum Source {
    /// A `Vec<u8>`.
    Pageable,
    /// `cuMemAllocHost`.
    DriverPinned,
    /// An arena buffer on this node.
    Arena(u32),
}

enum HostMem {
    Vec(Vec<u8>),
    Driver(HostAlloc),
    Arena(PinnedBuf),
}

impl HostMem {
    fn ptr(&mut self) -> *mut u8 {
        match self {
            HostMem::Vec(v) => v.as_mut_ptr(),
            HostMem::Driver(h) => h.ptr().cast(),
            HostMem::Arena(b) => b.as_mut_ptr(),
        }
    }
}

fn cuda_err(what: &str, e: CudaError) -> Error {
    LoaderError::setup(what, "check `nvidia-smi` and `numapin doctor`", e).into()
}

fn host_mem(rt: &Runtime, src: Source, bytes: usize) -> Result<HostMem> {
    let mut m = match src {
        Source::Pageable => HostMem::Vec(vec![0u8; bytes]),
        Source::DriverPinned => {
            HostMem::Driver(HostAlloc::new(bytes).map_err(|e| cuda_err("cuMemAllocHost", e))?)
        }
        Source::Arena(n) => HostMem::Arena(rt.alloc(Target::HostNode(n), bytes)?),
    };
    // Never time on zeros or untouched pages: fill with a pattern.
    // SAFETY: ptr() points at `bytes` bytes this function owns.
    let s = unsafe { std::slice::from_raw_parts_mut(m.ptr(), bytes) };
    for (i, c) in s.chunks_mut(4096).enumerate() {
        c.fill(i.to_le_bytes()[0] | 1);
    }
    Ok(m)
}

/// Host-to-device and device-to-host GB/s of `bytes` from/to `src`.
///
/// # Errors
///
/// [`Error::Loader`] ([`LoaderError::Setup`]) naming the driver call that
/// failed (no driver, no such GPU, out of memory), and
/// [`Error::Runtime`] when the arena buffer cannot be
/// had.
pub fn copy_gbps_from(
    rt: &Runtime,
    gpu: CudaOrdinal,
    src: Source,
    bytes: usize,
    warmup: usize,
    reps: usize,
) -> Result<(Stats, Stats)> {
    set_device(gpu.get()).map_err(|e| cuda_err("selecting the GPU", e))?;
    let mut host = host_mem(rt, src, bytes)?;
    let dev = DeviceBuffer::new(bytes).map_err(|e| cuda_err("cuMemAlloc", e))?;
    let stream = Stream::new().map_err(|e| cuda_err("cuStreamCreate", e))?;
    let (a, b) = (
        Event::new(true).map_err(|e| cuda_err("cuEventCreate", e))?,
        Event::new(true).map_err(|e| cuda_err("cuEventCreate", e))?,
    );
    let mut out = Vec::new();
    for dir in [true, false] {
        let mut samples = Vec::new();
        for r in 0..warmup + reps {
            // SAFETY: host and dev hold `bytes` bytes each and outlive the
            // copy, which is waited for (b.synchronize) before the next use.
            let ms = unsafe {
                a.record(stream.raw())
                    .map_err(|e| cuda_err("cuEventRecord", e))?;
                let r = if dir {
                    memcpy_htod_async(dev.ptr(), host.ptr().cast(), bytes, stream.raw())
                } else {
                    memcpy_dtoh_async(host.ptr().cast(), dev.ptr(), bytes, stream.raw())
                };
                r.map_err(|e| cuda_err("copy", e))?;
                b.record(stream.raw())
                    .map_err(|e| cuda_err("cuEventRecord", e))?;
                b.synchronize()
                    .map_err(|e| cuda_err("cuEventSynchronize", e))?;
                b.elapsed_ms_since(&a)
                    .map_err(|e| cuda_err("cuEventElapsedTime", e))?
            };
            if r >= warmup && ms > 0.0 {
                samples.push(f64_from_usize(bytes) / 1e9 / (f64::from(ms) / 1e3));
            }
        }
        out.push(Stats::of(samples));
    }
    let d2h = out.pop().unwrap_or_else(|| Stats::of(Vec::new()));
    let h2d = out.pop().unwrap_or_else(|| Stats::of(Vec::new()));
    Ok((h2d, d2h))
}

/// Aggregate host-to-device GB/s with every GPU copying at once from an
/// arena buffer on its own node (one thread per GPU).
///
/// # Errors
///
/// As [`copy_gbps_from`], for any of the GPUs.
pub fn all_gpus_gbps(
    rt: &Runtime,
    ordinals: &[CudaOrdinal],
    bytes: usize,
    warmup: usize,
    reps: usize,
) -> Result<Stats> {
    let n = ordinals.len();
    let barrier = std::sync::Barrier::new(n + 1);
    let mut samples = Vec::new();
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = ordinals
            .iter()
            .map(|&g| {
                let barrier = &barrier;
                s.spawn(move || -> Result<()> {
                    let setup = (|| -> Result<_> {
                        set_device(g.get()).map_err(|e| cuda_err("selecting the GPU", e))?;
                        let node = rt
                            .node_for_gpu(g)
                            .unwrap_or_else(|_| rt.calling_thread_node());
                        let host = host_mem(rt, Source::Arena(node), bytes)?;
                        let dev =
                            DeviceBuffer::new(bytes).map_err(|e| cuda_err("cuMemAlloc", e))?;
                        let stream = Stream::new().map_err(|e| cuda_err("cuStreamCreate", e))?;
                        Ok((host, dev, stream))
                    })();
                    // Every rep waits at the barrier twice, even after a
                    // failure, so the other threads never hang.
                    let mut state = setup;
                    for _ in 0..warmup + reps {
                        barrier.wait();
                        if let Ok((host, dev, stream)) = &mut state {
                            // SAFETY: buffers outlive the copy, which is
                            // synchronized before the barrier.
                            let r = unsafe {
                                memcpy_htod_async(dev.ptr(), host.ptr().cast(), bytes, stream.raw())
                            }
                            .and_then(|_| stream.synchronize());
                            if let Err(e) = r {
                                state = Err(cuda_err("copy", e));
                            }
                        }
                        barrier.wait();
                    }
                    state.map(|_| ())
                })
            })
            .collect();
        for r in 0..warmup + reps {
            barrier.wait();
            let t0 = Instant::now();
            barrier.wait();
            if r >= warmup {
                samples.push(f64_from_usize(n * bytes) / 1e9 / t0.elapsed().as_secs_f64());
            }
        }
        for h in handles {
            h.join().map_err(|_| -> Error {
                LoaderError::setup(
                    "benchmark thread",
                    "report this as a bug",
                    std::io::Error::other("it panicked"),
                )
                .into()
            })??;
        }
        Ok(())
    })?;
    Ok(Stats::of(samples))
}

/// `cuMemAllocHost` + first touch + `cuMemFreeHost` per GiB, the driver's
/// own way to get pinned memory (the baseline for region creation).
///
/// # Errors
///
/// [`Error::Loader`] ([`LoaderError::Setup`]) naming the driver call that
/// failed.
pub fn host_alloc_ms_per_gib(bytes: usize, reps: usize) -> Result<Stats> {
    ensure_context().map_err(|e| cuda_err("CUDA context", e))?;
    let mut samples = Vec::new();
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        let h = HostAlloc::new(bytes).map_err(|e| cuda_err("cuMemAllocHost", e))?;
        // SAFETY: h holds `bytes` bytes.
        unsafe { std::ptr::write_bytes(h.ptr().cast::<u8>(), 1, bytes) };
        h.free().map_err(|e| cuda_err("cuMemFreeHost", e))?;
        samples.push(super::ms_per_gib(t0.elapsed(), bytes));
    }
    Ok(Stats::of(samples))
}

/// One `cuMemAllocHost` + `cuMemFreeHost` pair of `bytes` in the current
/// context, the free checked: the driver's own pinned memory, no NUMA
/// placement and no budget (the baseline of the arena's alloc+free and
/// region benchmarks).
///
/// # Errors
///
/// [`LoaderError::Setup`] (in [`Error::Loader`]) naming the driver call
/// that failed, with the driver's error.
pub fn host_alloc_free(bytes: usize) -> Result<()> {
    let h = HostAlloc::new(bytes).map_err(|e| cuda_err("cuMemAllocHost", e))?;
    h.free().map_err(|e| cuda_err("cuMemFreeHost", e))
}
