//! Files written from GPU (or host) memory through pinned slots on the
//! GPU's NUMA node: the write half of storage, on the reader's engine.
//!
//! ```no_run
//! use numapin::storage::write::{self, Data, FileParts, WriteOptions};
//! use numapin::{CudaOrdinal, Runtime, RuntimeConfig, Target, Topology};
//! # let rt = Runtime::new(Topology::probe(&Default::default())?, RuntimeConfig::default())?;
//! # let (ptr, len) = (0u64, 0usize);
//! let header = b"my header".to_vec();
//! let parts = [Data::Host(&header), Data::Device { gpu: CudaOrdinal(0), ptr, len }];
//! let file = FileParts::new("/ckpt/weights.bin", &parts);
//! let report = write::write_files(&rt, &[file], Target::Gpu(CudaOrdinal(0)), &WriteOptions::default())?;
//! println!("{:.2} GB/s ({})", report.gbps(), report.summary());
//! # Ok::<(), numapin::Error>(())
//! ```
//!
//! How a write goes (`docs/storage.md`): each file is written into a new
//! temporary file beside it (`.<name>.numapin-tmp-<pid>-<n>`, locked while
//! written, its space reserved first so that a full filesystem is found
//! before anything is copied), in chunks of [`WriteOptions::chunk_bytes`].
//! Writer threads bound to the node's CPUs each own a few pinned slots
//! from the [`Runtime`]'s arena on that node and a CUDA stream per GPU:
//! a writer queues the DMA of its next chunks into its other slots while
//! it writes the oldest one, with `O_DIRECT` where the filesystem allows
//! it (buffered otherwise, or when a direct write is refused), and the
//! writers together keep several writes in flight. When every chunk is
//! written, each file is synced (`fsync`, an option, on by default) and
//! renamed over its target, then the folders are synced. A failure at any
//! point removes the temporary files: the files that were there before
//! are untouched, and the slots go back to the arena. A save whose process
//! was killed leaves its temporary file; the next save to the same path
//! removes it.

mod device;
mod io;
mod plan;
mod target;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Mutex;
use std::time::Instant;

use crate::gpu::{CUdeviceptr, CUstream, CudaOrdinal};
use crate::platform::cuda;
use crate::runtime::{AllocOptions, PinnedBuf, Runtime, Target};

use super::device::{check_device_range, cuda_error, event_on};
use super::{IoMode, Result, StorageError};

use super::source::MIN_ALIGN;

/// Fewest writer threads by default: writes block on the drive, and a
/// few in flight are what a drive needs.
pub const MIN_WRITE_THREADS: usize = 4;
/// Most writer threads by default (the node's allowed CPUs, between
/// [`MIN_WRITE_THREADS`] and this).
pub const MAX_WRITE_THREADS: usize = 8;

/// Bytes a file is made of, in order: host memory, or device memory of a
/// GPU (copied by DMA into the slots).
#[derive(Debug, Clone, Copy)]
pub enum Data<'a> {
    /// Host memory (any: pageable or pinned).
    Host(&'a [u8]),
    /// `len` bytes of device memory at `ptr` on CUDA device `gpu`, inside
    /// one allocation (checked), kept alive and unchanged by the caller
    /// until the write returns.
    Device {
        /// The GPU.
        gpu: CudaOrdinal,
        /// The first byte.
        ptr: CUdeviceptr,
        /// Bytes.
        len: usize,
    },
}

impl Data<'_> {
    /// Bytes.
    pub fn len(&self) -> usize {
        match self {
            Data::Host(b) => b.len(),
            Data::Device { len, .. } => *len,
        }
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A file to write: its path and its contents, part after part.
#[derive(Debug, Clone)]
pub struct FileParts<'a> {
    /// Where it goes (a symbolic link is followed: the file it points to
    /// is replaced).
    pub path: PathBuf,
    /// Its bytes, in order.
    pub parts: &'a [Data<'a>],
}

impl<'a> FileParts<'a> {
    /// The file at `path` made of `parts`.
    pub fn new(path: impl Into<PathBuf>, parts: &'a [Data<'a>]) -> FileParts<'a> {
        FileParts {
            path: path.into(),
            parts,
        }
    }

    /// Its length.
    pub fn len(&self) -> u64 {
        self.parts.iter().map(|p| p.len() as u64).sum()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How a write runs (start from `WriteOptions::default()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteOptions {
    /// Writer threads, 0 for the node's allowed CPUs between
    /// [`MIN_WRITE_THREADS`] and [`MAX_WRITE_THREADS`] (default 0); never
    /// more than there are chunks.
    pub threads: usize,
    /// Bytes per write and per slot (default 8 MiB), rounded up to the
    /// files' direct I/O alignment.
    pub chunk_bytes: usize,
    /// Pinned slots per writer (default 2: one is written while the DMA
    /// into the other runs).
    pub slots_per_thread: usize,
    /// How the page cache is used (default [`IoMode::Auto`]: `O_DIRECT`
    /// where the filesystem allows it, buffered elsewhere;
    /// [`IoMode::Buffered`] always through the page cache;
    /// [`IoMode::Direct`] an error where it is refused).
    pub io: IoMode,
    /// Whether each file and its folder are synced to the drive before
    /// the write returns (default true): without it a crash soon after
    /// may lose the new file (never the old one and the new one both).
    pub fsync: bool,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            threads: 0,
            chunk_bytes: 8 << 20,
            slots_per_thread: 2,
            io: IoMode::Auto,
            fsync: true,
        }
    }
}

with_setters!(WriteOptions {
    with_threads => threads: usize,
    with_chunk_bytes => chunk_bytes: usize,
    with_slots_per_thread => slots_per_thread: usize,
    with_io => io: IoMode,
    with_fsync => fsync: bool,
});

/// What a write did.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct WriteReport {
    /// Bytes written (every file's length).
    pub bytes: u64,
    /// Wall-clock seconds, from the first file made to the last rename
    /// (and folder sync).
    pub seconds: f64,
    /// Of those, seconds after the last write: setting the files'
    /// lengths, syncing them (with [`WriteOptions::fsync`]), renaming
    /// them over their targets (a rename over an existing file frees that
    /// file's blocks, which on some filesystems takes a while: ext4 with
    /// `discard`, 0.15-0.2 s per GiB freed on a virtual disk) and
    /// syncing their folders.
    pub sync_seconds: f64,
    /// Writer threads.
    pub threads: usize,
    /// The NUMA node of the slots (and the writers' CPUs).
    pub node: u32,
    /// Bytes written with `O_DIRECT`.
    pub direct_bytes: u64,
    /// Bytes written through the page cache.
    pub buffered_bytes: u64,
    /// Pinned bytes held as slots for the write.
    pub staging_bytes: u64,
    /// The files written (their paths as given), in order.
    pub files: Vec<PathBuf>,
    /// Temporary files of killed earlier saves to these paths, removed.
    pub removed_stale: usize,
    /// Sentences a person should read (placement that could not be made,
    /// unregistered slots).
    pub warnings: Vec<String>,
}

impl WriteReport {
    /// Bytes per second, in GB/s (10^9).
    pub fn gbps(&self) -> f64 {
        super::gbps(self.bytes, self.seconds)
    }

    /// `direct=3.0GiB buffered=12B sync=0.10s`.
    pub fn summary(&self) -> String {
        let f = crate::arena::fmt_bytes;
        format!(
            "direct={} buffered={} sync={:.2}s",
            f(self.direct_bytes),
            f(self.buffered_bytes),
            self.sync_seconds
        )
    }
}

/// Writes `file` (see [`write_files`]).
///
/// # Errors
/// As [`write_files`].
pub fn write_file(
    rt: &Runtime,
    file: &FileParts<'_>,
    target: Target,
    opts: &WriteOptions,
) -> Result<WriteReport> {
    write_files(rt, std::slice::from_ref(file), target, opts)
}

/// Writes each of `files` whole, crash-safely: each into a temporary file
/// beside it, through pinned slots on `target`'s node ([`Target::Gpu`]:
/// the GPU's node, with writers on its CPUs); when all are written (and
/// synced, with [`WriteOptions::fsync`]), each is renamed over its path,
/// in order (so put an index last).
///
/// # Errors
/// [`StorageError::Input`] for a path that is a directory, a FIFO, a
/// socket or a device (links are followed); [`StorageError::Request`]
/// for bad options, two files at one path, device memory that is not of
/// the GPU named or runs past its allocation; [`StorageError::Write`]
/// naming the file, offset and fix when the folder cannot be written, the
/// filesystem is full (`ENOSPC`), a quota is spent (`EDQUOT`), the file is
/// over `ulimit -f` (`EFBIG`), the drive fails (`EIO`);
/// [`StorageError::Cuda`] when a copy fails; [`StorageError::Runtime`] when
/// the slots cannot be had. After any error the files at `files`' paths
/// are as they were (except those already renamed, when a rename itself
/// fails), no temporary file is left and the slots are back in the arena.
pub fn write_files(
    rt: &Runtime,
    files: &[FileParts<'_>],
    target: Target,
    opts: &WriteOptions,
) -> Result<WriteReport> {
    // SAFETY: no stream to order after.
    unsafe { write_files_on(rt, files, target, &[], opts) }
}

/// [`write_files`], with the copies from each GPU ordered after the work
/// already queued on that GPU's stream in `after` (such as a framework's
/// current stream, which computed the tensors written).
///
/// # Errors
/// As [`write_files`].
///
/// # Safety
/// Each stream of `after` must be a live stream of its GPU's primary
/// context (or null, the legacy default stream) for the whole call.
pub unsafe fn write_files_on(
    rt: &Runtime,
    files: &[FileParts<'_>],
    target: Target,
    after: &[(CudaOrdinal, CUstream)],
    opts: &WriteOptions,
) -> Result<WriteReport> {
    check_options(opts)?;
    check_device_parts(files)?;
    let place = super::place(rt, target)?;
    let targets = files
        .iter()
        .map(|f| target::resolve(&f.path))
        .collect::<Result<Vec<_>>>()?;
    check_distinct(&targets)?;
    let mut report = WriteReport {
        node: place.node,
        warnings: place.warnings.clone(),
        files: files.iter().map(|f| f.path.clone()).collect(),
        bytes: files.iter().map(FileParts::len).sum(),
        ..WriteReport::default()
    };
    let started = Instant::now();
    report.removed_stale = targets.iter().map(target::remove_stale).sum();
    let mut dests = Vec::with_capacity(files.len());
    for (f, t) in files.iter().zip(targets) {
        let tmp = target::TempFile::create(t)?;
        dests.push(io::Dest::open(tmp, f.len(), opts.io, opts.fsync)?);
    }
    // SAFETY: per this function's contract.
    let after = unsafe { after_events(after, files) }?;
    copy_and_write(rt, files, &dests, &place, after, opts, &mut report)?;
    let synced = Instant::now();
    for d in &dests {
        d.finish(opts.fsync)?;
    }
    commit(&mut dests, opts.fsync)?;
    report.sync_seconds = synced.elapsed().as_secs_f64();
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Pinned memory for the writer's slots: `bytes` on `node` from the
/// runtime's arena, counted in its budget, in a region of its own size
/// when one must be made, failing at once over budget (as the reader's).
fn lend(rt: &Runtime, node: u32, bytes: usize) -> Result<PinnedBuf> {
    let staging = AllocOptions::default()
        .with_staging(true)
        .with_wait(Some(std::time::Duration::ZERO));
    Ok(rt.alloc_with(Target::HostNode(node), bytes, &staging)?)
}

/// The chunks of every file through the slots, by writers on the
/// placement's CPUs.
fn copy_and_write(
    rt: &Runtime,
    files: &[FileParts<'_>],
    dests: &[io::Dest],
    place: &crate::runtime::Site,
    after: Vec<(CudaOrdinal, cuda::Event)>,
    opts: &WriteOptions,
    report: &mut WriteReport,
) -> Result<()> {
    let align = crate::num::usize_from(
        dests
            .iter()
            .map(io::Dest::alignment)
            .max()
            .unwrap_or(MIN_ALIGN),
    );
    let lens: Vec<u64> = files.iter().map(FileParts::len).collect();
    // Slots no larger than the largest file (an index, a small save).
    let largest = crate::num::usize_from(
        lens.iter()
            .copied()
            .max()
            .unwrap_or(0)
            .min(opts.chunk_bytes as u64),
    );
    let slot = largest.max(1).div_ceil(align) * align;
    let chunks = plan::chunks(&lens, slot);
    if chunks.is_empty() {
        return Ok(());
    }
    let threads = thread_count(opts, place.cpus.len(), chunks.len());
    let per_thread = opts
        .slots_per_thread
        .min(chunks.len().div_ceil(threads))
        .max(1);
    let mut staging = lend(rt, place.node, threads * per_thread * slot)?;
    if !staging.is_registered() && files.iter().any(has_device_parts) {
        report.warnings.push(format!(
            "the slots on node {} are not registered with CUDA, so every copy from the device waits for its DMA (check RuntimeConfig::register)",
            place.node
        ));
    }
    report.staging_bytes = (threads * per_thread * slot) as u64;
    report.threads = threads;
    let mut pieces = staging.chunks_mut(slot);
    let groups: Vec<Vec<&mut [u8]>> = (0..threads)
        .map(|_| pieces.by_ref().take(per_thread).collect())
        .collect();
    let job = device::Job {
        dests,
        layouts: files
            .iter()
            .map(|f| plan::Layout::new(f.parts.iter().map(|p| p.len() as u64)))
            .collect(),
        parts: files.iter().map(|f| f.parts).collect(),
        chunks,
        io: opts.io,
        next: AtomicUsize::new(0),
        failed: AtomicBool::new(false),
        after,
        slots: Mutex::new(groups),
    };
    let counts = super::run_threads("write", threads, &place.cpus, |_| device::worker(&job))?;
    for c in counts {
        report.direct_bytes += c.direct;
        report.buffered_bytes += c.buffered;
    }
    Ok(())
}

/// Renames every temporary file over its target, in order, then syncs
/// their folders.
fn commit(dests: &mut [io::Dest], sync: bool) -> Result<()> {
    for d in dests.iter_mut() {
        d.tmp.commit()?;
    }
    if sync {
        let mut dirs: Vec<PathBuf> = dests.iter().map(|d| d.tmp.target.dir()).collect();
        dirs.sort();
        dirs.dedup();
        for dir in &dirs {
            crate::platform::file_write::fsync_dir(dir).map_err(|e| {
                let d = dests.iter().find(|d| &d.tmp.target.dir() == dir);
                let d = d.expect("each folder is a file's");
                d.tmp.error("syncing the folder", 0, 0, e)
            })?;
        }
    }
    Ok(())
}

fn has_device_parts(f: &FileParts<'_>) -> bool {
    f.parts.iter().any(|p| matches!(p, Data::Device { .. }))
}

/// Events on the callers' streams of the GPUs the files copy from.
///
/// # Safety
/// As [`write_files_on`].
unsafe fn after_events(
    after: &[(CudaOrdinal, CUstream)],
    files: &[FileParts<'_>],
) -> Result<Vec<(CudaOrdinal, cuda::Event)>> {
    let mut out = Vec::new();
    for &(gpu, stream) in after {
        let used = files
            .iter()
            .flat_map(|f| f.parts.iter())
            .any(|p| matches!(p, Data::Device { gpu: g, len, .. } if *g == gpu && *len > 0));
        if !used || out.iter().any(|(g, _)| *g == gpu) {
            continue;
        }
        let _ctx = cuda::ContextGuard::push(gpu.0)
            .map_err(cuda_error(gpu, "making the context current"))?;
        // SAFETY: per this function's contract.
        out.push((gpu, unsafe { event_on(gpu, stream) }?));
    }
    Ok(out)
}

fn thread_count(opts: &WriteOptions, cpus: usize, work: usize) -> usize {
    let t = match opts.threads {
        0 => cpus.clamp(MIN_WRITE_THREADS, MAX_WRITE_THREADS),
        t => t,
    };
    t.min(work).max(1)
}

fn check_options(opts: &WriteOptions) -> Result<()> {
    if opts.chunk_bytes == 0 || opts.slots_per_thread == 0 || opts.chunk_bytes > 1 << 30 {
        return Err(StorageError::request(
            format!(
                "write options chunk_bytes = {}, slots_per_thread = {}: both must be at least 1, chunk_bytes at most 1 GiB",
                opts.chunk_bytes, opts.slots_per_thread
            ),
            "use WriteOptions::default() (8 MiB writes, 2 slots per thread)",
        ));
    }
    if opts.threads > 4096 {
        return Err(StorageError::request(
            format!("write options threads = {} is over 4096", opts.threads),
            "use 0 (numapin picks) or a few threads",
        ));
    }
    Ok(())
}

/// Checks that every device part lies in one allocation of its GPU.
fn check_device_parts(files: &[FileParts<'_>]) -> Result<()> {
    for p in files.iter().flat_map(|f| f.parts.iter()) {
        if let Data::Device { gpu, ptr, len } = *p {
            if len > 0 {
                let _ctx = cuda::ContextGuard::push(gpu.0)
                    .map_err(cuda_error(gpu, "making the context current"))?;
                check_device_range(gpu, ptr, len, "source")?;
            }
        }
    }
    Ok(())
}

/// Refuses two files that are one file.
fn check_distinct(targets: &[target::Target]) -> Result<()> {
    let mut seen: std::collections::HashSet<&Path> = std::collections::HashSet::new();
    for t in targets {
        if !seen.insert(&t.real) {
            return Err(StorageError::request(
                format!(
                    "{} is written twice in one write (as {})",
                    t.real.display(),
                    t.shown.display()
                ),
                "give each file its own path",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
