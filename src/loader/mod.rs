//! Per-GPU loaders: batches produced on the GPU's own socket and copied to
//! the GPU behind the consumer's compute.
//!
//! A [`Loader`] runs N worker threads bound to the CPUs near its GPU. Each
//! takes a free pinned *slot* (from the GPU's node arena), then the next
//! batch index, and fills the slot through the user's producer. A copy
//! engine thread owning a dedicated non-blocking CUDA stream copies each
//! filled slot into a free buffer of a ring of device buffers
//! (`cuMemcpyHtoDAsync`) and records an event after it; the consumer gets
//! the device pointer, the length, the index and the event, and makes its
//! own stream wait on the event ([`Batch::wait_on`], `cuStreamWaitEvent`,
//! never a host synchronisation). A slot goes back to the pool when its
//! copy's event has completed; a device buffer when the consumer drops the
//! batch (after the work the consumer queued on it, see [`Batch::wait_on`]).
//!
//! In host mode the same pipeline delivers the pinned slots themselves
//! ([`Batch::host_bytes`]), for CPU consumers and machines without a GPU.
//!
//! Memory is bounded: `depth` pinned slots of `batch_bytes` on the node and
//! `ring` device buffers of `batch_bytes` on the GPU
//! ([`Loader::memory_bound`]); producers block when no slot is free, the
//! copy engine when no device buffer is. See `docs/loader.md`.
//!
//! In host mode, on any machine:
//!
//! ```
//! use numapin::loader::{Loader, LoaderConfig, Target};
//! use numapin::topology::{CudaMode, ProbeOptions};
//! use numapin::{Runtime, RuntimeConfig, Topology};
//!
//! let topo = Topology::probe(&ProbeOptions::from_process().with_cuda(CudaMode::Off))?;
//! let rt = Runtime::new(topo, RuntimeConfig::default().with_region_bytes(2 << 20))?;
//! // 8 batches of 64 KiB, made by 2 workers on the CPUs of this thread's node.
//! let node = Target::HostNode(rt.calling_thread_node());
//! let config = LoaderConfig::new(64 << 10)
//!     .with_workers(2)
//!     .with_total_batches(Some(8));
//! let loader = Loader::new(&rt, node, config, |index, slot: &mut [u8]| {
//!     let n = 1000 + usize::try_from(index).unwrap_or(0);
//!     slot[..n].fill(index.to_le_bytes()[0]);
//!     Ok::<usize, std::io::Error>(n) // the batch's length
//! })?;
//! let mut seen = 0;
//! for batch in loader.iter() {
//!     let batch = batch?;
//!     let bytes = batch.host_bytes().expect("host mode hands out the slots");
//!     assert_eq!(bytes.len(), 1000 + seen);
//!     assert!(bytes.iter().all(|&b| u64::from(b) == batch.index()));
//!     seen += 1;
//! }
//! assert_eq!(seen, 8);
//! # Ok::<(), numapin::Error>(())
//! ```
//!
//! With a GPU, each batch is copied to device memory behind the compute:
//!
//! ```no_run
//! use numapin::loader::{Loader, LoaderConfig, Target};
//! use numapin::CudaOrdinal;
//! # fn main() -> numapin::Result<()> {
//! # let rt = numapin::Runtime::new(numapin::Topology::probe(&Default::default())?, Default::default())?;
//! let gpu = Target::Gpu(CudaOrdinal(0));
//! let loader = Loader::new(&rt, gpu, LoaderConfig::new(64 << 20), |index, slot: &mut [u8]| {
//!     slot.fill(index as u8);
//!     Ok::<usize, std::io::Error>(slot.len())
//! })?;
//! for batch in loader.iter().take(100) {
//!     let mut batch = batch?;
//!     // SAFETY: `compute` is a live stream of GPU 0 that outlives the batch.
//!     # let compute: numapin::gpu::CUstream = std::ptr::null_mut();
//!     unsafe { batch.wait_on(compute)? };
//!     // launch kernels reading batch.device_ptr() on `compute` ...
//! }
//! # Ok(()) }
//! ```

mod batch;
mod config;
mod engine;
mod error;
mod worker;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::cpulist::CpuList;
use crate::gpu::CudaOrdinal;
use crate::platform::cuda::{DeviceBuffer, Event, Stream};
use crate::runtime::{PinnedBuf, Runtime};

use batch::BatchData;

/// What a loader feeds: the runtime's placement [`Target`] (re-exported
/// here, where loaders are made).
pub use crate::runtime::Target;
pub use batch::{Batch, Batches};
pub use config::{
    LoaderConfig, Order, DEFAULT_BATCH_BYTES, DEFAULT_RING, MAX_AUTO_WORKERS, MAX_CONSUMER_STREAMS,
};
pub use error::{BoxError, LoaderError};

type Result<T, E = LoaderError> = std::result::Result<T, E>;

/// Counters of a running loader.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct LoaderStats {
    /// Producer calls that returned (with data or an error).
    pub produced: u64,
    /// Batches handed to the consumer.
    pub delivered: u64,
    /// Times a worker found no free slot and waited for one.
    pub producer_waits: u64,
    /// Workers waiting for a free slot right now.
    pub workers_blocked: usize,
    /// Times the copy engine had a filled slot but no free device buffer.
    pub engine_waits: u64,
    /// Pinned slots.
    pub slots: usize,
    /// Pinned slots free right now.
    pub slots_free: usize,
    /// Device buffers (0 in host mode).
    pub ring: usize,
    /// Device buffers free right now.
    pub ring_free: usize,
    /// Batches the consumer holds right now.
    pub held_by_consumer: usize,
}

/// The most memory a loader uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MemoryBound {
    /// Pinned host bytes: `depth` slots (each `batch_bytes` rounded up to
    /// the arena's alignment), taken at start and held until drop.
    pub pinned_bytes: u64,
    /// Device bytes: `ring` buffers of `batch_bytes` (0 in host mode).
    pub device_bytes: u64,
}

type Producer = dyn Fn(u64, &mut [u8]) -> std::result::Result<usize, BoxError> + Send + Sync;

/// One device buffer of the ring, its copy event and the events the
/// consumer's streams record when it drops the batch.
pub(super) struct RingEntry {
    buf: DeviceBuffer,
    copied: Event,
    release: Vec<Event>,
}

pub(super) struct GpuSide {
    ordinal: CudaOrdinal,
    stream: Stream,
    ring: Vec<RingEntry>,
}

pub(super) enum Produced {
    Data { slot: PinnedBuf, len: usize },
    Failed(LoaderError),
}

pub(super) enum Delivery {
    Host {
        index: u64,
        slot: PinnedBuf,
        len: usize,
    },
    Device {
        index: u64,
        entry: usize,
        len: usize,
    },
    Failed(LoaderError),
    End,
}

#[derive(Default)]
pub(super) struct State {
    free_slots: Vec<PinnedBuf>,
    ready: BTreeMap<u64, Produced>,
    /// Free device buffers and how many release events each carries.
    free_ring: Vec<(usize, usize)>,
    out: VecDeque<Delivery>,
    held: usize,
    /// The loader is being dropped.
    stop: bool,
    /// A batch failed: workers take no new index.
    failed: bool,
    /// The consumer has seen the end of the stream.
    ended: bool,
    workers_running: usize,
    workers_blocked: usize,
    produced: u64,
    delivered: u64,
    producer_waits: u64,
    engine_waits: u64,
}

pub(super) struct Shared {
    state: Mutex<State>,
    /// Workers wait here for a free slot.
    slot_free: Condvar,
    /// The copy engine waits here for a filled slot, a free device buffer,
    /// the end of the workers or the stop.
    engine_wake: Condvar,
    /// The consumer waits here for a delivery.
    delivered: Condvar,
    next_index: AtomicU64,
    producer: Box<Producer>,
    cfg: LoaderConfig,
    gpu: Option<GpuSide>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No user code runs under the lock: a poisoned lock holds
        // consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A per-GPU (or host-mode) loader; see the module docs. Dropping it stops
/// the workers (a producer call in progress runs to its end), waits for
/// copies in flight and gives every slot and device buffer back.
pub struct Loader {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    worker_tids: Vec<i32>,
    target: Target,
    cpus: CpuList,
    node: u32,
    warnings: Vec<String>,
    slot_bytes: u64,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("target", &self.target)
            .field("config", &self.shared.cfg)
            .field("cpus", &self.cpus)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Loader {
    /// The CUDA device batches are copied to (ordinal 0 in host mode, where
    /// no CUDA call is made).
    fn gpu_ordinal(&self) -> CudaOrdinal {
        self.shared
            .gpu
            .as_ref()
            .map_or(CudaOrdinal(0), |g| g.ordinal)
    }

    /// Starts a loader for `target` on `rt`'s arenas, filling batches with
    /// `producer(batch_index, slot)`, which returns the bytes it wrote (at
    /// most `slot.len()`). The slots are taken now, so an arena budget
    /// error comes from here; the workers start producing at once.
    ///
    /// # Errors
    ///
    /// [`LoaderError::Config`] for a setting out of range;
    /// [`LoaderError::Runtime`] for a target
    /// [`Runtime::place`](crate::runtime::Runtime::place) refuses or slots over
    /// the node's budget (or the memlock limit); [`LoaderError::Setup`] when
    /// the GPU side (context, stream, device ring) or the threads cannot be set
    /// up; [`LoaderError::Affinity`] when a worker cannot be bound to the
    /// target's CPUs.
    pub fn new<P, E>(
        rt: &Runtime,
        target: Target,
        config: LoaderConfig,
        producer: P,
    ) -> Result<Loader>
    where
        P: Fn(u64, &mut [u8]) -> std::result::Result<usize, E> + Send + Sync + 'static,
        E: Into<BoxError>,
    {
        let place = rt.place(target)?;
        let sharing = rt
            .topology()
            .gpus
            .iter()
            .filter(|g| g.numa_node == Some(place.node))
            .count()
            .max(1);
        let cfg = config::resolve_config(config, place.cpus.len() / sharing)?;
        let mut slots = Vec::with_capacity(cfg.depth);
        for _ in 0..cfg.depth {
            slots.push(rt.alloc(Target::HostNode(place.node), cfg.batch_bytes)?);
        }
        let slot_bytes = slots.first().map_or(0, |s| s.capacity() as u64);
        let mut warnings = place.warnings.clone();
        let gpu = Self::gpu_side(&place, &slots, &cfg, &mut warnings)?;
        let shared = Self::shared(slots, gpu, cfg, producer);
        let mut loader = Loader {
            shared: shared.clone(),
            threads: Vec::new(),
            worker_tids: Vec::new(),
            target,
            cpus: place.cpus.clone(),
            node: place.node,
            warnings,
            slot_bytes,
        };
        loader.start_threads(&place.cpus)?;
        Ok(loader)
    }

    /// The copy engine's side on the GPU (GPU targets only), with a warning
    /// when the slots are not registered with CUDA.
    fn gpu_side(
        place: &crate::runtime::Site,
        slots: &[PinnedBuf],
        cfg: &LoaderConfig,
        warnings: &mut Vec<String>,
    ) -> Result<Option<GpuSide>> {
        let Some(ordinal) = place.ordinal() else {
            return Ok(None);
        };
        if slots.iter().any(|s| !s.is_registered()) {
            warnings.push(format!(
                "the pinned slots on node {} are not registered with CUDA (RuntimeConfig::register is off, or registration was skipped: see Runtime::stats), so every copy is synchronous and slow",
                place.node
            ));
        }
        Ok(Some(engine::gpu_side(ordinal, cfg)?))
    }

    /// The state the workers and the engine share: every slot free, every
    /// device buffer of the ring free, the workers counted as running.
    fn shared<P, E>(
        slots: Vec<PinnedBuf>,
        gpu: Option<GpuSide>,
        cfg: LoaderConfig,
        producer: P,
    ) -> Arc<Shared>
    where
        P: Fn(u64, &mut [u8]) -> std::result::Result<usize, E> + Send + Sync + 'static,
        E: Into<BoxError>,
    {
        let state = State {
            free_slots: slots,
            free_ring: (0..gpu.as_ref().map_or(0, |g| g.ring.len()))
                .rev()
                .map(|i| (i, 0))
                .collect(),
            workers_running: cfg.workers,
            ..State::default()
        };
        Arc::new(Shared {
            state: Mutex::new(state),
            slot_free: Condvar::new(),
            engine_wake: Condvar::new(),
            delivered: Condvar::new(),
            next_index: AtomicU64::new(0),
            producer: Box::new(move |i, s| producer(i, s).map_err(Into::into)),
            cfg,
            gpu,
        })
    }

    /// Starts the workers and the engine, each bound to `cpus`. Each thread
    /// binds itself first and reports; a failure stops the others (through
    /// Drop) and comes back from here.
    fn start_threads(&mut self, cpus: &CpuList) -> Result<()> {
        let shared = self.shared.clone();
        let (tx, rx) = mpsc::channel::<(bool, Result<i32>)>();
        let threads = shared.cfg.workers + 1;
        for i in 0..threads {
            let (thread_shared, tx, cpus) = (shared.clone(), tx.clone(), cpus.clone());
            let engine = i == shared.cfg.workers;
            let name = if engine {
                "numapin-copy".to_string()
            } else {
                format!("numapin-load{i}")
            };
            let spawned = std::thread::Builder::new().name(name).spawn(move || {
                let shared = thread_shared;
                let ordinal = shared.gpu.as_ref().map(|g| g.ordinal).filter(|_| engine);
                let started = worker::start_thread(&cpus, ordinal);
                let ok = started.is_ok();
                let _ = tx.send((engine, started));
                if engine {
                    engine::run_engine(&shared, ok);
                } else {
                    worker::run_worker(&shared, ok);
                }
            });
            match spawned {
                Ok(h) => self.threads.push(h),
                Err(e) => {
                    // Threads never started do not count as running.
                    let mut st = shared.lock();
                    st.workers_running -=
                        (shared.cfg.workers - i.min(shared.cfg.workers)).min(st.workers_running);
                    drop(st);
                    return Err(LoaderError::setup(
                        "starting a loader thread",
                        "check the process's thread limit (`ulimit -u`) and memory",
                        e,
                    ));
                }
            }
        }
        drop(tx);
        self.await_threads(&rx, threads)
    }

    /// Collects the threads' reports: the workers' thread ids, or the first
    /// failure.
    fn await_threads(&mut self, rx: &mpsc::Receiver<(bool, Result<i32>)>, n: usize) -> Result<()> {
        let mut first_error = None;
        for _ in 0..n {
            match rx.recv() {
                Ok((engine, Ok(tid))) => {
                    if !engine {
                        self.worker_tids.push(tid);
                    }
                }
                Ok((_, Err(e))) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => break,
            }
        }
        match first_error {
            Some(e) => Err(e), // Drop stops and joins the threads.
            None => Ok(()),
        }
    }

    /// The next batch, waiting for it; `None` at the end of the stream
    /// (after [`LoaderConfig::total_batches`] batches or after an error).
    /// A producer's failure comes as `Some(Err)` at that batch's position,
    /// and the stream ends after it.
    pub fn next_batch(&self) -> Option<std::result::Result<Batch<'_>, LoaderError>> {
        let shared = &*self.shared;
        let mut st = shared.lock();
        loop {
            if st.ended {
                return None;
            }
            if let Some(d) = st.out.pop_front() {
                let data = match d {
                    Delivery::End => {
                        st.ended = true;
                        return None;
                    }
                    Delivery::Failed(e) => return Some(Err(e)),
                    Delivery::Host { index, slot, len } => (index, len, BatchData::Host(slot)),
                    Delivery::Device { index, entry, len } => {
                        (index, len, BatchData::Device(entry))
                    }
                };
                st.held += 1;
                st.delivered += 1;
                let (index, len, data) = data;
                return Some(Ok(Batch {
                    loader: self,
                    index,
                    len,
                    data: Some(data),
                    used_on: Vec::new(),
                }));
            }
            let (cap, what, setting) = match &shared.gpu {
                Some(g) => (g.ring.len(), "device buffers", "ring"),
                None => (shared.cfg.depth, "pinned slots", "depth"),
            };
            if st.held >= cap {
                return Some(Err(LoaderError::ConsumerHoldsAll {
                    held: st.held,
                    what,
                    setting,
                }));
            }
            st = shared.delivered.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// An iterator over [`next_batch`](Self::next_batch).
    pub fn iter(&self) -> Batches<'_> {
        Batches(self)
    }

    /// What the loader feeds.
    pub fn target(&self) -> Target {
        self.target
    }

    /// The configuration, with the values picked for zeros.
    pub fn config(&self) -> &LoaderConfig {
        &self.shared.cfg
    }

    /// The CPUs the workers (and the copy engine) are bound to.
    pub fn worker_cpus(&self) -> &CpuList {
        &self.cpus
    }

    /// The node the slots are on.
    pub fn node(&self) -> u32 {
        self.node
    }

    /// Thread ids of the workers (for checking their affinity).
    pub fn worker_tids(&self) -> &[i32] {
        &self.worker_tids
    }

    /// What a person should know about where the loader runs (unknown GPU
    /// locality, CPUs excluded by the cpuset, unregistered slots).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The most memory the loader uses (see [`MemoryBound`]).
    pub fn memory_bound(&self) -> MemoryBound {
        let cfg = &self.shared.cfg;
        MemoryBound {
            pinned_bytes: self.slot_bytes * cfg.depth as u64,
            device_bytes: self
                .shared
                .gpu
                .as_ref()
                .map_or(0, |g| g.ring.len() as u64 * cfg.batch_bytes as u64),
        }
    }

    /// The counters now.
    pub fn stats(&self) -> LoaderStats {
        let st = self.shared.lock();
        LoaderStats {
            produced: st.produced,
            delivered: st.delivered,
            producer_waits: st.producer_waits,
            workers_blocked: st.workers_blocked,
            engine_waits: st.engine_waits,
            slots: self.shared.cfg.depth,
            slots_free: st.free_slots.len(),
            ring: self.shared.gpu.as_ref().map_or(0, |g| g.ring.len()),
            ring_free: st.free_ring.len(),
            held_by_consumer: st.held,
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.stop = true;
        }
        self.shared.slot_free.notify_all();
        self.shared.engine_wake.notify_all();
        self.shared.delivered.notify_all();
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
        // The last reference to Shared goes with self: slots back to the
        // arena (their copies have completed: the engine waited), device
        // buffers freed in their own context.
    }
}
