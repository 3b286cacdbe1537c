//! [`pinned_copy`]: a pinned copy of host memory on a GPU's node, made by
//! threads on that node.
//!
//! The threads are kept: one small pool per CPU set (a node's allowed CPUs),
//! started on first use and bound to those CPUs, so a copy pays no thread
//! start (16 threads cost about a millisecond to start and bind, a third of
//! a 64 MiB copy). A copy is split into chunks the pool's threads take in
//! turn; the caller waits for the last one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use super::stream_copy;
use super::StagedError;
use crate::runtime::Target;
use crate::runtime::{PinnedBuf, Runtime};
use crate::CpuList;

/// Below this many bytes one thread copies: waking others costs more than
/// it saves.
const PARALLEL_FROM: usize = 4 << 20;
/// Bytes each thread takes at a time.
const CHUNK: usize = 2 << 20;

/// A pinned copy of `src` in `rt`'s arena on `target`'s node (a GPU's own
/// node for [`Target::Gpu`]), copied by up to
/// [`MAX_STAGED_THREADS`](super::MAX_STAGED_THREADS) threads bound to the
/// node's allowed CPUs, with streaming stores. The buffer is `src.len()`
/// bytes long, except for an empty `src`, which gives a one-byte buffer
/// (the arena lends no empty buffers).
///
/// This is the NUMA-local replacement for a framework's `pin_memory()`:
/// the copy runs on the destination's node, where its writes are local.
/// The buffer is [`Runtime::alloc`]'s, counted in the node's budget as
/// every buffer is; this function only fills it.
///
/// # Errors
///
/// [`Runtime::alloc`]'s errors for `target` and `src.len()` bytes.
pub fn pinned_copy(rt: &Runtime, src: &[u8], target: Target) -> Result<PinnedBuf, StagedError> {
    let place = rt.place(target)?;
    let mut buf = rt.alloc(Target::HostNode(place.node), src.len().max(1))?;
    copy_parallel(&mut buf[..src.len()], src, &place.cpus)?;
    Ok(buf)
}

/// One copy the pool works on: chunks taken in turn, the caller waiting
/// until every chunk is done.
struct Job {
    dst: usize,
    src: usize,
    len: usize,
    next: AtomicUsize,
    left: Mutex<usize>,
    done: Condvar,
}

impl Job {
    /// Copies chunks until none is left; returns how many it copied.
    fn work(&self) -> usize {
        let chunks = self.len.div_ceil(CHUNK);
        let mut copied = 0;
        loop {
            let k = self.next.fetch_add(1, Ordering::Relaxed);
            if k >= chunks {
                return copied;
            }
            let off = k * CHUNK;
            let n = CHUNK.min(self.len - off);
            // SAFETY: `dst` and `src` are the caller's live, non-overlapping
            // buffers of `len` bytes (copy_parallel waits until every chunk
            // is done before they can go away); chunk k is handed to exactly
            // one thread by the atomic counter.
            let (d, s) = unsafe {
                (
                    std::slice::from_raw_parts_mut((self.dst + off) as *mut u8, n),
                    std::slice::from_raw_parts((self.src + off) as *const u8, n),
                )
            };
            stream_copy::copy(d, s);
            copied += 1;
        }
    }

    fn finish(&self, chunks: usize) {
        if chunks == 0 {
            return;
        }
        let mut left = self.left.lock().unwrap_or_else(|p| p.into_inner());
        *left -= chunks;
        if *left == 0 {
            self.done.notify_all();
        }
    }
}

/// Threads bound to one CPU set, waiting for jobs.
struct Pool {
    queue: Mutex<Vec<Arc<Job>>>,
    wake: Condvar,
    /// Threads that started.
    threads: AtomicUsize,
}

impl Pool {
    fn start(cpus: &CpuList, threads: usize) -> Arc<Pool> {
        let pool = Arc::new(Pool {
            queue: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            threads: AtomicUsize::new(0),
        });
        for i in 0..threads {
            let (p, cpus) = (pool.clone(), cpus.clone());
            let started = std::thread::Builder::new()
                .name(format!("numapin-pin{i}"))
                .spawn(move || {
                    // Best effort: an unbound thread still copies, only
                    // further from the memory.
                    let _ = crate::affinity::bind_current_thread(&cpus);
                    p.serve();
                });
            if started.is_err() {
                break;
            }
            pool.threads.fetch_add(1, Ordering::Relaxed);
        }
        pool
    }

    /// A pool thread's life: take the newest job, work on it, repeat. The
    /// pool lives as long as the process (it is kept in a static).
    fn serve(&self) {
        loop {
            let job = {
                let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if let Some(j) = q.last() {
                        break j.clone();
                    }
                    q = self.wake.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            let n = job.work();
            // Nothing left to take: the job leaves the queue (once).
            {
                let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                q.retain(|j| !Arc::ptr_eq(j, &job));
            }
            job.finish(n);
        }
    }
}

/// The pool of `cpus` in this process, started on first use.
fn pool_for(cpus: &CpuList) -> Arc<Pool> {
    static POOLS: OnceLock<Mutex<HashMap<String, Arc<Pool>>>> = OnceLock::new();
    let pools = POOLS.get_or_init(Default::default);
    let mut g = pools.lock().unwrap_or_else(|p| p.into_inner());
    // Keyed by process too: a forked child inherits the map but not the
    // threads, and starts its own pool.
    g.entry(format!("{}/{cpus}", std::process::id()))
        .or_insert_with(|| Pool::start(cpus, cpus.len().clamp(1, super::MAX_STAGED_THREADS)))
        .clone()
}

/// Copies `src` into `dst` (host memory both, the same length) with
/// streaming stores, on threads bound to `cpus` (started on first use and
/// kept per CPU set, at most [`MAX_STAGED_THREADS`](super::MAX_STAGED_THREADS))
/// for copies of 4 MiB or more, on the calling thread for smaller ones or
/// fewer than two CPUs.
///
/// # Errors
///
/// None today (the `Result` leaves room for a copy that can fail).
///
/// # Panics
///
/// When the lengths differ, like `copy_from_slice`.
pub fn copy_host(dst: &mut [u8], src: &[u8], cpus: &CpuList) -> Result<(), StagedError> {
    copy_parallel(dst, src, cpus)
}

/// Copies `src` into `dst` with threads bound to `cpus` (the calling thread
/// alone for small copies).
pub(crate) fn copy_parallel(dst: &mut [u8], src: &[u8], cpus: &CpuList) -> Result<(), StagedError> {
    assert_eq!(dst.len(), src.len(), "copy_parallel: lengths differ");
    if src.len() < PARALLEL_FROM || cpus.len() < 2 {
        stream_copy::copy(dst, src);
        return Ok(());
    }
    let pool = pool_for(cpus);
    let chunks = src.len().div_ceil(CHUNK);
    let job = Arc::new(Job {
        dst: dst.as_mut_ptr() as usize,
        src: src.as_ptr() as usize,
        len: src.len(),
        next: AtomicUsize::new(0),
        left: Mutex::new(chunks),
        done: Condvar::new(),
    });
    pool.queue
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(job.clone());
    pool.wake.notify_all();
    if pool.threads.load(Ordering::Relaxed) == 0 {
        // No thread could be started: copy here.
        let n = job.work();
        job.finish(n);
    }
    // The caller waits (it may run on another node, where its writes
    // would cross the socket link), and the buffers outlive every chunk.
    let mut left = job.left.lock().unwrap_or_else(|p| p.into_inner());
    while *left > 0 {
        left = job.done.wait(left).unwrap_or_else(|p| p.into_inner());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fork test must not fork while another test holds the pools' lock.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[test]
    fn parallel_copies_are_exact_at_every_size_and_alignment() {
        let _g = serial();
        let cpus = crate::platform::sys::sched_getaffinity_self().unwrap();
        let src: Vec<u8> = (0..(9 << 20) + 77)
            .map(|i| u8::try_from(i * 31 % 251).unwrap())
            .collect();
        for (off, len) in [
            (0, 1),
            (3, 4 << 20),
            (1, (9 << 20) + 5),
            (0, (9 << 20) + 77),
        ] {
            let mut dst = vec![0u8; len];
            copy_parallel(&mut dst, &src[off..off + len], &cpus).unwrap();
            assert!(dst == src[off..off + len], "offset {off} length {len}");
        }
    }

    #[test]
    fn a_forked_child_gets_a_pool_of_its_own() {
        let _g = serial();
        let cpus = crate::platform::sys::sched_getaffinity_self().unwrap();
        let src = vec![7u8; 8 << 20];
        let mut dst = vec![0u8; 8 << 20];
        copy_parallel(&mut dst, &src, &cpus).unwrap();
        // SAFETY: the child only copies (allocations included, as glibc
        // allows after fork) and leaves with _exit.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let mut d = vec![0u8; 8 << 20];
                let ok = copy_parallel(&mut d, &src, &cpus).is_ok() && d == src;
                // SAFETY: ends the child at once.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
            }
        }
    }

    #[test]
    fn concurrent_copies_share_the_pool() {
        let _g = serial();
        let cpus = crate::platform::sys::sched_getaffinity_self().unwrap();
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let cpus = &cpus;
                s.spawn(move || {
                    let src = vec![t; 6 << 20];
                    let mut dst = vec![0u8; 6 << 20];
                    copy_parallel(&mut dst, &src, cpus).unwrap();
                    assert!(dst.iter().all(|&b| b == t));
                });
            }
        });
    }
}
