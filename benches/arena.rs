//! Arena benchmarks: alloc+free latency (one thread, 2 and 8 at once, with
//! and without the thread caches, against malloc/free and, with a GPU,
//! cuMemAllocHost/cuMemFreeHost), and region
//! creation per GiB (serial and parallel populate, against mmap+mlock).
//!
//! `cargo bench --bench arena`; results are recorded in docs/BENCHMARKS.md.
// Benchmark sizes, counts and rates far inside every type's range.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use numapin::measure::arena as measure;
use numapin::runtime::CacheLimits;
use numapin::runtime::{Runtime, RuntimeConfig, Target};
use numapin::topology::{ProbeOptions, Topology};

const SIZE: usize = 64 << 10;

fn runtime_with(cfg: RuntimeConfig) -> Arc<Runtime> {
    let t = Topology::probe(&ProbeOptions::from_process()).expect("probe this machine");
    Arc::new(Runtime::new(t, cfg).expect("runtime"))
}

fn runtime() -> Arc<Runtime> {
    runtime_with(RuntimeConfig::default())
}

fn node(rt: &Runtime) -> u32 {
    rt.stats().first().expect("a node with memory").node
}

/// CPU time of the calling thread: unlike wall time, not inflated when a
/// shared machine has fewer free cores than threads, but still charged for
/// lock hand-offs and cache lines bouncing between cores.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which ts is.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `threads` threads, started together, each do `iters` alloc+free pairs;
/// the slowest thread's wall time (or, with `cpu`, the largest CPU time).
fn threads_at_once(rt: &Runtime, node: u32, threads: usize, iters: u64, cpu: bool) -> Duration {
    let barrier = std::sync::Barrier::new(threads);
    let clock = || {
        if cpu {
            thread_cpu_time()
        } else {
            Instant::now().duration_since(*START)
        }
    };
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let t = clock();
                    for _ in 0..iters {
                        black_box(rt.alloc(Target::HostNode(node), black_box(SIZE)).unwrap());
                    }
                    clock() - t
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).max().unwrap()
    })
}

static START: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

fn alloc_free(c: &mut Criterion) {
    let rt = runtime();
    let node = node(&rt);
    drop(rt.alloc(Target::HostNode(node), SIZE).unwrap());
    // Same-run baseline: the arena with its thread caches off (every alloc
    // and free through the node's lock).
    let locked = runtime_with(RuntimeConfig::default().with_thread_cache(CacheLimits::off()));
    drop(locked.alloc(Target::HostNode(node), SIZE).unwrap());
    let mut g = c.benchmark_group("alloc_free_64KiB");
    for (name, rt) in [("arena", &rt), ("arena_nocache", &locked)] {
        g.bench_function(format!("{name}_1_thread"), |b| {
            b.iter(|| black_box(rt.alloc(Target::HostNode(node), black_box(SIZE)).unwrap()))
        });
    }
    g.bench_function("malloc_1_thread", |b| {
        b.iter(|| black_box(Vec::<u8>::with_capacity(black_box(SIZE))))
    });
    // Per-thread latency with 2 and 8 threads doing it at once: the wall
    // time (and CPU time) of the slowest thread over its pairs.
    for threads in [2usize, 8] {
        for (name, rt) in [("arena", &rt), ("arena_nocache", &locked)] {
            for (clock, cpu) in [("", false), ("_cpu_time", true)] {
                g.bench_function(format!("{name}_{threads}_threads{clock}"), |b| {
                    b.iter_custom(|iters| threads_at_once(rt, node, threads, iters, cpu))
                });
            }
        }
    }
    if numapin::gpu::available() && numapin::gpu::set_device(0).is_ok() {
        g.bench_function("cuMemAllocHost_1_thread", |b| {
            b.iter(|| numapin::measure::copy::host_alloc_free(black_box(SIZE)).unwrap())
        });
    }
    g.finish();
}

fn region_create(c: &mut Criterion) {
    let rt = runtime();
    let node = node(&rt);
    let bytes = 256 << 20;
    let mut g = c.benchmark_group("region_create_256MiB");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(8))
        .throughput(Throughput::Bytes(bytes as u64));
    for threads in [1usize, 2, 4] {
        g.bench_with_input(
            BenchmarkId::new("arena_populate_threads", threads),
            &threads,
            |b, &threads| {
                b.iter_custom(|iters| {
                    let per = measure::region_create_ms_per_gib(
                        &rt,
                        node,
                        bytes,
                        threads,
                        iters as usize,
                    )
                    .unwrap()
                    .0;
                    // Back from ms/GiB to the time of `iters` regions.
                    Duration::from_secs_f64(per.median / 1e3 * iters as f64 / 4.0)
                })
            },
        );
    }
    g.bench_function("mmap_mlock", |b| {
        b.iter_custom(|iters| {
            let per = measure::mmap_mlock_ms_per_gib(bytes, iters as usize).unwrap();
            Duration::from_secs_f64(per.median / 1e3 * iters as f64 / 4.0)
        })
    });
    if numapin::gpu::available() && numapin::gpu::set_device(0).is_ok() {
        g.bench_function("cuMemAllocHost", |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    numapin::measure::copy::host_alloc_free(bytes).unwrap();
                }
                t.elapsed()
            })
        });
    }
    g.finish();
}

/// Not a timing: prints `arena_overhead`, bytes reserved over bytes
/// requested for 256 random sizes from 4 KiB to 256 MiB, over 20 seeds.
fn overhead(_: &mut Criterion) {
    for mix in [measure::SizeMix::Uniform, measure::SizeMix::LogUniform] {
        let s = measure::overhead_ratio(mix, 256, 256 << 20, 20);
        println!(
            "arena_overhead {mix:?}: median {:.3} min {:.3} max {:.3} ({} seeds)",
            s.median, s.min, s.max, s.samples
        );
    }
}

/// What the machine budget adds to making and releasing a region: one
/// reservation and one release in its state file, with 0, 7 and 63 other
/// live processes' records in it (other ledgers of the same file, whose
/// locks conflict as other processes' do).
fn machine_budget(c: &mut Criterion) {
    let mut g = c.benchmark_group("machine_budget_reserve_release");
    for others in [0usize, 7, 63] {
        let dir = tempfile::tempdir().unwrap();
        let held: Vec<_> = (0..others)
            .map(|_| numapin::internals::MachineLedger::new(dir.path()))
            .collect();
        for l in &held {
            assert!(l.reserve(0, 1 << 20, u64::MAX / 4));
        }
        let me = numapin::internals::MachineLedger::new(dir.path());
        // Held elsewhere, so that the loop never removes the file.
        assert!(me.reserve(1, 1 << 20, u64::MAX / 4));
        g.bench_function(format!("{others}_other_processes"), |b| {
            b.iter(|| {
                assert!(me.reserve(0, 2 << 20, u64::MAX / 4));
                me.release(0, 2 << 20);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, overhead, alloc_free, region_create, machine_budget);
criterion_main!(benches);
