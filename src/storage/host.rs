//! Reads into host memory: straight into place, by workers on the target's
//! CPUs, each range cut into pieces at aligned file offsets.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::num::usize_from;
use crate::runtime::{Runtime, Target};

use super::plan::host_pieces;
use super::{io, HostRange, ReadOptions, ReadReport, Result, Source};

/// One piece: `dst` gets the bytes of `source` at `offset`.
struct Item<'a> {
    source: usize,
    offset: u64,
    dst: &'a mut [u8],
}

pub(super) fn read(
    rt: &Runtime,
    sources: &[Source],
    ranges: Vec<HostRange<'_>>,
    target: Target,
    opts: &ReadOptions,
) -> Result<ReadReport> {
    let spans: Vec<(usize, u64, usize)> = ranges
        .iter()
        .map(|r| (r.source, r.offset, r.dst.len()))
        .collect();
    let (place, mut report) = super::prepare(rt, sources, &spans, target, opts)?;
    let started = Instant::now();
    // Reads straight into place: no slots for the cache to hold.
    let chunk = super::chunk_beside(opts, 0, 1);
    report.chunk_bytes = chunk;
    let mut items = Vec::new();
    for r in ranges {
        let a = sources[r.source].alignment();
        let mut rest = r.dst;
        for (off, _, len) in host_pieces(r.offset, rest.len(), a, chunk) {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
            items.push(Item {
                source: r.source,
                offset: off,
                dst: head,
            });
            rest = tail;
        }
    }
    if items.is_empty() {
        return Ok(report);
    }
    let threads = super::thread_count(opts, place.cpus.len(), items.len());
    let bounce_len = usize_from(sources.iter().map(Source::alignment).max().unwrap_or(4096));
    // One aligned block per worker for the unaligned ends of direct reads.
    let mut bounces = Vec::with_capacity(threads);
    for _ in 0..threads {
        bounces.push(rt.alloc(Target::HostNode(place.node), bounce_len)?);
    }
    let bounces = Mutex::new(bounces);
    let queue = Mutex::new(items.into_iter());
    let failed = AtomicBool::new(false);
    report.threads = threads;
    let counts = super::run_threads("readh", threads, &place.cpus, |_| {
        let mut bounce = bounces.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut c = io::Counts::default();
        while !failed.load(Ordering::Relaxed) {
            let Some(item) = queue.lock().unwrap_or_else(|p| p.into_inner()).next() else {
                break;
            };
            let need = item.dst.len();
            let b = bounce.as_deref_mut();
            match io::read_exact_at(
                &sources[item.source],
                item.offset,
                item.dst,
                need,
                opts.io,
                b,
            ) {
                Ok(n) => c.add(n),
                Err(e) => {
                    failed.store(true, Ordering::SeqCst);
                    return Err(e);
                }
            }
        }
        Ok(c)
    })?;
    counts.into_iter().for_each(|c| report.add(c));
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}
