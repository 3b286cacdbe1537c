//! The writers: each fills its pinned slots in turn (device parts by DMA
//! on a stream of the worker's own per GPU, host parts by memcpy) and
//! writes the oldest filled slot while the copies into the others run.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::gpu::CudaOrdinal;
use crate::platform::cuda::{self, ContextGuard, Event, Stream};

use super::super::device::cuda_error;
use super::super::{IoMode, Result};
use super::io::{Counts, Dest};
use super::plan::{Chunk, Layout};
use super::Data;

/// Everything the writers share.
pub(super) struct Job<'a> {
    pub(crate) dests: &'a [Dest],
    pub(crate) layouts: Vec<Layout>,
    pub(crate) parts: Vec<&'a [Data<'a>]>,
    pub(crate) chunks: Vec<Chunk>,
    pub(crate) io: IoMode,
    pub(crate) next: AtomicUsize,
    pub(crate) failed: AtomicBool,
    /// Events recorded on the callers' streams, per GPU: the copies from
    /// that GPU wait for them.
    pub(crate) after: Vec<(CudaOrdinal, Event)>,
    /// Each writer's slots: parts of one staging buffer.
    pub(crate) slots: Mutex<Vec<Vec<&'a mut [u8]>>>,
}

/// One GPU's stream of a writer, with an event per slot.
struct Lane {
    gpu: CudaOrdinal,
    stream: Stream,
    events: Vec<Event>,
}

/// A writer: takes its slots, fills and writes chunks until there are none
/// (or another writer failed); its streams are synchronised before the
/// slots go back, whatever happened.
pub(super) fn worker(job: &Job<'_>) -> Result<Counts> {
    let mut slots = job
        .slots
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .pop()
        .unwrap_or_default();
    if slots.is_empty() {
        return Ok(Counts::default());
    }
    let mut lanes = Vec::new();
    let r = run(job, &mut slots, &mut lanes);
    if r.is_err() {
        job.failed.store(true, Ordering::SeqCst);
    }
    // Nothing may still write a slot when it goes back.
    let mut synced = Ok(());
    for l in &lanes {
        if let Err(e) = l.stream.synchronize() {
            synced = Err(cuda_error(l.gpu, "waiting for the copies")(e));
        }
    }
    drop(slots);
    let c = r?;
    synced?;
    Ok(c)
}

fn run(job: &Job<'_>, slots: &mut [&mut [u8]], lanes: &mut Vec<Lane>) -> Result<Counts> {
    let n = slots.len();
    let mut counts = Counts::default();
    // Filled slots in the order they were filled: (slot, chunk, lanes to
    // wait for).
    let mut filled: VecDeque<(usize, usize, Vec<usize>)> = VecDeque::with_capacity(n);
    let mut fills = 0usize;
    loop {
        while filled.len() < n && !job.failed.load(Ordering::Relaxed) {
            let k = job.next.fetch_add(1, Ordering::Relaxed);
            if k >= job.chunks.len() {
                break;
            }
            // The oldest slot: written already (first in, first out).
            let s = fills % n;
            fills += 1;
            let waits = fill(job, k, &mut *slots[s], s, n, lanes)?;
            filled.push_back((s, k, waits));
        }
        let Some((s, k, waits)) = filled.pop_front() else {
            break;
        };
        for &l in &waits {
            let lane = &lanes[l];
            lane.events[s]
                .synchronize()
                .map_err(cuda_error(lane.gpu, "waiting for a copy"))?;
        }
        if job.failed.load(Ordering::Relaxed) {
            break;
        }
        let c = job.chunks[k];
        counts.add(job.dests[c.file].write_at(c.offset, &slots[s][..c.len], job.io)?);
    }
    Ok(counts)
}

/// Fills slot `s` with chunk `k`: host parts copied now, device parts
/// queued on the lanes of their GPUs; returns the lanes whose event (of
/// slot `s`) marks the end of the copies.
fn fill(
    job: &Job<'_>,
    k: usize,
    slot: &mut [u8],
    s: usize,
    nslots: usize,
    lanes: &mut Vec<Lane>,
) -> Result<Vec<usize>> {
    let c = job.chunks[k];
    let mut waits = Vec::new();
    for (part, in_part, at, len) in job.layouts[c.file].segments(c.offset, c.len) {
        match job.parts[c.file][part] {
            Data::Host(b) => {
                let from = crate::num::usize_from(in_part);
                slot[at..at + len].copy_from_slice(&b[from..from + len]);
            }
            Data::Device { gpu, ptr, .. } => {
                let l = lane(job, lanes, gpu, nslots)?;
                let _ctx = ContextGuard::push(gpu.0)
                    .map_err(cuda_error(gpu, "making the context current"))?;
                // SAFETY: the slot is pinned host memory holding at + len
                // bytes (the plan keeps segments within the chunk), not
                // touched by the host until the slot's event (recorded
                // below) completes or the stream is synchronised (the
                // writer does before the slots go back); the source range
                // was checked to lie in one allocation of this GPU, which
                // the caller keeps alive for the call; the lane's stream
                // is of this GPU's primary context, current here.
                unsafe {
                    cuda::memcpy_dtoh_async(
                        slot.as_mut_ptr().add(at).cast(),
                        ptr + in_part,
                        len,
                        lanes[l].stream.raw(),
                    )
                }
                .map_err(cuda_error(gpu, "queueing a copy from the device"))?;
                if !waits.contains(&l) {
                    waits.push(l);
                }
            }
        }
    }
    for &l in &waits {
        let lane = &lanes[l];
        let _ctx = ContextGuard::push(lane.gpu.0)
            .map_err(cuda_error(lane.gpu, "making the context current"))?;
        // SAFETY: the lane's own stream, of the context current here.
        unsafe { lane.events[s].record(lane.stream.raw()) }
            .map_err(cuda_error(lane.gpu, "recording an event"))?;
    }
    Ok(waits)
}

/// The writer's lane for `gpu`, made on first use: a stream of its own
/// (after the caller's event for that GPU, when there is one) and an
/// event per slot.
fn lane(job: &Job<'_>, lanes: &mut Vec<Lane>, gpu: CudaOrdinal, nslots: usize) -> Result<usize> {
    if let Some(i) = lanes.iter().position(|l| l.gpu == gpu) {
        return Ok(i);
    }
    let _ctx = ContextGuard::push(gpu.0).map_err(cuda_error(gpu, "making the context current"))?;
    let stream = Stream::new().map_err(cuda_error(gpu, "creating a stream"))?;
    if let Some((_, after)) = job.after.iter().find(|(g, _)| *g == gpu) {
        // SAFETY: our stream and the caller's event, both alive, of the
        // same (primary) context.
        unsafe { cuda::stream_wait_event(stream.raw(), after.raw()) }
            .map_err(cuda_error(gpu, "ordering after the caller's stream"))?;
    }
    let events = (0..nslots)
        .map(|_| Event::new(false))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(cuda_error(gpu, "creating events"))?;
    lanes.push(Lane {
        gpu,
        stream,
        events,
    });
    Ok(lanes.len() - 1)
}
