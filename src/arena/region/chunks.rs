//! How a region made in parts is faulted in: the chunks the populate
//! threads take front to back from one counter, which part each belongs
//! to, and how many threads populate beside the registering and counting
//! threads.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::{Region, VERIFY_SPLIT_BYTES, VERIFY_THREADS};

/// Bytes a populate thread takes at a time (at least one page of the
/// region's kind): small enough that the threads finish a part together,
/// large enough that the shared counter is touched once per two huge pages.
pub(super) const CHUNK_BYTES: usize = 4 << 20;

/// Measurement hooks (0: the rules below).
pub(super) static PIPE_POPULATE_NOW: AtomicUsize = AtomicUsize::new(0);
pub(super) static PIPE_VERIFY_NOW: AtomicUsize = AtomicUsize::new(0);

/// Threads that fault a region in parts in, of the `total` a region's
/// populate step may use: all but two, which the registering thread and a
/// counting thread run on (the faulting is bound by memory bandwidth, not
/// by threads, and a registering thread that waits for a CPU holds up the
/// pipeline; docs/BENCHMARKS.md, "cold pinning").
pub(super) fn pipeline_populate_threads(total: usize) -> usize {
    match PIPE_POPULATE_NOW.load(Ordering::Relaxed) {
        0 if total > 4 => total - 2,
        0 => total.max(1),
        n => n,
    }
}

/// Threads that count where a region's pages are, part by part, while it is
/// made in parts: as many as a region of `len` bytes in one piece is
/// checked on.
pub(super) fn pipeline_verify_threads(len: usize) -> usize {
    match PIPE_VERIFY_NOW.load(Ordering::Relaxed) {
        0 if len >= VERIFY_SPLIT_BYTES => VERIFY_THREADS,
        0 => 1,
        n => n,
    }
}

/// The chunks of a region made in parts, and the parts still being faulted
/// in.
pub(super) struct ChunkPlan {
    /// `(start, bytes)` of each part, in order.
    parts: Vec<(usize, usize)>,
    /// `(start, bytes, part)` of each chunk, in address order.
    chunks: Vec<(usize, usize, usize)>,
    /// Chunks not yet faulted in, per part.
    left: Vec<AtomicUsize>,
    /// Populate threads.
    pub(super) threads: usize,
}

impl ChunkPlan {
    /// The chunks of `parts` (slices of `region`, of whole pages of its
    /// kind), for a region whose populate step may use `populate_threads`.
    pub(super) fn new(region: &Region, parts: &[(usize, usize)], populate_threads: usize) -> Self {
        let granule = region.methods.pages.granule();
        let chunk = CHUNK_BYTES.next_multiple_of(granule);
        let mut chunks = Vec::new();
        let mut left = Vec::with_capacity(parts.len());
        for (i, &(a, l)) in parts.iter().enumerate() {
            let n = l.div_ceil(chunk);
            left.push(AtomicUsize::new(n));
            chunks.extend((0..n).map(|k| (a + k * chunk, chunk.min(l - k * chunk), i)));
        }
        let threads =
            pipeline_populate_threads(populate_threads.max(1)).clamp(1, chunks.len().max(1));
        ChunkPlan {
            parts: parts.to_vec(),
            chunks,
            left,
            threads,
        }
    }

    /// One populate thread's work: takes chunks from `next` until none is
    /// left or `stop` is set, faults each in with `fault`, and gives every
    /// part whose last chunk it finished to `done`.
    pub(super) fn run(
        &self,
        next: &AtomicUsize,
        stop: &AtomicBool,
        fault: &impl Fn(usize, usize) -> std::io::Result<()>,
        mut done: impl FnMut((usize, usize)),
    ) -> std::io::Result<()> {
        while !stop.load(Ordering::Relaxed) {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(a, l, part)) = self.chunks.get(i) else {
                break;
            };
            fault(a, a + l)?;
            if self.left[part].fetch_sub(1, Ordering::AcqRel) == 1 {
                done(self.parts[part]);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever the threads' interleaving, every chunk is faulted once,
    /// every part is handed on once, after all its chunks, and the chunks
    /// tile the parts.
    #[test]
    fn every_part_is_handed_on_once_after_all_its_chunks() {
        let parts: Vec<(usize, usize)> =
            vec![(0, 10 << 20), (10 << 20, 6 << 20), (16 << 20, 2 << 20)];
        let chunk = CHUNK_BYTES;
        let mut chunks = Vec::new();
        let mut left = Vec::new();
        for (i, &(a, l)) in parts.iter().enumerate() {
            let n = l.div_ceil(chunk);
            left.push(AtomicUsize::new(n));
            chunks.extend((0..n).map(|k| (a + k * chunk, chunk.min(l - k * chunk), i)));
        }
        let plan = ChunkPlan {
            parts: parts.clone(),
            chunks,
            left,
            threads: 4,
        };
        let faulted = std::sync::Mutex::new(Vec::new());
        let handed = std::sync::Mutex::new(Vec::new());
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    plan.run(
                        &next,
                        &stop,
                        &|a, b| {
                            faulted.lock().unwrap().push((a, b));
                            Ok(())
                        },
                        |p| {
                            let f = faulted.lock().unwrap();
                            let covered: usize = f
                                .iter()
                                .filter(|(a, _)| *a >= p.0 && *a < p.0 + p.1)
                                .map(|(a, b)| b - a)
                                .sum();
                            assert_eq!(covered, p.1, "part {p:?} handed on before all its chunks");
                            handed.lock().unwrap().push(p);
                        },
                    )
                    .unwrap();
                });
            }
        });
        let mut f = faulted.into_inner().unwrap();
        f.sort_unstable();
        let mut at = 0;
        for (a, b) in f {
            assert_eq!(a, at, "chunks leave a gap or overlap");
            at = b;
        }
        assert_eq!(at, 18 << 20);
        let mut h = handed.into_inner().unwrap();
        h.sort_unstable();
        assert_eq!(h, parts);
    }

    /// A stop set by another thread ends the work and hands on no part
    /// whose chunks were not all faulted in.
    #[test]
    fn a_failure_stops_the_others() {
        let parts = vec![(0usize, 64usize << 20)];
        let n = (64usize << 20) / CHUNK_BYTES;
        let plan = ChunkPlan {
            parts,
            chunks: (0..n).map(|k| (k * CHUNK_BYTES, CHUNK_BYTES, 0)).collect(),
            left: vec![AtomicUsize::new(n)],
            threads: 2,
        };
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let r = plan.run(
            &next,
            &stop,
            &|a, _| {
                if a >= 3 * CHUNK_BYTES {
                    Err(std::io::Error::other("refused"))
                } else {
                    Ok(())
                }
            },
            |_| panic!("a part handed on after a failure"),
        );
        assert!(r.is_err());
    }
}
