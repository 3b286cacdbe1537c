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
//! ```no_run
//! use numapin::loader::{Loader, LoaderConfig, Target};
//! # fn main() -> numapin::Result<()> {
//! # let rt = numapin::Runtime::new(numapin::Topology::probe(&Default::default())?, Default::default())?;
//! let loader = Loader::new(&rt, Target::Gpu(0), LoaderConfig::new(64 << 20), |index, slot: &mut [u8]| {
//!     slot.fill(index as u8);
//!     Ok::<usize, std::io::Error>(slot.len())
//! })?;
//! for batch in loader.iter().take(100) {
//!     let mut batch = batch?;
//!     // SAFETY: `compute` is a live stream of GPU 0 that outlives the batch.
//!     # let compute: numapin::cuda::CUstream = std::ptr::null_mut();
//!     unsafe { batch.wait_on(compute)? };
//!     // launch kernels reading batch.device_ptr() on `compute` ...
//! }
//! # Ok(()) }
//! ```

pub mod kernels;
pub mod measure;
mod placement;
pub mod staged;
pub mod stream_copy;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::cpulist::CpuList;
use crate::cuda::{self, CUdeviceptr, CUstream, CudaError, DeviceBuffer, Event, Stream};
use crate::error::{Error, Result};
use crate::runtime::{PinnedBuf, Runtime};

pub use staged::StagedOptions;

/// A producer's error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Default batch size: 4 MiB.
pub const DEFAULT_BATCH_BYTES: usize = 4 << 20;
/// Most worker threads picked automatically: the GPU's allowed local CPUs,
/// shared evenly among the GPUs on the same node, at most this many. On a
/// 2-GPU H200 VM, 16 workers delivered 0.83 of a bare copy loop against 0.77
/// with 8 (memory-bound producer; docs/BENCHMARKS.md).
pub const MAX_AUTO_WORKERS: usize = 16;
/// Default ring of device buffers: one being copied into, one held by the
/// consumer, two ready.
pub const DEFAULT_RING: usize = 4;
/// Streams a consumer may make wait on one batch ([`Batch::wait_on`]).
pub const MAX_CONSUMER_STREAMS: usize = 4;

/// What a loader feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The GPU with this CUDA ordinal: batches are copied to device
    /// buffers on it; workers run on its local CPUs, slots on its node.
    Gpu(u32),
    /// Host mode for the topology GPU (or accelerator) with this index
    /// ([`crate::topology::Gpu::index`], PCI order): workers on its local
    /// CPUs, slots on its node, batches delivered as pinned host memory;
    /// no CUDA.
    HostForGpu(u32),
    /// Host mode on a NUMA node: workers on the node's CPUs, slots on the
    /// node.
    HostNode(u32),
    /// Host mode without placement: workers on every allowed CPU, slots on
    /// the calling thread's node.
    Host,
}

impl Target {
    /// Whether batches go to a GPU (otherwise they stay in host memory).
    pub fn is_gpu(&self) -> bool {
        matches!(self, Target::Gpu(_))
    }
}

/// The order batches reach the consumer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// By batch index, 0, 1, 2, ... (a slow batch holds back later ones).
    #[default]
    Index,
    /// As soon as each is ready (lowest ready index first).
    Completion,
}

/// How a [`Loader`] runs. Zero means "pick" for `workers`, `depth` and
/// `ring`; [`Loader::config`] shows what was picked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderConfig {
    /// Bytes of each pinned slot and device buffer: the largest batch
    /// (default [`DEFAULT_BATCH_BYTES`]).
    pub batch_bytes: usize,
    /// Worker threads running the producer (default: the GPU's allowed
    /// local CPUs divided among the GPUs on its node, at most
    /// [`MAX_AUTO_WORKERS`]).
    pub workers: usize,
    /// Pinned slots: batches in flight on the host, being produced, ready,
    /// or being copied (default `workers + 2`). In host mode the consumer's
    /// batches are slots too.
    pub depth: usize,
    /// Device buffers (GPU mode): batches copied or being copied and not
    /// yet dropped by the consumer (default [`DEFAULT_RING`]).
    pub ring: usize,
    /// Delivery order (default by index).
    pub order: Order,
    /// Batches to deliver, `None` for an endless stream.
    pub total_batches: Option<u64>,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            batch_bytes: DEFAULT_BATCH_BYTES,
            workers: 0,
            depth: 0,
            ring: 0,
            order: Order::Index,
            total_batches: None,
        }
    }
}

impl LoaderConfig {
    /// The defaults with `batch_bytes` slots.
    pub fn new(batch_bytes: usize) -> Self {
        LoaderConfig {
            batch_bytes,
            ..Self::default()
        }
    }
}

/// A loader failure, at a batch's position or at set-up.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// The producer returned an error for this batch.
    #[error("batch {index}: the producer failed: {source}")]
    Producer {
        /// The batch.
        index: u64,
        /// The producer's error.
        #[source]
        source: BoxError,
    },
    /// The producer panicked on this batch.
    #[error("batch {index}: the producer panicked: {message}")]
    Panicked {
        /// The batch.
        index: u64,
        /// The panic message.
        message: String,
    },
    /// The producer claimed more bytes than the slot holds.
    #[error("batch {index}: the producer returned {returned} bytes, more than the {capacity}-byte slot\n  fix: return at most the slot's length (raise LoaderConfig::batch_bytes for larger batches)")]
    TooLong {
        /// The batch.
        index: u64,
        /// The length returned.
        returned: usize,
        /// The slot's length.
        capacity: usize,
    },
    /// A CUDA call for this batch failed.
    #[error("batch {index}: {what} on GPU {gpu} failed: {error}\n  fix: check the GPU (`nvidia-smi`); after a sticky error (CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_FAILED) the context is lost and the process must restart")]
    Cuda {
        /// The batch.
        index: u64,
        /// The CUDA ordinal.
        gpu: u32,
        /// What was attempted.
        what: &'static str,
        /// The CUDA error.
        error: CudaError,
    },
    /// The consumer holds every batch the loader can have out at once, so
    /// asking for another would wait forever.
    #[error("the consumer holds all {held} {what}, so no further batch can be delivered\n  fix: drop batches before asking for more, or raise LoaderConfig::{setting}")]
    ConsumerHoldsAll {
        /// Batches held.
        held: usize,
        /// `pinned slots` or `device buffers`.
        what: &'static str,
        /// The setting that bounds them (`depth` or `ring`).
        setting: &'static str,
    },
    /// A batch was made to wait on more streams than a loader supports.
    #[error("batch {index}: made to wait on more than {MAX_CONSUMER_STREAMS} streams\n  fix: make one stream wait on the batch and order the others after it with events")]
    TooManyStreams {
        /// The batch.
        index: u64,
    },
    /// A configuration value that cannot be used.
    #[error("loader configuration {setting} = {value}: {problem}\n  fix: {fix}")]
    Config {
        /// The setting.
        setting: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: String,
    },
}

impl LoaderError {
    /// The batch the error is about, if it is about one.
    pub fn index(&self) -> Option<u64> {
        match self {
            LoaderError::Producer { index, .. }
            | LoaderError::Panicked { index, .. }
            | LoaderError::TooLong { index, .. }
            | LoaderError::Cuda { index, .. }
            | LoaderError::TooManyStreams { index } => Some(*index),
            _ => None,
        }
    }

    /// Exit code: 2 for a bad configuration, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            LoaderError::Config { .. } => 2,
            _ => 1,
        }
    }
}

/// Counters of a running loader.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
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
struct RingEntry {
    buf: DeviceBuffer,
    copied: Event,
    release: Vec<Event>,
}

struct GpuSide {
    ordinal: u32,
    stream: Stream,
    ring: Vec<RingEntry>,
}

enum Produced {
    Data { slot: PinnedBuf, len: usize },
    Failed(LoaderError),
}

enum Delivery {
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
struct State {
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

struct Shared {
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

fn config_error(setting: &'static str, value: impl ToString, problem: &str, fix: &str) -> Error {
    LoaderError::Config {
        setting,
        value: value.to_string(),
        problem: problem.into(),
        fix: fix.into(),
    }
    .into()
}

fn cuda_setup_error(ordinal: u32, what: &str, e: CudaError) -> Error {
    Error::System {
        what: format!("setting up a loader for GPU {ordinal}: {what}"),
        problem: e.to_string(),
        fix: match e {
            CudaError::NoDriver(_) => "run on a machine with the NVIDIA driver, or use a host-mode target (Target::HostForGpu, HostNode, Host)".into(),
            _ => "check the GPU (`nvidia-smi`) and its free memory; lower LoaderConfig::ring or batch_bytes".into(),
        },
    }
}

impl Loader {
    /// Starts a loader for `target` on `rt`'s arenas, filling batches with
    /// `producer(batch_index, slot)`, which returns the bytes it wrote (at
    /// most `slot.len()`). The slots are taken now, so an arena budget
    /// error comes from here; the workers start producing at once.
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
        let place = placement::resolve(rt, target)?;
        let sharing = rt
            .topology()
            .gpus
            .iter()
            .filter(|g| g.numa_node == Some(place.node))
            .count()
            .max(1);
        let cfg = resolve_config(config, place.cpus.len() / sharing)?;
        let mut slots = Vec::with_capacity(cfg.depth);
        for _ in 0..cfg.depth {
            slots.push(rt.alloc_on_node(place.node, cfg.batch_bytes)?);
        }
        let slot_bytes = slots.first().map_or(0, |s| s.capacity() as u64);
        let mut warnings = place.warnings.clone();
        let gpu = match place.ordinal {
            None => None,
            Some(ordinal) => {
                if slots.iter().any(|s| !s.is_registered()) {
                    warnings.push(format!(
                        "the pinned slots on node {} are not registered with CUDA (RuntimeConfig::register is off, or registration was skipped: see Runtime::stats), so every copy is synchronous and slow",
                        place.node
                    ));
                }
                Some(gpu_side(ordinal, &cfg)?)
            }
        };
        let state = State {
            free_slots: slots,
            free_ring: (0..gpu.as_ref().map_or(0, |g| g.ring.len()))
                .rev()
                .map(|i| (i, 0))
                .collect(),
            workers_running: cfg.workers,
            ..State::default()
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            slot_free: Condvar::new(),
            engine_wake: Condvar::new(),
            delivered: Condvar::new(),
            next_index: AtomicU64::new(0),
            producer: Box::new(move |i, s| producer(i, s).map_err(Into::into)),
            cfg,
            gpu,
        });
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
        // Each thread binds itself first and reports; a failure stops the
        // others (through Drop) and comes back from here.
        let (tx, rx) = mpsc::channel::<(bool, Result<i32>)>();
        let threads = shared.cfg.workers + 1;
        for i in 0..threads {
            let (thread_shared, tx, cpus) = (shared.clone(), tx.clone(), place.cpus.clone());
            let engine = i == shared.cfg.workers;
            let name = if engine {
                "numapin-copy".to_string()
            } else {
                format!("numapin-load{i}")
            };
            let spawned = std::thread::Builder::new().name(name).spawn(move || {
                let shared = thread_shared;
                let ordinal = shared.gpu.as_ref().map(|g| g.ordinal).filter(|_| engine);
                let started = start_thread(&cpus, ordinal);
                let ok = started.is_ok();
                let _ = tx.send((engine, started));
                if engine {
                    run_engine(&shared, ok);
                } else {
                    run_worker(&shared, ok);
                }
            });
            match spawned {
                Ok(h) => loader.threads.push(h),
                Err(e) => {
                    // Threads never started do not count as running.
                    let mut st = shared.lock();
                    st.workers_running -=
                        (shared.cfg.workers - i.min(shared.cfg.workers)).min(st.workers_running);
                    drop(st);
                    return Err(Error::System {
                        what: "starting a loader thread".into(),
                        problem: e.to_string(),
                        fix: "check the process's thread limit (`ulimit -u`) and memory".into(),
                    });
                }
            }
        }
        drop(tx);
        let mut first_error = None;
        for _ in 0..threads {
            match rx.recv() {
                Ok((engine, Ok(tid))) => {
                    if !engine {
                        loader.worker_tids.push(tid);
                    }
                }
                Ok((_, Err(e))) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => break,
            }
        }
        if let Some(e) = first_error {
            return Err(e); // Drop stops and joins the threads.
        }
        Ok(loader)
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

/// Iterator over a loader's batches ([`Loader::iter`]).
#[derive(Debug)]
pub struct Batches<'a>(&'a Loader);

impl<'a> Iterator for Batches<'a> {
    type Item = std::result::Result<Batch<'a>, LoaderError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next_batch()
    }
}

impl<'a> IntoIterator for &'a Loader {
    type Item = std::result::Result<Batch<'a>, LoaderError>;
    type IntoIter = Batches<'a>;
    fn into_iter(self) -> Batches<'a> {
        self.iter()
    }
}

enum BatchData {
    Host(PinnedBuf),
    Device(usize),
}

/// A delivered batch. Dropping it gives its device buffer (GPU mode) or
/// its pinned slot (host mode) back to the loader.
pub struct Batch<'a> {
    loader: &'a Loader,
    index: u64,
    len: usize,
    data: Option<BatchData>,
    used_on: Vec<CUstream>,
}

// SAFETY: the raw stream handles in `used_on` are only passed to the
// driver (thread-safe); everything else is Send.
unsafe impl Send for Batch<'_> {}

impl std::fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("index", &self.index)
            .field("len", &self.len)
            .field("device_ptr", &self.device_ptr())
            .finish_non_exhaustive()
    }
}

impl Batch<'_> {
    /// The batch index (0, 1, ...).
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Bytes the producer wrote.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the producer wrote nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn entry(&self) -> Option<&RingEntry> {
        match self.data.as_ref()? {
            BatchData::Device(i) => Some(&self.loader.shared.gpu.as_ref()?.ring[*i]),
            BatchData::Host(_) => None,
        }
    }

    /// The device buffer holding the batch (GPU mode); valid for
    /// [`len`](Self::len) bytes once [`event`](Self::event) has completed.
    pub fn device_ptr(&self) -> Option<CUdeviceptr> {
        self.entry().map(|e| e.buf.ptr())
    }

    /// The event recorded after the batch's copy (GPU mode).
    pub fn event(&self) -> Option<&Event> {
        self.entry().map(|e| &e.copied)
    }

    /// The batch's bytes (host mode).
    pub fn host_bytes(&self) -> Option<&[u8]> {
        match self.data.as_ref()? {
            BatchData::Host(slot) => Some(&slot[..self.len]),
            BatchData::Device(_) => None,
        }
    }

    /// The pinned slot holding the batch (host mode).
    pub fn host_buf(&self) -> Option<&PinnedBuf> {
        match self.data.as_ref()? {
            BatchData::Host(slot) => Some(slot),
            BatchData::Device(_) => None,
        }
    }

    /// Makes work queued on `stream` afterwards wait on the device until
    /// the batch's copy has completed (`cuStreamWaitEvent`; the host does
    /// not wait). When the batch is dropped, an event is recorded on
    /// `stream` and the device buffer is not overwritten before the work
    /// queued on `stream` until then has completed. No-op in host mode.
    ///
    /// # Safety
    /// `stream` must be a stream of the loader's GPU (or null, the legacy
    /// default stream) that stays alive until the batch is dropped.
    pub unsafe fn wait_on(&mut self, stream: CUstream) -> std::result::Result<(), LoaderError> {
        let Some(entry) = self.entry() else {
            return Ok(());
        };
        let index = self.index;
        let gpu = self.loader.shared.gpu.as_ref().map_or(0, |g| g.ordinal);
        // SAFETY: the caller vouches for the stream; the event lives in
        // the loader, which outlives the batch.
        unsafe { cuda::stream_wait_event(stream, entry.copied.raw()) }.map_err(|error| {
            LoaderError::Cuda {
                index,
                gpu,
                what: "cuStreamWaitEvent",
                error,
            }
        })?;
        if !self.used_on.contains(&stream) {
            if self.used_on.len() == MAX_CONSUMER_STREAMS {
                return Err(LoaderError::TooManyStreams { index });
            }
            self.used_on.push(stream);
        }
        Ok(())
    }

    /// Blocks the calling thread until the batch's copy has completed (for
    /// CPU-side checks; a GPU consumer uses [`wait_on`](Self::wait_on)).
    /// Returns at once in host mode.
    pub fn synchronize(&self) -> std::result::Result<(), LoaderError> {
        let Some(entry) = self.entry() else {
            return Ok(());
        };
        entry
            .copied
            .synchronize()
            .map_err(|error| LoaderError::Cuda {
                index: self.index,
                gpu: self.loader.shared.gpu.as_ref().map_or(0, |g| g.ordinal),
                what: "cuEventSynchronize",
                error,
            })
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        let shared = &*self.loader.shared;
        let Some(data) = self.data.take() else {
            return;
        };
        match data {
            BatchData::Host(slot) => {
                let mut st = shared.lock();
                st.held -= 1;
                st.free_slots.push(slot);
                drop(st);
                shared.slot_free.notify_one();
            }
            BatchData::Device(i) => {
                let mut recorded = 0;
                if let (Some(g), false) = (&shared.gpu, self.used_on.is_empty()) {
                    let _ctx = cuda::ContextGuard::push(g.ordinal);
                    let entry = &g.ring[i];
                    for &s in &self.used_on {
                        // SAFETY: wait_on's caller vouched that the stream
                        // lives until now and belongs to this GPU, whose
                        // context the event was made in. A failed record
                        // (the stream is gone) leaves nothing to wait for.
                        if unsafe { entry.release[recorded].record(s) }.is_ok() {
                            recorded += 1;
                        }
                    }
                }
                let mut st = shared.lock();
                st.held -= 1;
                st.free_ring.push((i, recorded));
                drop(st);
                shared.engine_wake.notify_one();
            }
        }
    }
}

/// Fills in the defaults; `cpu_share` is this loader's share of its
/// node's allowed CPUs.
fn resolve_config(mut cfg: LoaderConfig, cpu_share: usize) -> Result<LoaderConfig> {
    if cfg.batch_bytes == 0 {
        return Err(config_error(
            "batch_bytes",
            0,
            "a batch must hold at least one byte",
            "set it to the largest batch the producer writes",
        ));
    }
    const MAX_THREADS: usize = 1024;
    if cfg.workers > MAX_THREADS {
        return Err(config_error(
            "workers",
            cfg.workers,
            "more than 1024 worker threads",
            "use about as many workers as the GPU has local CPUs",
        ));
    }
    if cfg.workers == 0 {
        cfg.workers = cpu_share.clamp(1, MAX_AUTO_WORKERS);
    }
    if cfg.depth == 0 {
        cfg.depth = cfg.workers + 2;
    }
    if cfg.ring == 0 {
        cfg.ring = DEFAULT_RING;
    }
    if cfg.depth > 1 << 16 || cfg.ring > 1 << 16 {
        return Err(config_error(
            "depth/ring",
            format!("{}/{}", cfg.depth, cfg.ring),
            "more than 65536 buffers",
            "a few more than the workers is enough",
        ));
    }
    Ok(cfg)
}

fn gpu_side(ordinal: u32, cfg: &LoaderConfig) -> Result<GpuSide> {
    let err = |what| move |e| cuda_setup_error(ordinal, what, e);
    cuda::driver_version().map_err(err("loading the CUDA driver"))?;
    let _ctx = cuda::ContextGuard::push(ordinal).map_err(err("making its context current"))?;
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

/// Binds the calling (new) thread to `cpus` and, for the copy engine, makes
/// the GPU's context current; returns the thread id.
fn start_thread(cpus: &CpuList, ordinal: Option<u32>) -> Result<i32> {
    crate::affinity::bind_current_thread(cpus)?;
    if let Some(o) = ordinal {
        cuda::set_device(o)
            .map_err(|e| cuda_setup_error(o, "making its context current on the copy thread", e))?;
    }
    Ok(nix::unistd::gettid().as_raw())
}

/// Counts a worker out when it ends, however it ends.
struct WorkerExit<'a>(&'a Shared);

impl Drop for WorkerExit<'_> {
    fn drop(&mut self) {
        self.0.lock().workers_running -= 1;
        self.0.engine_wake.notify_one();
    }
}

fn run_worker(shared: &Shared, started: bool) {
    let _exit = WorkerExit(shared);
    if !started {
        return;
    }
    let total = shared.cfg.total_batches;
    loop {
        let mut slot = {
            let mut st = shared.lock();
            loop {
                if st.stop || st.failed {
                    return;
                }
                if let Some(s) = st.free_slots.pop() {
                    break s;
                }
                st.producer_waits += 1;
                st.workers_blocked += 1;
                st = shared.slot_free.wait(st).unwrap_or_else(|p| p.into_inner());
                st.workers_blocked -= 1;
            }
        };
        // The slot is taken before the index, so every index taken has a
        // slot: the batch the consumer waits for is never starved of one.
        let index = shared.next_index.fetch_add(1, Ordering::SeqCst);
        if total.is_some_and(|t| index >= t) {
            shared.lock().free_slots.push(slot);
            shared.slot_free.notify_one();
            return;
        }
        let capacity = slot.len();
        let result = crate::panic_guard::catch(|| (shared.producer)(index, &mut slot[..]));
        let (item, back) = match result {
            Ok(Ok(len)) if len <= capacity => (Produced::Data { slot, len }, None),
            Ok(Ok(returned)) => (
                Produced::Failed(LoaderError::TooLong {
                    index,
                    returned,
                    capacity,
                }),
                Some(slot),
            ),
            Ok(Err(source)) => (
                Produced::Failed(LoaderError::Producer { index, source }),
                Some(slot),
            ),
            Err(message) => (
                Produced::Failed(LoaderError::Panicked { index, message }),
                Some(slot),
            ),
        };
        let failed = matches!(item, Produced::Failed(_));
        let mut st = shared.lock();
        st.produced += 1;
        st.ready.insert(index, item);
        if let Some(slot) = back {
            st.free_slots.push(slot);
        }
        if failed {
            st.failed = true;
        }
        drop(st);
        shared.engine_wake.notify_one();
        if failed {
            shared.slot_free.notify_all();
            return;
        }
    }
}

/// How long the copy engine sleeps between looks at copies in flight when
/// nothing else wakes it.
const POLL: Duration = Duration::from_micros(100);

fn run_engine(shared: &Shared, started: bool) {
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
                            error,
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
