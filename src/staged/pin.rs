//! [`pin`]: a pinned copy of host memory on a GPU's node, made by threads
//! on that node.

use std::sync::Mutex;

use super::stream_copy;
use crate::loader::{placement, LoaderError, Target};
use crate::runtime::{PinnedBuf, Runtime};

/// Below this many bytes one thread copies: starting threads costs more
/// than it saves.
const PARALLEL_FROM: usize = 4 << 20;
/// Bytes each thread takes at a time.
const CHUNK: usize = 4 << 20;

/// A pinned copy of `src` in `rt`'s arena on `target`'s node (a GPU's own
/// node for [`Target::Gpu`]), copied by up to
/// [`MAX_STAGED_THREADS`](super::MAX_STAGED_THREADS) threads bound to the
/// node's allowed CPUs, with streaming stores. The buffer holds exactly
/// `src.len()` bytes (at least one: an empty `src` gives a one-byte
/// buffer of length... see [`PinnedBuf::len`]; use a length check first).
///
/// This is the NUMA-local replacement for a framework's `pin_memory()`:
/// the copy runs on the destination's node, where its writes are local.
pub fn pin(rt: &Runtime, src: &[u8], target: Target) -> Result<PinnedBuf, LoaderError> {
    let place = placement::resolve(rt, target)?;
    let mut buf = rt.alloc_on_node(place.node, src.len().max(1))?;
    copy_parallel(&mut buf[..src.len()], src, &place.cpus)?;
    Ok(buf)
}

/// Copies `src` into `dst` with threads bound to `cpus` (the calling thread
/// alone for small copies).
pub(crate) fn copy_parallel(
    dst: &mut [u8],
    src: &[u8],
    cpus: &crate::CpuList,
) -> Result<(), LoaderError> {
    let threads = if src.len() < PARALLEL_FROM {
        1
    } else {
        cpus.len()
            .clamp(1, super::MAX_STAGED_THREADS)
            .min(src.len().div_ceil(CHUNK))
    };
    if threads <= 1 {
        stream_copy::copy(dst, src);
        return Ok(());
    }
    let chunks = Mutex::new(dst.chunks_mut(CHUNK).zip(src.chunks(CHUNK)));
    let work = || loop {
        let next = chunks.lock().unwrap_or_else(|p| p.into_inner()).next();
        let Some((d, s)) = next else { break };
        stream_copy::copy(d, s);
    };
    std::thread::scope(|scope| {
        // The calling thread only waits: it may run on another node, where
        // its writes would cross the socket link.
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads {
            let work = &work;
            let spawned = std::thread::Builder::new()
                .name(format!("numapin-pin{i}"))
                .spawn_scoped(scope, move || {
                    // Best effort: a thread that cannot be bound still copies,
                    // only further from the memory.
                    let _ = crate::affinity::bind_current_thread(cpus);
                    work();
                });
            match spawned {
                Ok(h) => handles.push(h),
                // Fewer threads: the ones running take the remaining chunks.
                Err(_) => break,
            }
        }
        if handles.is_empty() {
            work();
        }
        for h in handles {
            h.join().map_err(|_| {
                LoaderError::setup(
                    "pinning a copy",
                    "report this as a numapin bug",
                    "a copy thread panicked",
                )
            })?;
        }
        Ok(())
    })
}
