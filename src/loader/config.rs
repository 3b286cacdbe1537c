//! How a loader runs: [`Order`],
//! [`LoaderConfig`] and the defaults picked for zeros.

use super::error::LoaderError;

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
/// Streams a consumer may make wait on one batch ([`Batch::wait_on`](super::Batch::wait_on)).
pub const MAX_CONSUMER_STREAMS: usize = 4;

/// The order batches reach the consumer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// By batch index, 0, 1, 2, ... (a slow batch holds back later ones).
    #[default]
    Index,
    /// As soon as each is ready (lowest ready index first).
    Completion,
}

/// How a [`Loader`](super::Loader) runs. Zero means "pick" for `workers`, `depth` and
/// `ring`; [`Loader::config`](super::Loader::config) shows what was picked.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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

with_setters!(LoaderConfig {
    with_batch_bytes => batch_bytes: usize,
    with_workers => workers: usize,
    with_depth => depth: usize,
    with_ring => ring: usize,
    with_order => order: Order,
    with_total_batches => total_batches: Option<u64>,
});

impl LoaderConfig {
    /// The defaults with `batch_bytes` slots.
    pub fn new(batch_bytes: usize) -> Self {
        LoaderConfig {
            batch_bytes,
            ..Self::default()
        }
    }
}

/// Fills in the defaults; `cpu_share` is this loader's share of its
/// node's allowed CPUs.
pub(super) fn resolve_config(
    mut cfg: LoaderConfig,
    cpu_share: usize,
) -> Result<LoaderConfig, LoaderError> {
    if cfg.batch_bytes == 0 {
        return Err(LoaderError::config(
            "batch_bytes",
            0,
            "a batch must hold at least one byte",
            "set it to the largest batch the producer writes",
        ));
    }
    const MAX_THREADS: usize = 1024;
    if cfg.workers > MAX_THREADS {
        return Err(LoaderError::config(
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
        return Err(LoaderError::config(
            "depth/ring",
            format!("{}/{}", cfg.depth, cfg.ring),
            "more than 65536 buffers",
            "a few more than the workers is enough",
        ));
    }
    Ok(cfg)
}
