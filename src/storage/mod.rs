//! Files to a GPU (or to pinned host memory) through pinned slots on the
//! GPU's own NUMA node: checkpoints and datasets.
//!
//! ```no_run
//! use numapin::storage::{self, ReadOptions, Source};
//! use numapin::{CudaOrdinal, Runtime, RuntimeConfig, Topology};
//! use numapin::topology::ProbeOptions;
//!
//! let rt = Runtime::new(Topology::probe(&ProbeOptions::from_process())?, RuntimeConfig::default())?;
//! let gpu = CudaOrdinal(0);
//! let src = Source::open("/data/shard-00001.bin")?;
//! let dev = storage::DeviceMemory::new(gpu, src.len() as usize)?;
//! let report = storage::read_to_device(&rt, &src, 0, dev.ptr(), src.len() as usize, gpu, &ReadOptions::default())?;
//! println!("{:.1} GB/s ({})", report.gbps(), report.summary());
//! # Ok::<(), numapin::Error>(())
//! ```
//!
//! How a read goes (`docs/storage.md`): the requested ranges become reads
//! of at most [`ReadOptions::chunk_bytes`], each into a pinned slot from
//! the [`Runtime`]'s arena on the GPU's node. Worker threads bound to that
//! node's CPUs each own two slots and a CUDA stream: a worker reads into
//! one slot while the DMA of the other runs, so the copy of each slot
//! overlaps the next read, and the workers together keep several reads in
//! flight. Each read takes what the page cache holds first
//! (`preadv2(RWF_NOWAIT)`, which never waits for the drive), then reads the
//! rest with `O_DIRECT` where the filesystem allows it (no second copy
//! through the page cache, no cache pollution), and buffered otherwise.
//! Reads into pinned host memory go straight into place (no slot).
//!
//! [`safetensors`] loads checkpoints with it; [`locate`] says which drive
//! (and NUMA node) a file lives on.

mod dests;
mod device;
mod drive;
mod error;
#[cfg(test)]
mod faults;
mod host;
mod io;
mod plan;
pub mod safetensors;
mod source;
pub mod write;

pub use device::{
    read_ranges_to_device, read_ranges_to_device_as_made, read_ranges_to_device_on, DeviceMemory,
};
pub use drive::{locate, mounted, Drive, FileLocation};
pub use error::StorageError;
pub use source::Source;

use crate::cpulist::CpuList;
use crate::gpu::{CUdeviceptr, CudaOrdinal};
use crate::runtime::Runtime;
use crate::runtime::{Site, Target};

type Result<T, E = StorageError> = std::result::Result<T, E>;

/// Fewest worker threads a read starts by default: reads block on the
/// drive, and several in flight are what a drive needs (4 x 1 MiB
/// `O_DIRECT` reads were the best of 1-64 on the virtio disk measured;
/// docs/BENCHMARKS.md).
pub const MIN_READ_THREADS: usize = 4;
/// Most worker threads a read starts by default (the node's allowed CPUs,
/// between [`MIN_READ_THREADS`] and this).
pub const MAX_READ_THREADS: usize = 16;
/// Most worker threads [`ReadOptions::threads`] may ask for.
pub const MAX_THREADS_OPTION: usize = 1024;
/// Most slots per worker [`ReadOptions::slots_per_thread`] may ask for.
pub const MAX_SLOTS_PER_THREAD: usize = 64;
/// Largest [`ReadOptions::chunk_bytes`].
pub const MAX_CHUNK_BYTES: usize = 1 << 30;
/// Smallest chunk numapin picks ([`ReadOptions::chunk_bytes`] 0): smaller
/// reads cost more per byte than the cache saves (4 ranks on a 4-GPU VM,
/// docs/BENCHMARKS.md).
pub const AUTO_CHUNK_MIN: usize = 1 << 20;
/// Largest chunk numapin picks (the reader's fixed chunk before, chosen
/// by the read-size sweeps in docs/BENCHMARKS.md).
pub const AUTO_CHUNK_MAX: usize = 4 << 20;
/// Most [`ReadOptions::readers`].
pub const MAX_READERS: usize = 1 << 20;

/// Ranges of one file closer than this share a read into a slot (reading
/// the gap costs less than another request to the drive).
const MAX_GAP: u64 = 64 << 10;

/// How a read uses the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum IoMode {
    /// What the page cache holds is copied from it (`RWF_NOWAIT`); the rest
    /// is read with `O_DIRECT` where the filesystem allows it, buffered
    /// elsewhere.
    #[default]
    Auto,
    /// Always through the page cache (plain `pread`, the kernel's
    /// readahead).
    Buffered,
    /// Always `O_DIRECT`, even for data in the page cache (to measure a
    /// drive); a file whose filesystem refuses it is a
    /// [`StorageError::Request`].
    Direct,
}

impl IoMode {
    /// `auto`, `buffered`, `direct`.
    pub fn as_str(self) -> &'static str {
        match self {
            IoMode::Auto => "auto",
            IoMode::Buffered => "buffered",
            IoMode::Direct => "direct",
        }
    }
}

impl std::str::FromStr for IoMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(IoMode::Auto),
            "buffered" => Ok(IoMode::Buffered),
            "direct" => Ok(IoMode::Direct),
            other => Err(format!(
                "`{other}` is not an I/O mode (auto, buffered, direct)"
            )),
        }
    }
}

/// How a read runs (start from `ReadOptions::default()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadOptions {
    /// Worker threads, 0 for the node's allowed CPUs between
    /// [`MIN_READ_THREADS`] and [`MAX_READ_THREADS`] (default 0); never
    /// more than there are reads; at most [`MAX_THREADS_OPTION`].
    pub threads: usize,
    /// Bytes per read and per slot, rounded up to the files' direct I/O
    /// alignment; at most [`MAX_CHUNK_BYTES`]; 0 (the default) for numapin's
    /// pick: the largest power of two from [`AUTO_CHUNK_MIN`] to
    /// [`AUTO_CHUNK_MAX`] with which the slots of all [`readers`](Self::readers)
    /// take at most half of the last-level cache of the node's CPUs (the
    /// slots then stay in the cache between a read and its DMA; 4 MiB for
    /// one reader on a 300 MiB L3, 1 MiB for four).
    pub chunk_bytes: usize,
    /// Readers on this machine reading at once, numapin's or not, that
    /// share the node's last-level cache: the ranks of a job loading their
    /// shards together (default 1; 0 counts as 1). Only the automatic
    /// [`chunk_bytes`](Self::chunk_bytes) uses it.
    pub readers: usize,
    /// Pinned slots per worker for reads to a GPU (default 2: one is read
    /// into while the other's DMA runs; at most [`MAX_SLOTS_PER_THREAD`]).
    pub slots_per_thread: usize,
    /// How the page cache is used (default [`IoMode::Auto`]).
    pub io: IoMode,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            threads: 0,
            chunk_bytes: 0,
            readers: 1,
            slots_per_thread: 2,
            io: IoMode::Auto,
        }
    }
}

with_setters!(ReadOptions {
    with_threads => threads: usize,
    with_chunk_bytes => chunk_bytes: usize,
    with_readers => readers: usize,
    with_slots_per_thread => slots_per_thread: usize,
    with_io => io: IoMode,
});

/// What a read did.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct ReadReport {
    /// Bytes delivered (the sum of the requested ranges).
    pub bytes: u64,
    /// Wall-clock seconds of the read, from the first read to the last
    /// byte delivered (slots and threads included).
    pub seconds: f64,
    /// Worker threads.
    pub threads: usize,
    /// The NUMA node of the slots (and the workers' CPUs).
    pub node: u32,
    /// Bytes copied from the page cache without waiting (`RWF_NOWAIT`).
    pub cached_bytes: u64,
    /// Bytes read with `O_DIRECT`.
    pub direct_bytes: u64,
    /// Bytes read through the page cache from the drive.
    pub buffered_bytes: u64,
    /// Pinned bytes held as slots for the read (0 for reads into place).
    pub staging_bytes: u64,
    /// Bytes per read and slot: [`ReadOptions::chunk_bytes`], or numapin's
    /// pick when that is 0, before rounding up to the files' direct I/O
    /// alignment; 0 when nothing was read.
    pub chunk_bytes: usize,
    /// Sentences a person should read: placement that could not be made,
    /// a file on a drive behind another NUMA node or socket, unregistered
    /// slots.
    pub warnings: Vec<String>,
}

impl ReadReport {
    /// Bytes per second, in GB/s (10^9).
    pub fn gbps(&self) -> f64 {
        gbps(self.bytes, self.seconds)
    }

    /// `cached=1.0GiB direct=3.0GiB buffered=0B`.
    pub fn summary(&self) -> String {
        let f = crate::arena::fmt_bytes;
        format!(
            "cached={} direct={} buffered={}",
            f(self.cached_bytes),
            f(self.direct_bytes),
            f(self.buffered_bytes)
        )
    }

    fn add(&mut self, c: io::Counts) {
        self.cached_bytes += c.cached;
        self.direct_bytes += c.direct;
        self.buffered_bytes += c.buffered;
    }
}

/// `bytes` in `seconds`, in GB/s (10^9); 0 for no time.
pub(crate) fn gbps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        crate::num::f64_from(bytes) / seconds / 1e9
    } else {
        0.0
    }
}

/// A range of a source to device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRange {
    /// Index of the file in the sources given with it.
    pub source: usize,
    /// Byte offset in the file.
    pub offset: u64,
    /// Bytes.
    pub len: usize,
    /// Where they go: device memory of the GPU read to, inside one
    /// allocation (checked).
    pub dst: CUdeviceptr,
}

/// A range of a source whose device destination is made while it is read
/// ([`read_ranges_to_device_as_made`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceRange {
    /// Index of the file in the sources given with it.
    pub source: usize,
    /// Byte offset in the file.
    pub offset: u64,
    /// Bytes.
    pub len: usize,
}

/// A range of a source to host memory.
#[derive(Debug)]
pub struct HostRange<'a> {
    /// Index of the file in the sources given with it.
    pub source: usize,
    /// Byte offset in the file.
    pub offset: u64,
    /// Where the bytes go (its length is the range's length). Memory whose
    /// address agrees with `offset` modulo the file's alignment (4 KiB) is
    /// read with `O_DIRECT` straight into place.
    pub dst: &'a mut [u8],
}

/// Reads `len` bytes of `src` at `offset` into device memory at `dst` on
/// CUDA device `gpu`, through pinned slots on the GPU's node. Returns when
/// the bytes are on the device.
///
/// # Errors
/// [`StorageError::Request`] for a range past the file's end or a `dst`
/// that is not device memory of `gpu` large enough; [`StorageError::Read`]
/// (file and offset named) or [`StorageError::Truncated`] when reading
/// fails; [`StorageError::Cuda`] without a driver or when a copy fails;
/// [`StorageError::Runtime`] when the slots cannot be had.
pub fn read_to_device(
    rt: &Runtime,
    src: &Source,
    offset: u64,
    dst: CUdeviceptr,
    len: usize,
    gpu: CudaOrdinal,
    opts: &ReadOptions,
) -> Result<ReadReport> {
    let r = DeviceRange {
        source: 0,
        offset,
        len,
        dst,
    };
    read_ranges_to_device(rt, std::slice::from_ref(src), &[r], gpu, opts)
}

/// Reads `dst.len()` bytes of `src` at `offset` into `dst` (host memory),
/// with worker threads on `target`'s CPUs ([`Target::HostNode`] for the
/// node `dst` is on; [`Target::Gpu`] for a GPU's node).
///
/// # Errors
/// As [`read_to_device`], without the CUDA ones.
///
/// # Examples
///
/// ```
/// use numapin::runtime::{Runtime, RuntimeConfig, Target};
/// use numapin::storage::{self, ReadOptions, Source};
/// use numapin::topology::{CudaMode, ProbeOptions, Topology};
///
/// let topo = Topology::probe(&ProbeOptions::from_process().with_cuda(CudaMode::Off))?;
/// let rt = Runtime::new(topo, RuntimeConfig::default().with_region_bytes(2 << 20))?;
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("shard.bin");
/// std::fs::write(&path, (0..=255u8).cycle().take(1 << 20).collect::<Vec<u8>>())?;
///
/// let src = Source::open(&path)?;
/// let mut dst = vec![0u8; 64 << 10];
/// // Threads on this thread's node read it (Target::Gpu(..) for a GPU's).
/// let node = Target::HostNode(rt.calling_thread_node());
/// let report = storage::read_to_host(&rt, &src, 4096 + 3, &mut dst, node, &ReadOptions::default())?;
/// assert_eq!(report.bytes, 64 << 10);
/// assert_eq!(&dst[..3], &[3, 4, 5]);
/// println!("{}", report.summary());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn read_to_host(
    rt: &Runtime,
    src: &Source,
    offset: u64,
    dst: &mut [u8],
    target: Target,
    opts: &ReadOptions,
) -> Result<ReadReport> {
    let r = HostRange {
        source: 0,
        offset,
        dst,
    };
    read_ranges_to_host(rt, std::slice::from_ref(src), vec![r], target, opts)
}

/// Reads every range of `ranges` (of files `sources`) into its host memory
/// (see [`read_to_host`]).
///
/// # Errors
/// As [`read_to_host`].
pub fn read_ranges_to_host(
    rt: &Runtime,
    sources: &[Source],
    ranges: Vec<HostRange<'_>>,
    target: Target,
    opts: &ReadOptions,
) -> Result<ReadReport> {
    host::read(rt, sources, ranges, target, opts)
}

/// The one answer to "which node and CPUs" for a read:
/// [`Runtime::place`] of `target` (a GPU's local CPUs and node).
pub(crate) fn place(rt: &Runtime, target: Target) -> Result<Site> {
    Ok(rt.place(target)?)
}

/// Checks a read of `spans` (source, offset, length) for `target` and
/// places it: the placement and the report so far (bytes, node, warnings
/// about the placement and the files' drives).
fn prepare(
    rt: &Runtime,
    sources: &[Source],
    spans: &[(usize, u64, usize)],
    target: Target,
    opts: &ReadOptions,
) -> Result<(Site, ReadReport)> {
    let bytes = check_ranges(sources, spans.iter().copied(), opts)?;
    let place = place(rt, target)?;
    let gpu = match target {
        Target::Gpu(g) => Some(g),
        _ => None,
    };
    let mut warnings = place.warnings.clone();
    warnings.extend(drive::warnings(
        rt,
        sources,
        spans.iter().map(|s| s.0),
        place.node,
        gpu,
    ));
    let report = ReadReport {
        bytes,
        node: place.node,
        warnings,
        ..ReadReport::default()
    };
    Ok((place, report))
}

/// Worker threads for `work` reads by CPUs `cpus`.
fn thread_count(opts: &ReadOptions, cpus: usize, work: usize) -> usize {
    let t = match opts.threads {
        0 => cpus.clamp(MIN_READ_THREADS, MAX_READ_THREADS),
        t => t,
    };
    t.min(work).max(1)
}

/// Checks the options: what they ask for is bounded before anything is
/// allocated.
fn check_options(opts: &ReadOptions) -> Result<()> {
    if opts.threads > MAX_THREADS_OPTION || opts.slots_per_thread > MAX_SLOTS_PER_THREAD {
        return Err(StorageError::request(
            format!(
                "read options threads = {}, slots_per_thread = {}: at most {MAX_THREADS_OPTION} and {MAX_SLOTS_PER_THREAD}",
                opts.threads, opts.slots_per_thread
            ),
            "use ReadOptions::default() (threads 0: the node's CPUs, 4 to 16; 2 slots per thread)",
        ));
    }
    if opts.slots_per_thread == 0 {
        return Err(StorageError::request(
            "read options slots_per_thread = 0: a worker needs a slot",
            "use ReadOptions::default() (2 slots per thread: one read into while the other's DMA runs)",
        ));
    }
    if opts.readers > MAX_READERS {
        return Err(StorageError::request(
            format!(
                "read options readers = {}: at most {MAX_READERS}",
                opts.readers
            ),
            "give the ranks reading at once on this machine (1 for one process)",
        ));
    }
    if opts.chunk_bytes > MAX_CHUNK_BYTES {
        return Err(StorageError::request(
            format!(
                "read options chunk_bytes = {} is over 1 GiB",
                opts.chunk_bytes
            ),
            "use 0 (numapin picks 1 to 4 MiB) or reads of a few MiB",
        ));
    }
    Ok(())
}

/// Checks the options and that every range lies in its source.
fn check_ranges(
    sources: &[Source],
    ranges: impl Iterator<Item = (usize, u64, usize)>,
    opts: &ReadOptions,
) -> Result<u64> {
    check_options(opts)?;
    let mut total = 0u64;
    for (s, off, len) in ranges {
        let src = sources.get(s).ok_or_else(|| {
            StorageError::request(
                format!(
                    "a range names source {s}, and there are {} source(s)",
                    sources.len()
                ),
                "index the sources passed with the ranges",
            )
        })?;
        if off
            .checked_add(len as u64)
            .is_none_or(|end| end > src.len())
        {
            return Err(StorageError::request(
                format!(
                    "{}: the range of {len} bytes at offset {off} runs past the end of the file ({} bytes)",
                    src.path().display(),
                    src.len()
                ),
                "read within the file",
            ));
        }
        total += len as u64;
    }
    Ok(total)
}

/// The chunk of a read by `threads` workers on `cpus`: the options', or
/// (0) the largest power of two from [`AUTO_CHUNK_MIN`] to
/// [`AUTO_CHUNK_MAX`] with which every reader's slots fit in half of the
/// last-level cache of `cpus` ([`AUTO_CHUNK_MAX`] when no cache size is
/// known).
fn chunk_for(rt: &Runtime, opts: &ReadOptions, cpus: &CpuList, threads: usize) -> usize {
    chunk_beside(opts, rt.topology().last_level_cache_bytes(cpus), threads)
}

/// [`chunk_for`] beside `cache` bytes of last-level cache.
fn chunk_beside(opts: &ReadOptions, cache: u64, threads: usize) -> usize {
    if opts.chunk_bytes > 0 {
        return opts.chunk_bytes;
    }
    let slots = opts
        .readers
        .max(1)
        .saturating_mul(threads.max(1))
        .saturating_mul(opts.slots_per_thread.max(1));
    auto_chunk(cache, slots)
}

/// [`chunk_for`]'s pick for `slots` slots in all beside `cache` bytes of
/// last-level cache.
fn auto_chunk(cache: u64, slots: usize) -> usize {
    if cache == 0 {
        return AUTO_CHUNK_MAX;
    }
    let room = cache / 2 / u64::try_from(slots.max(1)).unwrap_or(u64::MAX);
    let mut c = AUTO_CHUNK_MAX;
    while c > AUTO_CHUNK_MIN && u64::try_from(c).unwrap_or(u64::MAX) > room {
        c /= 2;
    }
    c
}

/// Bytes per slot: `chunk` rounded up to every source's alignment.
fn slot_bytes(sources: &[Source], chunk: usize) -> usize {
    let a = crate::num::usize_from(
        sources
            .iter()
            .map(|s| s.alignment())
            .max()
            .unwrap_or(source::MIN_ALIGN),
    );
    chunk.div_ceil(a) * a
}

/// Runs `work(i)` for `i` in `0..threads`, each on a thread of its own
/// bound to `cpus`; the first error (by thread) wins.
fn run_threads<T, F>(name: &str, threads: usize, cpus: &CpuList, work: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(usize) -> Result<T> + Sync,
{
    run_threads_beside(name, threads, cpus, work, || ()).0
}

/// [`run_threads`], with `beside` run on the calling thread meanwhile:
/// the threads' results and `beside`'s, once every thread has ended.
fn run_threads_beside<T, F, B, R>(
    name: &str,
    threads: usize,
    cpus: &CpuList,
    work: F,
    beside: B,
) -> (Result<Vec<T>>, R)
where
    T: Send,
    F: Fn(usize) -> Result<T> + Sync,
    B: FnOnce() -> R,
{
    let (results, r): (Vec<Result<T>>, R) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let work = &work;
                std::thread::Builder::new()
                    .name(format!("numapin-{name}{i}"))
                    .spawn_scoped(s, move || {
                        // Best effort, as the staged copy: an unbound
                        // thread still reads, only further from the slots.
                        let _ = crate::affinity::bind_current_thread(cpus);
                        work(i)
                    })
            })
            .collect();
        let r = beside();
        let results = handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    Err(StorageError::setup(
                        format!("a {name} thread panicked"),
                        "report this as a numapin bug",
                        "panic",
                    ))
                }),
                Err(e) => Err(StorageError::setup(
                    format!("starting a {name} thread"),
                    "check the process's thread limit (`ulimit -u`)",
                    e,
                )),
            })
            .collect();
        (results, r)
    });
    (results.into_iter().collect(), r)
}

#[cfg(test)]
mod tests;
