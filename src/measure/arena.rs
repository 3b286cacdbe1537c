//! Measurements of the arena, for `numapin bench` and `benches/arena.rs`:
//! `arena_alloc_free` (ns), `region_create_per_gib` (ms) and
//! `arena_overhead` (ratio), each with a same-run baseline.

use std::hint::black_box;
use std::time::{Duration, Instant};

use crate::arena::alloc::{region_size_for, Tlsf};
use crate::arena::region::{self, Region, RegionOptions};
use crate::arena::{OffNode, RegionMethods, RuntimeError};
use crate::runtime::{Runtime, Target};

/// Summary of repeated measurements.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Stats {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// How many samples.
    pub samples: usize,
}

impl Stats {
    /// Summarises `samples` (all zero when there are none).
    pub fn of(mut samples: Vec<f64>) -> Stats {
        if samples.is_empty() {
            return Stats {
                median: 0.0,
                min: 0.0,
                max: 0.0,
                samples: 0,
            };
        }
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let median = if n % 2 == 1 {
            samples[n / 2]
        } else {
            (samples[n / 2 - 1] + samples[n / 2]) / 2.0
        };
        Stats {
            median,
            min: samples[0],
            max: samples[n - 1],
            samples: n,
        }
    }
}

/// Pairs timed together per sample (a clock read costs about as much as
/// what is measured).
const BATCH: u32 = 64;

fn per_op_ns(d: Duration) -> f64 {
    d.as_secs_f64() * 1e9 / f64::from(BATCH)
}

/// Nanoseconds per `alloc(Target::HostNode(node), bytes)` + drop, once the node has
/// a region: `reps` samples of 64 pairs each.
///
/// # Errors
///
/// [`Error::Runtime`](crate::Error::Runtime) when the arena cannot lend the
/// buffers (an unknown node, the budget, the memlock limit).
pub fn alloc_free_ns(rt: &Runtime, node: u32, bytes: usize, reps: usize) -> crate::Result<Stats> {
    drop(rt.alloc(Target::HostNode(node), bytes)?);
    Ok(Stats::of(alloc_free_samples(rt, node, bytes, reps)?))
}

/// `reps` samples of [`BATCH`] alloc+free pairs, in ns per pair.
fn alloc_free_samples(
    rt: &Runtime,
    node: u32,
    bytes: usize,
    reps: usize,
) -> crate::Result<Vec<f64>> {
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..BATCH {
            black_box(rt.alloc(Target::HostNode(node), bytes)?);
        }
        samples.push(per_op_ns(t.elapsed()));
    }
    Ok(samples)
}

/// Pairs each thread does per round of [`alloc_free_ns_threads`].
const ROUND: u32 = 1024;

/// As [`alloc_free_ns`] with `threads` threads doing it at once on the same
/// node, measured as `benches/arena.rs` does: each of `reps` samples is one
/// round in which the threads, started together, each do a fixed number of pairs;
/// the sample is the slowest thread's time per pair (per-pair latency per
/// thread, waits for the lock and for a CPU included).
///
/// # Errors
///
/// As [`alloc_free_ns`].
pub fn alloc_free_ns_threads(
    rt: &Runtime,
    node: u32,
    bytes: usize,
    threads: usize,
    reps: usize,
) -> crate::Result<Stats> {
    drop(rt.alloc(Target::HostNode(node), bytes)?);
    let threads = threads.max(1);
    let barrier = std::sync::Barrier::new(threads);
    let per_thread: Vec<crate::Result<Vec<Duration>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut times = Vec::with_capacity(reps);
                    let mut failed = None;
                    for _ in 0..reps {
                        // Every thread takes part in every round, even after
                        // a failure, so that none waits forever.
                        barrier.wait();
                        if failed.is_some() {
                            continue;
                        }
                        let t = Instant::now();
                        for _ in 0..ROUND {
                            match rt.alloc(Target::HostNode(node), bytes) {
                                Ok(b) => drop(black_box(b)),
                                Err(e) => {
                                    failed = Some(e);
                                    break;
                                }
                            }
                        }
                        times.push(t.elapsed());
                    }
                    failed.map_or(Ok(times), Err)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .expect("measurement thread panicked")
                    .map_err(crate::Error::from)
            })
            .collect()
    });
    let mut rounds = vec![Duration::ZERO; reps];
    for times in per_thread {
        for (r, t) in rounds.iter_mut().zip(times?) {
            *r = (*r).max(t);
        }
    }
    Ok(Stats::of(
        rounds
            .into_iter()
            .map(|d| d.as_secs_f64() * 1e9 / f64::from(ROUND))
            .collect(),
    ))
}

/// Baseline: nanoseconds per `malloc(bytes)` + `free` (a `Vec` with that
/// capacity), measured like [`alloc_free_ns`].
pub fn malloc_free_ns(bytes: usize, reps: usize) -> Stats {
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..BATCH {
            black_box(Vec::<u8>::with_capacity(black_box(bytes)));
        }
        samples.push(per_op_ns(t.elapsed()));
    }
    Stats::of(samples)
}

/// Milliseconds per GiB to make (and tear down outside the timing) a region
/// of `bytes` on `node` of `rt`'s topology, populated by `threads` threads
/// (1 = serial, 0 = as many as the node's arena uses), registered with CUDA
/// when the runtime's configuration and the driver allow, with the
/// runtime's pages ([`crate::runtime::HugePages`]); with how the last
/// region was placed, pinned and verified, and its pages (first touch and
/// numa_maps where a seccomp profile refuses mbind and move_pages).
///
/// # Errors
///
/// [`Error::Runtime`](crate::Error::Runtime) for a node without an arena, and
/// the region's errors
/// ([`RuntimeError::System`] naming the
/// step, [`RuntimeError::Memlock`],
/// ...).
pub fn region_create_ms_per_gib(
    rt: &Runtime,
    node: u32,
    bytes: usize,
    threads: usize,
    reps: usize,
) -> crate::Result<(Stats, Option<RegionMethods>)> {
    let arena = rt.arena(node)?;
    let cfg = arena.config().clone();
    let opts = RegionOptions {
        node,
        size: bytes,
        cpus: cfg.cpus,
        // 0: as many as the arena uses on the node.
        populate_threads: if threads == 0 {
            cfg.populate_threads
        } else {
            threads
        },
        register: cfg.register,
        off_node: OffNode::Strict,
        pin_by_registration: None,
        backend: cfg.backend,
        huge_pages: cfg.huge_pages,
        // As the arena makes a region of this size for a small request.
        register_part_bytes: arena.part_bytes_for(bytes as u64, 0),
        pool_root: cfg.pool_root,
        shared: None,
        fail_after: None,
    };
    let mut samples = Vec::with_capacity(reps);
    let mut methods = None;
    for _ in 0..reps {
        let t = Instant::now();
        let r = Region::create(&opts)?;
        samples.push(super::ms_per_gib(t.elapsed(), r.len()));
        methods = Some(r.methods());
        drop(r);
    }
    Ok((Stats::of(samples), methods))
}

/// Baseline: milliseconds per GiB for a plain `mmap` + `mlock` (the
/// kernel populating serially, no binding, no check) of `bytes`.
///
/// # Errors
///
/// [`Error::Runtime`](crate::Error::Runtime)
/// ([`RuntimeError::System`]) when `mmap`
/// or `mlock` fails.
pub fn mmap_mlock_ms_per_gib(bytes: usize, reps: usize) -> crate::Result<Stats> {
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let d = region::mmap_mlock_baseline(bytes).map_err(|source| RuntimeError::System {
            node: 0,
            size: bytes as u64,
            step: region::Step::Lock,
            source,
        })?;
        samples.push(super::ms_per_gib(d, bytes));
    }
    Ok(Stats::of(samples))
}

/// The mix of sizes [`overhead_ratio`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeMix {
    /// Uniform over 4 KiB..=256 MiB.
    Uniform,
    /// Log-uniform over 4 KiB..=256 MiB (as many 4-8 KiB as 128-256 MiB
    /// buffers).
    LogUniform,
}

/// A small deterministic generator (xorshift64*), so figures repeat.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded (a zero seed is replaced).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        // 53 bits: exact in an f64.
        crate::num::ratio(self.next_u64() >> 11, 1 << 53)
    }
    /// A size from `mix` within 4 KiB..=256 MiB.
    pub fn size(&mut self, mix: SizeMix) -> u64 {
        const LO: u64 = 4 << 10;
        const HI: u64 = 256 << 20;
        match mix {
            SizeMix::Uniform => LO + self.next_u64() % (HI - LO + 1),
            SizeMix::LogUniform => {
                let x = crate::num::f64_from(LO) * crate::num::f64_from(HI / LO).powf(self.unit());
                crate::num::u64_saturating(x)
            }
        }
        .clamp(LO, HI)
    }
}

/// Bytes reserved over bytes requested after `count` buffers of random
/// sizes (`mix`) are allocated, one figure per seed `0..seeds`: the
/// arena's own bookkeeping and region sizing with `region_bytes` regions
/// and 4 KiB alignment, without touching memory (so it runs in
/// milliseconds for any size).
pub fn overhead_ratio(mix: SizeMix, count: usize, region_bytes: u64, seeds: u64) -> Stats {
    let samples = (0..seeds)
        .map(|seed| {
            let mut rng = Rng::new(seed + 1);
            let mut t = Tlsf::new(4096);
            let mut requested = 0u64;
            for _ in 0..count {
                let size = rng.size(mix);
                if t.alloc(size).is_none() {
                    t.add_region(region_size_for(size, region_bytes).0);
                    t.alloc(size)
                        .expect("a region sized for the request fits it");
                }
                requested += size;
            }
            crate::num::ratio(t.region_bytes(), requested.max(1))
        })
        .collect();
    Stats::of(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_samples() {
        let s = Stats::of(vec![3.0, 1.0, 2.0, 10.0]);
        assert_eq!((s.median, s.min, s.max, s.samples), (2.5, 1.0, 10.0, 4));
        assert_eq!(Stats::of(vec![]).samples, 0);
    }

    #[test]
    fn sizes_stay_in_range() {
        let mut r = Rng::new(7);
        for mix in [SizeMix::Uniform, SizeMix::LogUniform] {
            for _ in 0..10_000 {
                let s = r.size(mix);
                assert!((4096..=256 << 20).contains(&s));
            }
        }
    }

    /// The waste target: at most 1.10 bytes reserved per byte requested on
    /// a mix of random sizes from 4 KiB to 256 MiB (256 buffers, about
    /// 32 GiB uniform or 6 GiB log-uniform), for every seed.
    #[test]
    fn overhead_within_target() {
        for mix in [SizeMix::Uniform, SizeMix::LogUniform] {
            let s = overhead_ratio(mix, 256, 256 << 20, 20);
            assert!(s.max <= 1.10, "{mix:?}: {s:?}");
            assert!(s.min >= 1.0, "{mix:?}: {s:?}");
        }
    }
}
