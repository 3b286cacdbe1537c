//! Reads to a GPU: each worker reads into one of its pinned slots while the
//! DMA of the other runs on its own stream.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::cpulist::CpuList;
use crate::gpu::{CUdeviceptr, CUstream, CudaError, CudaOrdinal};
use crate::platform::cuda::{self, DeviceBuffer, Event, Stream};
use crate::runtime::{AllocOptions, Runtime, Target};

use super::dests::{Batch, Dests};
use super::plan::{self, Plan, Req};
use super::{io, DeviceRange, ReadOptions, ReadReport, Result, Source, SourceRange, StorageError};

/// Device memory numapin allocated (`cuMemAlloc` in the GPU's primary
/// context), freed on drop: what [`Checkpoint::load_to_device`](super::safetensors::Checkpoint::load_to_device)
/// loads into.
#[derive(Debug)]
pub struct DeviceMemory {
    buf: DeviceBuffer,
    gpu: CudaOrdinal,
}

impl DeviceMemory {
    /// `len` bytes (at least one is allocated) on CUDA device `gpu`.
    ///
    /// # Errors
    /// [`StorageError::Cuda`] without a driver, for an unknown device, or
    /// when the GPU's memory is short.
    pub fn new(gpu: CudaOrdinal, len: usize) -> Result<DeviceMemory> {
        let _ctx = cuda::ContextGuard::push(gpu.0)
            .map_err(cuda_error(gpu, "making the context current"))?;
        let buf = DeviceBuffer::new(len).map_err(cuda_error(gpu, "allocating device memory"))?;
        Ok(DeviceMemory { buf, gpu })
    }

    /// The device address of the first byte.
    pub fn ptr(&self) -> CUdeviceptr {
        self.buf.ptr()
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The GPU it is on.
    pub fn gpu(&self) -> CudaOrdinal {
        self.gpu
    }

    /// Copies `dst.len()` bytes at `offset` back to the host (synchronous;
    /// for tests and checks).
    ///
    /// # Errors
    /// [`StorageError::Request`] past the end, [`StorageError::Cuda`] when
    /// the copy fails.
    pub fn read_back(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        if offset.checked_add(dst.len()).is_none_or(|e| e > self.len()) {
            return Err(StorageError::request(
                format!(
                    "reading back {} bytes at {offset} of {} bytes of device memory",
                    dst.len(),
                    self.len()
                ),
                "read back within the allocation",
            ));
        }
        let _ctx = cuda::ContextGuard::push(self.gpu.0)
            .map_err(cuda_error(self.gpu, "making the context current"))?;
        // SAFETY: the device range lies in our allocation (checked above);
        // dst is host memory borrowed mutably for the synchronous copy.
        unsafe {
            cuda::memcpy_dtoh(
                dst.as_mut_ptr().cast(),
                self.ptr() + offset as u64,
                dst.len(),
            )
        }
        .map_err(cuda_error(self.gpu, "copying device memory back"))
    }
}

pub(crate) fn cuda_error(
    gpu: CudaOrdinal,
    what: &'static str,
) -> impl Fn(CudaError) -> StorageError {
    move |source| StorageError::Cuda { gpu, what, source }
}

/// Reads every range of `ranges` (of files `sources`) to device memory on
/// CUDA device `gpu` (see [`read_to_device`](super::read_to_device)); ranges may be in any order.
///
/// # Errors
/// As [`read_to_device`](super::read_to_device); a `source` index out of range is a
/// [`StorageError::Request`].
pub fn read_ranges_to_device(
    rt: &Runtime,
    sources: &[Source],
    ranges: &[DeviceRange],
    gpu: CudaOrdinal,
    opts: &ReadOptions,
) -> Result<ReadReport> {
    // SAFETY: no stream to order after.
    unsafe { read(rt, sources, ranges, gpu, None, opts) }
}

/// [`read_ranges_to_device`], ordered after the work already queued on
/// `stream` (a stream of `gpu`'s primary context, such as a framework's
/// current stream, whose allocator may hand out memory still in use by that
/// work): the copies start only once that work is done. Returns when the
/// bytes are on the device.
///
/// # Errors
/// As [`read_ranges_to_device`].
///
/// # Safety
/// `stream` must be a live stream of `gpu`'s primary context (or null, the
/// legacy default stream) for the whole call.
pub unsafe fn read_ranges_to_device_on(
    rt: &Runtime,
    sources: &[Source],
    ranges: &[DeviceRange],
    gpu: CudaOrdinal,
    stream: CUstream,
    opts: &ReadOptions,
) -> Result<ReadReport> {
    // SAFETY: the caller vouches for the stream.
    unsafe { read(rt, sources, ranges, gpu, Some(stream), opts) }
}

/// Checks that each destination known now lies in one device allocation
/// of `gpu` with its range's bytes (`spans`: `(source, offset, len)`).
fn check_known(dests: &Dests, gpu: CudaOrdinal, spans: &[(usize, u64, usize)]) -> Result<()> {
    for (i, ptr) in dests.known() {
        if spans[i].2 > 0 {
            check_device_range(gpu, ptr, spans[i].2, "destination")?;
        }
    }
    Ok(())
}

/// Checks that `len` bytes at `ptr` lie in one device allocation of `gpu`
/// (`what`: "destination", "source").
pub(crate) fn check_device_range(
    gpu: CudaOrdinal,
    ptr: CUdeviceptr,
    len: usize,
    what: &str,
) -> Result<()> {
    let a = cuda::device_range(ptr).map_err(|e| {
        StorageError::request(
            format!("the {what} {ptr:#x} on GPU {gpu} is not device memory: {e}"),
            "pass a pointer from cuMemAlloc (or a framework's device tensor) on that GPU",
        )
    })?;
    if a.ordinal != gpu.0 {
        return Err(StorageError::request(
            format!("the {what} {ptr:#x} is on GPU {}, not GPU {gpu}", a.ordinal),
            format!("name GPU {} (the CUDA ordinal the memory is on)", a.ordinal),
        ));
    }
    if ptr + len as u64 > a.start + a.size as u64 {
        return Err(StorageError::request(
            format!(
                "{len} bytes at {ptr:#x} run past the end of their device allocation ({} bytes at {:#x})",
                a.size, a.start
            ),
            "stay within the allocation",
        ));
    }
    Ok(())
}

/// An event recorded now on the caller's `stream` of `gpu`.
///
/// # Safety
/// `stream` is a live stream of `gpu`'s primary context (or null).
pub(crate) unsafe fn event_on(gpu: CudaOrdinal, stream: CUstream) -> Result<Event> {
    let e = Event::new(false).map_err(cuda_error(gpu, "creating an event"))?;
    // SAFETY: per this function's contract; the event is of the current
    // (primary) context, pushed by the caller.
    unsafe { e.record(stream) }
        .map_err(cuda_error(gpu, "recording an event on the caller's stream"))?;
    Ok(e)
}

/// Everything a worker needs.
struct Job<'a> {
    sources: &'a [Source],
    plan: Plan,
    gpu: CudaOrdinal,
    io: super::IoMode,
    next: AtomicUsize,
    failed: AtomicBool,
    dests: &'a Dests,
    /// Recorded on the caller's stream (again after each batch of
    /// destinations that come during the read): a worker's copies wait for
    /// it.
    after: Option<Event>,
    /// Each worker's slots: parts of one staging buffer.
    slots: Mutex<Vec<Vec<&'a mut [u8]>>>,
}

impl Job<'_> {
    /// Stops the read: the workers take no more pieces, and those waiting
    /// for a destination wake.
    fn stop(&self) {
        self.failed.store(true, Ordering::SeqCst);
        self.dests.wake();
    }
}

/// The read of [`read_ranges_to_device_on`], after `after` when given.
///
/// # Safety
/// `after`, when given, is a live stream of `gpu`'s primary context (or
/// null) for the whole call.
unsafe fn read(
    rt: &Runtime,
    sources: &[Source],
    ranges: &[DeviceRange],
    gpu: CudaOrdinal,
    after: Option<CUstream>,
    opts: &ReadOptions,
) -> Result<ReadReport> {
    let spans: Vec<(usize, u64, usize)> =
        ranges.iter().map(|r| (r.source, r.offset, r.len)).collect();
    let dests = Dests::all(ranges.iter().map(|r| r.dst));
    // SAFETY: per this function's contract.
    unsafe { read_with(rt, sources, &spans, gpu, after, opts, &dests, |_| Ok(())) }
}

/// [`read_ranges_to_device_on`] with each range's destination made while
/// the workers read: `dest(i)` is called on the calling thread for each
/// range `i` of `ranges` in turn (also when there is nothing to read, but
/// not after the read has failed), and each range's copies wait for its
/// destination and, as for [`read_ranges_to_device_on`], for the work
/// queued on `stream` until it was made (the destinations reach the
/// workers in small batches, each after the work queued until its last was
/// made). For a caller whose destinations take time to make, such as a
/// framework allocating tensors one by one: that time overlaps the reads.
/// Returns when the bytes are on the device.
///
/// # Errors
/// As [`read_ranges_to_device_on`] (a destination that is not `len` bytes
/// of one device allocation of `gpu` is a [`StorageError::Request`]), and
/// the first error `dest` returns; either way, no copy is still running
/// when this returns.
///
/// The workers take the reads in file order, so ranges given in file
/// order (as [`Checkpoint::select`](super::safetensors::Checkpoint::select)
/// gives tensors) overlap best; in another order a worker may wait for
/// most destinations before its first copy.
///
/// # Safety
/// `stream` must be a live stream of `gpu`'s primary context (or null,
/// the legacy default stream) for the whole call; each destination `dest`
/// returns must stay allocated until the call returns; `dest` must leave
/// the calling thread's current CUDA context as it found it (torch's
/// allocator does).
pub unsafe fn read_ranges_to_device_as_made<E: From<StorageError>>(
    rt: &Runtime,
    sources: &[Source],
    ranges: &[SourceRange],
    gpu: CudaOrdinal,
    stream: CUstream,
    opts: &ReadOptions,
    mut dest: impl FnMut(usize) -> std::result::Result<CUdeviceptr, E>,
) -> std::result::Result<ReadReport, E> {
    let spans: Vec<(usize, u64, usize)> =
        ranges.iter().map(|r| (r.source, r.offset, r.len)).collect();
    let dests = Dests::pending(ranges.len());
    // Made destinations go to the workers in batches, each after one event
    // record on the caller's stream (recorded after all of them were made).
    let publish = |job: Option<&Job<'_>>, batch: &mut Batch| -> Result<()> {
        if let Some(e) = job.and_then(|j| j.after.as_ref()) {
            // SAFETY: the caller's stream (per this function's contract)
            // and our event, of the context current here (pushed by
            // read_with; `dest` leaves it so, per the contract).
            unsafe { e.record(stream) }
                .map_err(cuda_error(gpu, "recording an event on the caller's stream"))?;
        }
        batch.publish(&dests);
        Ok(())
    };
    let feed = |job: Option<&Job<'_>>| -> std::result::Result<(), E> {
        let mut batch = Batch::default();
        for (i, r) in ranges.iter().enumerate() {
            if job.is_some_and(|j| j.failed.load(Ordering::SeqCst)) {
                break;
            }
            let ptr = dest(i)?;
            if job.is_some() && r.len > 0 {
                check_device_range(gpu, ptr, r.len, "destination")?;
            }
            if batch.add(ptr, r.len, dests.wanted(), i + 1 == ranges.len()) {
                publish(job, &mut batch)?;
            }
        }
        Ok(())
    };
    // SAFETY: per this function's contract.
    unsafe { read_with(rt, sources, &spans, gpu, Some(stream), opts, &dests, feed) }
}

/// The read of `spans` (`(source, offset, len)`) to `dests`, after
/// `after` when given; `feed` runs on the calling thread while the workers
/// read (with no job when there is nothing to read), giving the
/// destinations not yet known. Its error stops the workers and is the
/// call's.
///
/// # Safety
/// `after`, when given, is a live stream of `gpu`'s primary context (or
/// null) for the whole call.
#[allow(clippy::too_many_arguments)]
unsafe fn read_with<E: From<StorageError>>(
    rt: &Runtime,
    sources: &[Source],
    spans: &[(usize, u64, usize)],
    gpu: CudaOrdinal,
    after: Option<CUstream>,
    opts: &ReadOptions,
    dests: &Dests,
    feed: impl FnOnce(Option<&Job<'_>>) -> std::result::Result<(), E>,
) -> std::result::Result<ReadReport, E> {
    let (place, mut report) = super::prepare(rt, sources, spans, Target::Gpu(gpu), opts)?;
    if report.bytes == 0 {
        feed(None)?;
        return Ok(report);
    }
    let started = Instant::now();
    let _ctx =
        cuda::ContextGuard::push(gpu.0).map_err(cuda_error(gpu, "making the context current"))?;
    check_known(dests, gpu, spans)?;
    let lay = layout(rt, sources, spans, &place.cpus, opts);
    report.chunk_bytes = lay.chunk;
    // One staging buffer, in a region of its own size when one is made:
    // the slots pin no more than they hold. No waiting over budget: the
    // caller gets the budget error at once.
    let bytes = lay.threads * lay.per_thread * lay.slot;
    let mut staging = rt
        .alloc_with(
            Target::HostNode(place.node),
            bytes,
            &AllocOptions::default()
                .with_staging(true)
                .with_wait(Some(std::time::Duration::ZERO)),
        )
        .map_err(StorageError::from)?;
    if !staging.is_registered() {
        report.warnings.push(format!(
            "the slots on node {} are not registered with CUDA, so every copy waits for its DMA (check RuntimeConfig::register)",
            place.node
        ));
    }
    let mut chunks = staging.chunks_mut(lay.slot);
    let groups: Vec<Vec<&mut [u8]>> = (0..lay.threads)
        .map(|_| chunks.by_ref().take(lay.per_thread).collect())
        .collect();
    let after = match after {
        // SAFETY: per this function's contract.
        Some(s) => Some(unsafe { event_on(gpu, s) }?),
        None => None,
    };
    report.staging_bytes = bytes as u64;
    report.threads = lay.threads;
    let job = Job {
        sources,
        plan: lay.plan,
        gpu,
        io: opts.io,
        next: AtomicUsize::new(0),
        failed: AtomicBool::new(false),
        dests,
        after,
        slots: Mutex::new(groups),
    };
    let (counts, fed) = run_job(&job, lay.threads, &place.cpus, feed);
    fed?;
    counts?.into_iter().for_each(|c| report.add(c));
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// How a read is cut: its plan, chunk, slot size, threads and slots per
/// thread.
struct Layout {
    plan: Plan,
    chunk: usize,
    slot: usize,
    threads: usize,
    per_thread: usize,
}

/// The reads of `spans` (`(source, offset, len)`) by workers on `cpus`.
fn layout(
    rt: &Runtime,
    sources: &[Source],
    spans: &[(usize, u64, usize)],
    cpus: &CpuList,
    opts: &ReadOptions,
) -> Layout {
    let chunk = super::chunk_for(
        rt,
        opts,
        cpus,
        super::thread_count(opts, cpus.len(), usize::MAX),
    );
    let slot = super::slot_bytes(sources, chunk);
    let reqs: Vec<Req> = spans
        .iter()
        .map(|&(source, offset, len)| Req {
            source,
            offset,
            len,
        })
        .collect();
    let plan = plan::pieces(&reqs, |s| sources[s].alignment(), slot, super::MAX_GAP);
    let threads = super::thread_count(opts, cpus.len(), plan.pieces.len());
    let per_thread = opts
        .slots_per_thread
        .min(plan.pieces.len().div_ceil(threads))
        .max(1);
    Layout {
        plan,
        chunk,
        slot,
        threads,
        per_thread,
    }
}

/// Runs `job`'s `threads` workers on `cpus` and `feed` on the calling
/// thread meanwhile; an error (or a panic) of either stops the other side.
fn run_job<E>(
    job: &Job<'_>,
    threads: usize,
    cpus: &CpuList,
    feed: impl FnOnce(Option<&Job<'_>>) -> std::result::Result<(), E>,
) -> (Result<Vec<io::Counts>>, std::result::Result<(), E>) {
    super::run_threads_beside(
        "read",
        threads,
        cpus,
        |_| {
            let slots = job
                .slots
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop()
                .unwrap_or_default();
            let r = worker(job, slots);
            if r.is_err() {
                job.stop();
            }
            r
        },
        || {
            // A panic in `feed` must not leave workers waiting for
            // destinations while the scope waits for them.
            let _stop = StopOnUnwind(job);
            let r = feed(Some(job));
            if r.is_err() {
                job.stop();
            }
            r
        },
    )
}

/// Stops its job when dropped by a panic.
struct StopOnUnwind<'a, 'b>(&'a Job<'b>);

impl Drop for StopOnUnwind<'_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.stop();
        }
    }
}

/// One worker: takes the next read, waits for the slot's last DMA, reads
/// into it and queues its copies; the stream is synchronised before the
/// slots go back, whatever happened.
fn worker(job: &Job<'_>, mut slots: Vec<&mut [u8]>) -> Result<io::Counts> {
    let gpu = job.gpu;
    if slots.is_empty() {
        return Ok(io::Counts::default());
    }
    cuda::set_device(gpu.0).map_err(cuda_error(gpu, "making the context current"))?;
    let stream = Stream::new().map_err(cuda_error(gpu, "creating a stream"))?;
    let r = pieces(job, &mut slots, &stream);
    // Nothing may still read a slot when it goes back.
    let synced = stream
        .synchronize()
        .map_err(cuda_error(gpu, "waiting for the copies"));
    drop(slots);
    let c = r?;
    synced?;
    Ok(c)
}

/// Before a piece's copies: waits until the destinations of its ranges
/// are known (`false`: the read stopped) and, for any that came since this
/// worker last looked (`known`: how many it saw), orders its stream after
/// the caller's stream as it was when they came.
fn await_destinations(
    job: &Job<'_>,
    p: &plan::Piece,
    known: &mut usize,
    stream: &Stream,
) -> Result<bool> {
    if p.last_req < *known {
        return Ok(true);
    }
    let Some(now) = job.dests.wait_for(p.last_req, &job.failed) else {
        return Ok(false);
    };
    *known = now;
    if let Some(after) = &job.after {
        // SAFETY: our stream and the caller's event, both alive, of the
        // same (primary) context; the event was recorded after those
        // destinations came (or once, before the read, when all were
        // known).
        unsafe { cuda::stream_wait_event(stream.raw(), after.raw()) }
            .map_err(cuda_error(job.gpu, "ordering after the caller's stream"))?;
    }
    Ok(true)
}

fn pieces(job: &Job<'_>, slots: &mut [&mut [u8]], stream: &Stream) -> Result<io::Counts> {
    let gpu = job.gpu;
    let events = (0..slots.len())
        .map(|_| Event::new(false))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(cuda_error(gpu, "creating events"))?;
    let mut used = vec![false; slots.len()];
    let mut counts = io::Counts::default();
    let mut known = 0;
    let mut i = 0;
    while !job.failed.load(Ordering::Relaxed) {
        let k = job.next.fetch_add(1, Ordering::Relaxed);
        let Some(p) = job.plan.pieces.get(k) else {
            break;
        };
        let s = i % slots.len();
        i += 1;
        if used[s] {
            // The slot's last DMA must be done before it is overwritten.
            events[s]
                .synchronize()
                .map_err(cuda_error(gpu, "waiting for a copy"))?;
        }
        let src = &job.sources[p.source];
        counts.add(io::read_exact_at(
            src, p.start, slots[s], p.need, job.io, None,
        )?);
        if !await_destinations(job, p, &mut known, stream)? {
            break;
        }
        for seg in &job.plan.segments[p.segs.clone()] {
            // SAFETY: the slot is pinned and holds seg.slot_off + seg.len
            // bytes (the plan keeps segments within the piece), untouched
            // until its event (recorded next) completes or the stream is
            // synchronised (the worker does before the slots go back);
            // the destination was checked to lie in one allocation of this
            // GPU, whose context is current on this thread.
            unsafe {
                cuda::memcpy_htod_async(
                    job.dests.of(seg),
                    slots[s].as_ptr().add(seg.slot_off).cast(),
                    seg.len,
                    stream.raw(),
                )
            }
            .map_err(cuda_error(gpu, "queueing a copy to the device"))?;
        }
        // SAFETY: our stream, of the context current here.
        unsafe { events[s].record(stream.raw()) }.map_err(cuda_error(gpu, "recording an event"))?;
        used[s] = true;
    }
    Ok(counts)
}
