//! Arena benchmarks: alloc+free latency (one thread and 8 at once, against
//! malloc/free and, with a GPU, cuMemAllocHost/cuMemFreeHost), and region
//! creation per GiB (serial and parallel populate, against mmap+mlock).
//!
//! `cargo bench --bench arena`; results are recorded in docs/BENCHMARKS.md.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use numapin::arena::measure;
use numapin::runtime::{Runtime, RuntimeConfig};
use numapin::topology::{ProbeOptions, Topology};

const SIZE: usize = 64 << 10;

fn runtime() -> Arc<Runtime> {
    let t = Topology::probe(&ProbeOptions::from_process()).expect("probe this machine");
    Arc::new(Runtime::new(t, RuntimeConfig::default()).expect("runtime"))
}

fn node(rt: &Runtime) -> u32 {
    rt.stats().first().expect("a node with memory").node
}

fn alloc_free(c: &mut Criterion) {
    let rt = runtime();
    let node = node(&rt);
    drop(rt.alloc_on_node(node, SIZE).unwrap());
    let mut g = c.benchmark_group("alloc_free_64KiB");
    g.bench_function("arena_1_thread", |b| {
        b.iter(|| black_box(rt.alloc_on_node(node, black_box(SIZE)).unwrap()))
    });
    g.bench_function("malloc_1_thread", |b| {
        b.iter(|| black_box(Vec::<u8>::with_capacity(black_box(SIZE))))
    });
    // Per-thread latency with 2 and 8 threads doing it at once: the wall
    // time of the slowest thread over its pairs (each thread does `iters`).
    for threads in [2usize, 8] {
        g.bench_function(format!("arena_{threads}_threads"), |b| {
            b.iter_custom(|iters| {
                let barrier = std::sync::Barrier::new(threads);
                std::thread::scope(|s| {
                    let hs: Vec<_> = (0..threads)
                        .map(|_| {
                            s.spawn(|| {
                                barrier.wait();
                                let t = Instant::now();
                                for _ in 0..iters {
                                    black_box(rt.alloc_on_node(node, black_box(SIZE)).unwrap());
                                }
                                t.elapsed()
                            })
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).max().unwrap()
                })
            })
        });
    }
    if numapin::cuda::available() && numapin::cuda::set_device(0).is_ok() {
        g.bench_function("cuMemAllocHost_1_thread", |b| {
            b.iter(|| black_box(numapin::cuda::HostAlloc::new(SIZE).unwrap()))
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
                    .unwrap();
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
    if numapin::cuda::available() && numapin::cuda::set_device(0).is_ok() {
        g.bench_function("cuMemAllocHost", |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    drop(numapin::cuda::HostAlloc::new(bytes).unwrap());
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

criterion_group!(benches, overhead, alloc_free, region_create);
criterion_main!(benches);
