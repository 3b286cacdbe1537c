//! The copy engine: one thread per loader with the GPU's context current
//! and its own non-blocking stream, copying filled slots into the device
//! ring in order and handing batches to the consumer.

use std::collections::VecDeque;
use std::sync::MutexGuard;
use std::time::Duration;

use crate::gpu::{CudaError, CudaOrdinal};
use crate::platform::cuda::{self, DeviceBuffer, Event, Stream};
use crate::runtime::PinnedBuf;

use super::{
    Delivery, GpuSide, LoaderConfig, LoaderError, Order, Produced, Result, RingEntry, Shared,
    State, MAX_CONSUMER_STREAMS,
};

/// The GPU half of a loader: its copy stream and device ring.
pub(super) fn gpu_side(ordinal: CudaOrdinal, cfg: &LoaderConfig) -> Result<GpuSide> {
    let err = |what| move |e| LoaderError::cuda_setup(ordinal, what, e);
    cuda::driver_version().map_err(err("loading the CUDA driver"))?;
    let _ctx = cuda::ContextGuard::push(ordinal.0).map_err(err("making its context current"))?;
    let stream = Stream::new().map_err(err("creating the copy stream"))?;
    let mut ring = Vec::with_capacity(cfg.ring);
    for _ in 0..cfg.ring {
        let buf = DeviceBuffer::new(cfg.batch_bytes).map_err(err("allocating the device ring"))?;
        let copied = Event::new(false).map_err(err("creating events"))?;
        let release = (0..MAX_CONSUMER_STREAMS)
            .map(|_| Event::new(false))
            .collect::<cuda::CudaResult<Vec<_>>>()
            .map_err(err("creating events"))?;
        ring.push(RingEntry {
            buf,
            copied,
            release,
        });
    }
    Ok(GpuSide {
        ordinal,
        stream,
        ring,
    })
}

/// How long the copy engine sleeps between looks at copies in flight when
/// nothing else wakes it.
const POLL: Duration = Duration::from_micros(100);

pub(super) fn run_engine(shared: &Shared, started: bool) {
    let mut in_flight: VecDeque<(PinnedBuf, usize)> = VecDeque::new();
    if started {
        engine_loop(shared, &mut in_flight);
    }
    // Wait for every copy still running before its slot can be reused or
    // given back to the arena.
    let mut back = Vec::new();
    for (slot, entry) in in_flight.drain(..) {
        if let Some(g) = &shared.gpu {
            let _ = g.ring[entry].copied.synchronize();
        }
        back.push(slot);
    }
    let mut st = shared.lock();
    st.free_slots.extend(back);
    if !started {
        st.stop = true;
    }
    drop(st);
    shared.slot_free.notify_all();
    shared.delivered.notify_all();
}

fn engine_loop(shared: &Shared, in_flight: &mut VecDeque<(PinnedBuf, usize)>) {
    let order = shared.cfg.order;
    let mut next = 0u64;
    let mut st = shared.lock();
    loop {
        // Slots whose copies have completed go back to the pool (events on
        // one stream complete in order).
        let mut returned = 0;
        while let Some((_, entry)) = in_flight.front() {
            let g = shared
                .gpu
                .as_ref()
                .expect("copies in flight only in GPU mode");
            if !g.ring[*entry].copied.is_complete().unwrap_or(true) {
                break;
            }
            let (slot, _) = in_flight.pop_front().expect("front exists");
            st.free_slots.push(slot);
            returned += 1;
        }
        if returned > 0 {
            shared.slot_free.notify_all();
        }
        if st.stop {
            return;
        }
        let pick = match order {
            Order::Index => st.ready.contains_key(&next).then_some(next),
            Order::Completion => st.ready.keys().next().copied(),
        };
        let Some(index) = pick else {
            if st.workers_running == 0 {
                // Nothing more can come.
                st.out.push_back(Delivery::End);
                shared.delivered.notify_all();
                return;
            }
            st = engine_wait(shared, st, !in_flight.is_empty());
            continue;
        };
        let data = matches!(st.ready[&index], Produced::Data { .. });
        let gpu = shared.gpu.as_ref();
        if data && gpu.is_some() && st.free_ring.is_empty() {
            st.engine_waits += 1;
            st = engine_wait(shared, st, !in_flight.is_empty());
            continue;
        }
        let item = st.ready.remove(&index).expect("picked from ready");
        next = index + 1;
        match (item, gpu) {
            (Produced::Failed(e), _) => {
                st.failed = true;
                st.out.push_back(Delivery::Failed(e));
                st.out.push_back(Delivery::End);
                shared.delivered.notify_all();
                shared.slot_free.notify_all();
                return;
            }
            (Produced::Data { slot, len }, None) => {
                st.out.push_back(Delivery::Host { index, slot, len });
                shared.delivered.notify_one();
            }
            (Produced::Data { slot, len }, Some(g)) => {
                let (entry, releases) = st.free_ring.pop().expect("checked above");
                drop(st);
                let r = issue_copy(g, entry, releases, &slot, len);
                st = shared.lock();
                match r {
                    Ok(()) => {
                        in_flight.push_back((slot, entry));
                        st.out.push_back(Delivery::Device { index, entry, len });
                        shared.delivered.notify_one();
                    }
                    Err((what, error)) => {
                        // Nothing of this copy may still read the slot.
                        drop(st);
                        let _ = g.stream.synchronize();
                        st = shared.lock();
                        st.free_slots.push(slot);
                        st.free_ring.push((entry, 0));
                        st.failed = true;
                        st.out.push_back(Delivery::Failed(LoaderError::Cuda {
                            index,
                            gpu: g.ordinal,
                            what,
                            source: error,
                        }));
                        st.out.push_back(Delivery::End);
                        shared.delivered.notify_all();
                        shared.slot_free.notify_all();
                        return;
                    }
                }
            }
        }
    }
}

fn engine_wait<'a>(
    shared: &'a Shared,
    st: MutexGuard<'a, State>,
    copies: bool,
) -> MutexGuard<'a, State> {
    if copies {
        // Copies in flight: look again soon to give their slots back.
        shared
            .engine_wake
            .wait_timeout(st, POLL)
            .unwrap_or_else(|p| p.into_inner())
            .0
    } else {
        shared
            .engine_wake
            .wait(st)
            .unwrap_or_else(|p| p.into_inner())
    }
}

/// Queues the copy of `len` bytes of `slot` into ring entry `entry`, after
/// the consumer's work on its previous batch (`releases` events), and
/// records the entry's copy event.
fn issue_copy(
    g: &GpuSide,
    entry: usize,
    releases: usize,
    slot: &PinnedBuf,
    len: usize,
) -> std::result::Result<(), (&'static str, CudaError)> {
    let e = &g.ring[entry];
    let s = g.stream.raw();
    for r in &e.release[..releases] {
        // SAFETY: the copy stream and the event are ours and alive.
        unsafe { cuda::stream_wait_event(s, r.raw()) }.map_err(|x| ("cuStreamWaitEvent", x))?;
    }
    if len > 0 {
        // SAFETY: the slot holds at least len bytes and is not reused
        // before the event recorded below has completed (the engine keeps
        // it in flight); the device buffer holds batch_bytes >= len bytes
        // and is not handed out again before the consumer drops this
        // batch; the copy engine thread has the GPU's context current.
        unsafe { cuda::memcpy_htod_async(e.buf.ptr(), slot.as_ptr().cast(), len, s) }
            .map_err(|x| ("cuMemcpyHtoDAsync", x))?;
    }
    // SAFETY: the stream and event are of the same context and alive.
    unsafe { e.copied.record(s) }.map_err(|x| ("cuEventRecord", x))
}
