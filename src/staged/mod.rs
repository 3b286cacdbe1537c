//! Staged copies of pageable memory to and from a GPU.
//!
//! `cuMemcpyHtoD` from ordinary (pageable) memory is slow: the driver copies
//! it through its own small pinned buffers, one at a time, on one thread.
//! [`copy_to_device`] splits the copy into chunks and has several
//! threads, bound to the GPU's own CPUs, each copy a chunk into a pinned
//! staging slot from the GPU's node arena and queue its DMA on the thread's
//! stream; each thread has two slots, so the memcpy of its next chunk runs
//! while the DMA of the last one does (double buffering, one event per
//! slot), and the threads together keep the copy engine busy.
//! [`copy_from_device`] is the reverse: the DMA of chunk k+1 runs
//! while chunk k is copied out of its slot.
//!
//! Staging memory: `threads * slots_per_thread * chunk_bytes` pinned bytes
//! on the GPU's node for the duration of the call (128 MiB with the
//! defaults: 16 threads, 2 slots of 4 MiB), from the runtime's arena.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

mod error;
mod pinned_copy;
mod stream_copy;

pub use error::StagedError;
pub use pinned_copy::{copy_host, pinned_copy};

use crate::cpulist::CpuList;
use crate::gpu::{CudaError, CudaOrdinal};
use crate::platform::cuda::{self, CUdeviceptr, CUstream, Event, Stream};
use crate::runtime::Target;
use crate::runtime::{PinnedBuf, Runtime};

use StagedError as Error;

type Result<T, E = StagedError> = std::result::Result<T, E>;

/// Most threads a staged copy starts by default (the node's allowed CPUs,
/// at most this many): memcpy from pageable memory is its bottleneck.
pub const MAX_STAGED_THREADS: usize = 16;

/// How a staged copy runs (start from `StagedOptions::default()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StagedOptions {
    /// Bytes per chunk (default 4 MiB: the best mean ratio to the pinned
    /// rate over 1-16 MiB chunks and 4-16 threads in two runs of
    /// `numapin bench --staged-sweep` on an H100 VM; docs/BENCHMARKS.md).
    pub chunk_bytes: usize,
    /// Threads, 0 for the GPU's allowed local CPUs up to
    /// [`MAX_STAGED_THREADS`] (default 0);
    /// never more than there are chunks.
    pub threads: usize,
    /// Staging slots per thread (default 2: double buffering).
    pub slots_per_thread: usize,
    /// How a copy to the device writes its slots (default
    /// [`SlotWrites::Auto`]).
    pub slot_writes: SlotWrites,
}

/// How a staged copy to the device writes the pinned slots the DMA engine
/// then reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SlotWrites {
    /// [`Cached`](Self::Cached) when all the copy's slots fit in half the
    /// last-level caches of the CPUs its threads run on (the topology's
    /// cache sizes), [`Streaming`](Self::Streaming) otherwise.
    #[default]
    Auto,
    /// Streaming (non-temporal) stores: the slot goes to memory and the DMA
    /// engine reads it from there, so each byte crosses memory three times
    /// (source read, slot write, DMA read), but no cache line is read
    /// before it is overwritten.
    Streaming,
    /// Ordinary stores: a slot that fits in the cache stays there, is
    /// rewritten there chunk after chunk, and the DMA engine's reads are
    /// served from the cache, so only the source crosses memory.
    Cached,
}

impl Default for StagedOptions {
    fn default() -> Self {
        StagedOptions {
            chunk_bytes: 4 << 20,
            threads: 0,
            slots_per_thread: 2,
            slot_writes: SlotWrites::Auto,
        }
    }
}

with_setters!(StagedOptions {
    with_chunk_bytes => chunk_bytes: usize,
    with_threads => threads: usize,
    with_slots_per_thread => slots_per_thread: usize,
    with_slot_writes => slot_writes: SlotWrites,
});

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToDevice,
    FromDevice,
}

/// Copies `src` (any host memory, typically pageable) to device memory at
/// `dst` on CUDA device `gpu`, staged through pinned memory on the GPU's
/// node from `rt`'s arena with the default [`StagedOptions`]. Returns when
/// the data is on the device.
///
/// `dst..dst + src.len()` must lie inside one device allocation of that GPU
/// (checked with `cuPointerGetAttribute`; an error otherwise). The calling
/// thread's CUDA context is left as it was.
///
/// # Errors
///
/// [`StagedError::Runtime`] for a GPU the topology does not have
/// ([`RuntimeError::UnknownGpu`](crate::runtime::RuntimeError::UnknownGpu)) or
/// staging slots over the node's budget; [`StagedError::Request`] for a `dst`
/// that is not device memory of `gpu` or too short; [`StagedError::Setup`] when
/// the driver fails (no driver, a stream, a copy) or a copy thread cannot
/// start; [`StagedError::Affinity`] when a copy thread cannot be bound to the
/// GPU's CPUs.
pub fn copy_to_device(rt: &Runtime, src: &[u8], dst: CUdeviceptr, gpu: CudaOrdinal) -> Result<()> {
    copy_to_device_with(rt, src, dst, gpu, &StagedOptions::default())
}

/// Copies device memory at `src` on CUDA device `gpu` into `dst`, staged
/// like [`copy_to_device`].
///
/// # Errors
///
/// As [`copy_to_device`], for the source `src`.
pub fn copy_from_device(
    rt: &Runtime,
    src: CUdeviceptr,
    dst: &mut [u8],
    gpu: CudaOrdinal,
) -> Result<()> {
    copy_from_device_with(rt, src, dst, gpu, &StagedOptions::default())
}

/// [`copy_to_device`] with options.
///
/// # Errors
///
/// As [`copy_to_device`]; [`StagedError::Request`] also for options out of
/// range (`chunk_bytes` or `slots_per_thread` of 0).
pub fn copy_to_device_with(
    rt: &Runtime,
    src: &[u8],
    dst: CUdeviceptr,
    gpu: CudaOrdinal,
    opts: &StagedOptions,
) -> Result<()> {
    // SAFETY: no stream to order after.
    unsafe { copy_to_device_after(rt, src, dst, gpu, std::ptr::null_mut(), false, opts) }
}

/// [`copy_to_device_with`], ordered after the work already queued on
/// `stream` (a stream of `gpu`'s primary context, such as a framework's
/// current stream): the copy's DMAs start only once that work is done (an
/// event recorded on `stream`, waited on by the copy's own streams; the
/// host does not wait for it before staging). Returns when the data is on
/// the device, so work queued on `stream` afterwards sees it.
///
/// # Safety
/// `stream` must be a live stream of `gpu`'s primary context (or null, the
/// legacy default stream) for the whole call.
///
/// # Errors
///
/// As [`copy_to_device_with`]; [`StagedError::Setup`] when the event on
/// `stream` cannot be recorded.
pub unsafe fn copy_to_device_on(
    rt: &Runtime,
    src: &[u8],
    dst: CUdeviceptr,
    gpu: CudaOrdinal,
    stream: CUstream,
    opts: &StagedOptions,
) -> Result<()> {
    // SAFETY: the caller vouches for the stream.
    unsafe { copy_to_device_after(rt, src, dst, gpu, stream, true, opts) }
}

/// [`copy_from_device_with`], ordered after the work already queued on
/// `stream` (see [`copy_to_device_on`]): the data read is what that work
/// left in device memory.
///
/// # Safety
/// As for [`copy_to_device_on`].
///
/// # Errors
///
/// As [`copy_to_device_on`].
pub unsafe fn copy_from_device_on(
    rt: &Runtime,
    src: CUdeviceptr,
    dst: &mut [u8],
    gpu: CudaOrdinal,
    stream: CUstream,
    opts: &StagedOptions,
) -> Result<()> {
    // SAFETY: the caller vouches for the stream.
    unsafe { copy_from_device_after(rt, src, dst, gpu, stream, true, opts) }
}

/// # Safety
/// With `ordered`, `stream` is a live stream of `gpu`'s primary context.
unsafe fn copy_to_device_after(
    rt: &Runtime,
    src: &[u8],
    dst: CUdeviceptr,
    gpu: CudaOrdinal,
    stream: CUstream,
    ordered: bool,
    opts: &StagedOptions,
) -> Result<()> {
    let plan = prepare(rt, gpu, dst, src.len(), opts, Direction::ToDevice)?;
    let Some(mut plan) = plan else { return Ok(()) };
    if ordered {
        // SAFETY: per this function's contract.
        plan.after = Some(unsafe { event_on(gpu, stream) }?);
    }
    let chunks = Mutex::new(src.chunks(plan.chunk).enumerate());
    let copy = if plan.streaming {
        stream_copy::copy
    } else {
        <[u8]>::copy_from_slice
    };
    run(&plan, |slots, stream, failed| {
        to_device(&chunks, slots, stream, dst, plan.chunk, copy, failed)
    })
}

/// [`copy_from_device`] with options.
///
/// # Errors
///
/// As [`copy_to_device_with`].
pub fn copy_from_device_with(
    rt: &Runtime,
    src: CUdeviceptr,
    dst: &mut [u8],
    gpu: CudaOrdinal,
    opts: &StagedOptions,
) -> Result<()> {
    // SAFETY: no stream to order after.
    unsafe { copy_from_device_after(rt, src, dst, gpu, std::ptr::null_mut(), false, opts) }
}

/// # Safety
/// With `ordered`, `stream` is a live stream of `gpu`'s primary context.
unsafe fn copy_from_device_after(
    rt: &Runtime,
    src: CUdeviceptr,
    dst: &mut [u8],
    gpu: CudaOrdinal,
    stream: CUstream,
    ordered: bool,
    opts: &StagedOptions,
) -> Result<()> {
    let plan = prepare(rt, gpu, src, dst.len(), opts, Direction::FromDevice)?;
    let Some(mut plan) = plan else { return Ok(()) };
    if ordered {
        // SAFETY: per this function's contract.
        plan.after = Some(unsafe { event_on(gpu, stream) }?);
    }
    let chunk = plan.chunk;
    let chunks = Mutex::new(dst.chunks_mut(chunk).enumerate());
    run(&plan, |slots, stream, failed| {
        from_device(&chunks, slots, stream, src, chunk, failed)
    })
}

struct Plan {
    gpu: CudaOrdinal,
    cpus: CpuList,
    chunk: usize,
    /// Whether slots are written with streaming stores (copies to the
    /// device; copies from it always write the caller's memory that way).
    streaming: bool,
    /// Staging slots, one group per thread.
    slots: Mutex<Vec<Vec<PinnedBuf>>>,
    /// An event recorded on the caller's stream: every copy stream waits on
    /// it before its first DMA.
    after: Option<Event>,
}

/// An event recorded now on `stream` of `gpu`.
///
/// # Safety
/// `stream` is a live stream of `gpu`'s primary context (or null).
unsafe fn event_on(gpu: CudaOrdinal, stream: CUstream) -> Result<Event> {
    let _ctx = cuda::ContextGuard::push(gpu.0).map_err(|e| copy_error(gpu, e))?;
    let e = Event::new(false).map_err(|e| copy_error(gpu, e))?;
    // SAFETY: the caller vouches for the stream; the event is of the same
    // (primary) context.
    unsafe { e.record(stream) }.map_err(|e| copy_error(gpu, e))?;
    Ok(e)
}

fn copy_error(gpu: CudaOrdinal, e: CudaError) -> Error {
    let fix = if e.is_no_driver() {
        "run on a machine with the NVIDIA driver"
    } else {
        "check the GPU (`nvidia-smi`) and the device pointer"
    };
    Error::setup(format!("staged copy with GPU {gpu}"), fix, e)
}

/// Checks the device range, sizes the copy and takes the staging slots;
/// `None` for an empty copy.
fn prepare(
    rt: &Runtime,
    gpu: CudaOrdinal,
    dev: CUdeviceptr,
    len: usize,
    opts: &StagedOptions,
    dir: Direction,
) -> Result<Option<Plan>> {
    if opts.chunk_bytes == 0 || opts.slots_per_thread == 0 {
        return Err(Error::Request {
            problem: format!(
                "staged copy option chunk_bytes/slots_per_thread = {}/{}: both must be at least 1",
                opts.chunk_bytes, opts.slots_per_thread
            ),
            fix: "use StagedOptions::default() (4 MiB chunks, 2 slots per thread)".into(),
        });
    }
    let place = rt.place(Target::Gpu(gpu))?;
    if len == 0 {
        return Ok(None);
    }
    check_range(gpu, dev, len, dir)?;
    let (chunk, threads, per_thread) = sizing(place.cpus.len(), len, opts);
    let mut slots = Vec::with_capacity(threads);
    for _ in 0..threads {
        let mut group = Vec::with_capacity(per_thread);
        for _ in 0..per_thread {
            group.push(rt.alloc(Target::HostNode(place.node), chunk)?);
        }
        slots.push(group);
    }
    let streaming = streams(
        opts.slot_writes,
        threads * per_thread * chunk,
        cache_bytes(rt, &place.cpus),
    );
    Ok(Some(Plan {
        gpu,
        cpus: place.cpus,
        chunk,
        streaming,
        slots: Mutex::new(slots),
        after: None,
    }))
}

/// The chunk size, threads and slots per thread of a copy of `len` bytes
/// (at least 1) by a GPU with `cpus` allowed local CPUs.
fn sizing(cpus: usize, len: usize, opts: &StagedOptions) -> (usize, usize, usize) {
    let chunk = opts.chunk_bytes.min(len).max(1);
    let n_chunks = len.div_ceil(chunk);
    let threads = match opts.threads {
        0 => cpus.clamp(1, MAX_STAGED_THREADS),
        t => t,
    }
    .min(n_chunks)
    .max(1);
    // Two slots per thread are only useful with two chunks per thread.
    let per_thread = opts.slots_per_thread.min(n_chunks.div_ceil(threads)).max(1);
    (chunk, threads, per_thread)
}

/// How a copy of `len` bytes to GPU `gpu` with `opts` writes its slots:
/// what [`SlotWrites::Auto`] comes to on this machine (the slots' total
/// size against the last-level caches of the GPU's CPUs), or the explicit
/// choice.
///
/// # Errors
///
/// [`StagedError::Runtime`] for a GPU the topology does not have.
pub fn slot_writes_for(
    rt: &Runtime,
    gpu: CudaOrdinal,
    len: usize,
    opts: &StagedOptions,
) -> Result<SlotWrites> {
    let place = rt.place(Target::Gpu(gpu))?;
    let (chunk, threads, per_thread) = sizing(place.cpus.len(), len.max(1), opts);
    Ok(
        if streams(
            opts.slot_writes,
            threads * per_thread * chunk,
            cache_bytes(rt, &place.cpus),
        ) {
            SlotWrites::Streaming
        } else {
            SlotWrites::Cached
        },
    )
}

/// Whether slots of `staging` bytes in all are written with streaming
/// stores, beside `cache` bytes of last-level cache: with
/// [`SlotWrites::Auto`], when they take more than half of it (then the
/// slots would not stay in the cache between chunks, and ordinary stores
/// would also read every line first).
fn streams(writes: SlotWrites, staging: usize, cache: usize) -> bool {
    match writes {
        SlotWrites::Streaming => true,
        SlotWrites::Cached => false,
        SlotWrites::Auto => staging > cache / 2,
    }
}

/// Bytes of last-level cache shared by `cpus` ([`Topology::last_level_cache_bytes`](crate::Topology::last_level_cache_bytes)).
fn cache_bytes(rt: &Runtime, cpus: &CpuList) -> usize {
    usize::try_from(rt.topology().last_level_cache_bytes(cpus)).unwrap_or(usize::MAX)
}

fn check_range(gpu: CudaOrdinal, ptr: CUdeviceptr, len: usize, dir: Direction) -> Result<()> {
    let which = match dir {
        Direction::ToDevice => "destination",
        Direction::FromDevice => "source",
    };
    let _ctx = cuda::ContextGuard::push(gpu.0).map_err(|e| copy_error(gpu, e))?;
    let r = cuda::device_range(ptr).map_err(|e| Error::Request {
        problem: format!(
            "the {which} {ptr:#x} of a staged copy with GPU {gpu} is not device memory: {e}"
        ),
        fix: "pass a pointer from cuMemAlloc (or a framework's device tensor) on that GPU".into(),
    })?;
    if r.ordinal != gpu.0 {
        return Err(Error::Request {
            problem: format!(
                "the {which} {ptr:#x} of a staged copy is on GPU {}, not GPU {gpu}",
                r.ordinal
            ),
            fix: format!(
                "pass gpu = {} (the CUDA ordinal the memory is on)",
                r.ordinal
            ),
        });
    }
    let end = ptr.checked_add(len as u64);
    if end.is_none_or(|e| e > r.start + r.size as u64) {
        return Err(Error::Request {
            problem: format!(
                "a staged copy of {len} bytes at {ptr:#x} runs past the end of its device allocation ({} bytes at {:#x})",
                r.size, r.start
            ),
            fix: "copy at most to the end of the allocation".into(),
        });
    }
    Ok(())
}

/// Runs `work` on one thread per slot group: bound to the GPU's CPUs with
/// its context current (on the calling thread, not rebound, when there is
/// one group), each with its own stream. The stream is synchronised before
/// the slots are given back, whatever happened.
fn run<F>(plan: &Plan, work: F) -> Result<()>
where
    F: Fn(&mut [PinnedBuf], &Stream, &AtomicBool) -> std::result::Result<(), CudaError> + Sync,
{
    let groups = std::mem::take(&mut *plan.slots.lock().unwrap_or_else(|p| p.into_inner()));
    let failed = AtomicBool::new(false);
    let one = |mut slots: Vec<PinnedBuf>, spawned: bool| -> Result<()> {
        let _ctx;
        if spawned {
            crate::affinity::bind_current_thread(&plan.cpus)?;
            cuda::set_device(plan.gpu.0).map_err(|e| copy_error(plan.gpu, e))?;
        } else {
            _ctx = cuda::ContextGuard::push(plan.gpu.0).map_err(|e| copy_error(plan.gpu, e))?;
        }
        let stream = Stream::new().map_err(|e| copy_error(plan.gpu, e))?;
        if let Some(after) = &plan.after {
            // SAFETY: our stream and the caller's event, both alive, of the
            // same context.
            unsafe { cuda::stream_wait_event(stream.raw(), after.raw()) }
                .map_err(|e| copy_error(plan.gpu, e))?;
        }
        let r = work(&mut slots, &stream, &failed);
        if r.is_err() {
            failed.store(true, Ordering::SeqCst);
        }
        // Nothing may still read or write a slot when it goes back.
        let synced = stream.synchronize();
        drop(slots);
        r.and(synced).map_err(|e| copy_error(plan.gpu, e))
    };
    if groups.len() == 1 {
        let g = groups.into_iter().next().expect("one group");
        return one(g, false);
    }
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .into_iter()
            .enumerate()
            .map(|(i, g)| {
                let one = &one;
                std::thread::Builder::new()
                    .name(format!("numapin-stage{i}"))
                    .spawn_scoped(s, move || one(g, true))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    Err(Error::setup(
                        "staged copy",
                        "report this as a numapin bug",
                        "a copy thread panicked",
                    ))
                }),
                Err(e) => {
                    failed.store(true, Ordering::SeqCst);
                    Err(Error::setup(
                        "starting a staged copy thread",
                        "check the process's thread limit (`ulimit -u`)",
                        e,
                    ))
                }
            })
            .collect()
    });
    results.into_iter().collect()
}

/// One event per staging slot, recorded after the slot's last DMA.
fn slot_events(n: usize) -> std::result::Result<Vec<Event>, CudaError> {
    (0..n).map(|_| Event::new(false)).collect()
}

fn to_device<'a>(
    chunks: &Mutex<impl Iterator<Item = (usize, &'a [u8])>>,
    slots: &mut [PinnedBuf],
    stream: &Stream,
    dst: CUdeviceptr,
    chunk: usize,
    copy: fn(&mut [u8], &[u8]),
    failed: &AtomicBool,
) -> std::result::Result<(), CudaError> {
    let events = slot_events(slots.len())?;
    let mut used = vec![false; slots.len()];
    let mut i = 0;
    while !failed.load(Ordering::Relaxed) {
        let Some((k, part)) = chunks.lock().unwrap_or_else(|p| p.into_inner()).next() else {
            break;
        };
        let s = i % slots.len();
        i += 1;
        if used[s] {
            // The slot's last DMA must be done before it is overwritten.
            events[s].synchronize()?;
        }
        copy(&mut slots[s][..part.len()], part);
        // SAFETY: the slot is pinned and holds part.len() bytes, untouched
        // until its event (recorded next) completes or the stream is
        // synchronised (run does that before the slots go back); the
        // device range was checked to lie in one allocation of this GPU;
        // this thread has the GPU's context current.
        unsafe {
            cuda::memcpy_htod_async(
                dst + (k * chunk) as u64,
                slots[s].as_ptr().cast(),
                part.len(),
                stream.raw(),
            )?;
            events[s].record(stream.raw())?;
        }
        used[s] = true;
    }
    Ok(())
}

fn from_device<'a>(
    chunks: &Mutex<impl Iterator<Item = (usize, &'a mut [u8])>>,
    slots: &mut [PinnedBuf],
    stream: &Stream,
    src: CUdeviceptr,
    chunk: usize,
    failed: &AtomicBool,
) -> std::result::Result<(), CudaError> {
    let events = slot_events(slots.len())?;
    let mut pending: Option<(usize, &mut [u8])> = None;
    let mut i = 0;
    loop {
        let next = if failed.load(Ordering::Relaxed) {
            None
        } else {
            chunks.lock().unwrap_or_else(|p| p.into_inner()).next()
        };
        let issued = match next {
            Some((k, part)) => {
                let s = i % slots.len();
                i += 1;
                if slots.len() == 1 {
                    if let Some((ps, out)) = pending.take() {
                        events[ps].synchronize()?;
                        stream_copy::copy(out, &slots[ps][..out.len()]);
                    }
                }
                // SAFETY: the slot is pinned, holds part.len() bytes and is
                // not read before its event completes (below); with two or
                // more slots, the slot's previous chunk was copied out in
                // an earlier turn (with one, `pending` was drained above);
                // the device range was checked; the context is current.
                unsafe {
                    cuda::memcpy_dtoh_async(
                        slots[s].as_mut_ptr().cast(),
                        src + (k * chunk) as u64,
                        part.len(),
                        stream.raw(),
                    )?;
                    events[s].record(stream.raw())?;
                }
                Some((s, part))
            }
            None => None,
        };
        if let Some((ps, out)) = pending.take() {
            events[ps].synchronize()?;
            stream_copy::copy(out, &slots[ps][..out.len()]);
        }
        pending = issued;
        if pending.is_none() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{sizing, streams, SlotWrites, StagedOptions};

    #[test]
    fn a_copy_takes_no_more_threads_or_slots_than_it_has_chunks() {
        const MIB: usize = 1 << 20;
        let d = StagedOptions::default();
        // 256 MiB on 16 CPUs: 64 chunks of 4 MiB, 16 threads, 2 slots each.
        assert_eq!(sizing(16, 256 * MIB, &d), (4 * MIB, 16, 2));
        // More CPUs than the cap.
        assert_eq!(sizing(64, 256 * MIB, &d), (4 * MIB, 16, 2));
        // 12 MiB: three chunks, three threads, one slot each.
        assert_eq!(sizing(16, 12 * MIB, &d), (4 * MIB, 3, 1));
        // Smaller than a chunk: one chunk of its size, on one thread.
        assert_eq!(sizing(16, 1000, &d), (1000, 1, 1));
        // Explicit threads, and no CPU known.
        assert_eq!(sizing(16, 64 * MIB, &d.with_threads(4)), (4 * MIB, 4, 2));
        assert_eq!(sizing(0, 64 * MIB, &d), (4 * MIB, 1, 2));
    }

    #[test]
    fn auto_writes_slots_through_the_cache_only_when_they_fit_in_half_of_it() {
        const MIB: usize = 1 << 20;
        // 16 threads x 2 slots x 4 MiB beside a 300 MiB L3 (an H100 VM's).
        assert!(!streams(SlotWrites::Auto, 128 * MIB, 300 * MIB));
        assert!(!streams(SlotWrites::Auto, 150 * MIB, 300 * MIB));
        // 8 MiB slots: 256 MiB, more than half.
        assert!(streams(SlotWrites::Auto, 256 * MIB, 300 * MIB));
        // A 32 MiB core-complex L3, and no cache size known at all.
        assert!(streams(SlotWrites::Auto, 128 * MIB, 32 * MIB));
        assert!(streams(SlotWrites::Auto, MIB, 0));
        // An explicit choice is kept whatever the sizes.
        assert!(streams(SlotWrites::Streaming, MIB, 300 * MIB));
        assert!(!streams(SlotWrites::Cached, 256 * MIB, 0));
    }
}
