//! `numapin bench`: how fast data reaches each GPU, and what the arena costs.
//!
//! Every figure is the median of timed repetitions after warm-up; the spread
//! (min, max) and the number of repetitions come with it. Copies are timed
//! with CUDA events on the copy's own stream; host-side figures with the
//! monotonic clock. Result names and units are documented in
//! `docs/bench.md` and are stable.

use serde_json::Value;

use crate::error::{CliError, Result};
use numapin::gpu as cuda;
use numapin::measure::arena::{self as measure, SizeMix, Stats};
use numapin::measure::copy::{all_gpus_gbps, copy_gbps_from, host_alloc_ms_per_gib, Source};

use super::report::{machine, node_methods, Sink};
pub(super) use super::report::{BenchOptions, BenchReport, BenchResult, Measure};
use numapin::runtime::{Runtime, Target};
use numapin::CudaOrdinal;

/// Runs the measurements; `progress` hears what runs now. A measurement
/// that pins memory may fail (the memlock limit): the ones that follow it
/// and pin memory too are skipped, the others still run, and the failure
/// comes back beside the report.
pub(super) fn run(
    rt: &Runtime,
    opts: &BenchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<(BenchReport, Option<CliError>)> {
    if opts.reps == 0 {
        return Err(CliError::Usage {
            problem: "--reps must be at least 1".into(),
            fix: "give --reps 1 or more".into(),
        });
    }
    let visible: Vec<CudaOrdinal> = rt
        .topology()
        .cuda
        .ordinals
        .iter()
        .filter(|e| e.gpu.is_some())
        .map(|e| e.ordinal)
        .collect();
    let gpu_ok = cuda::available() && !visible.is_empty();
    let ordinals = chosen_gpus(opts, &visible)?;
    let mut report = BenchReport {
        schema_version: 1,
        machine: machine(rt, &ordinals),
        results: Vec::new(),
        notes: Vec::new(),
    };
    let mut out = Sink::new(&mut report, progress);
    if !gpu_ok {
        out.note(match cuda::driver_version() {
            Err(e) => format!("GPU figures need a CUDA driver; host-side figures only ({e})"),
            Ok(_) => {
                "the CUDA driver sees no GPU (check CUDA_VISIBLE_DEVICES); host-side figures only"
                    .into()
            }
        });
    }
    let has = |m: Measure| opts.measures.contains(&m);
    if has(Measure::Arena) {
        if let Some(failure) = arena_figures(rt, opts, gpu_ok, &mut out) {
            return Ok((report, Some(failure)));
        }
    }
    if gpu_ok && has(Measure::Copy) {
        for &g in &ordinals {
            copy_figures(rt, opts, g, &mut out)?;
        }
    }
    if gpu_ok && has(Measure::AllGpus) && !ordinals.is_empty() {
        out.progress("all GPUs at once");
        let s = all_gpus_gbps(rt, &ordinals, opts.copy_bytes, opts.warmup, opts.reps)?;
        out.push(
            BenchResult::new("h2d_all_gpus", "GB/s", &s)
                .with("gpus", ordinals.len())
                .with("bytes", opts.copy_bytes),
        );
    }
    extra::run(rt, opts, &ordinals, gpu_ok, &mut out)?;
    if has(Measure::Pinning) {
        super::pinning::run(rt, opts, &ordinals, gpu_ok, &mut out)?;
    } else if has(Measure::ColdPinning) && gpu_ok {
        super::pinning::run_cold(rt, opts, &mut out)?;
    }
    Ok((report, None))
}

/// The GPUs measured: those of `--gpus`, each one of the `visible` CUDA
/// ordinals, or else every visible one.
fn chosen_gpus(opts: &BenchOptions, visible: &[CudaOrdinal]) -> Result<Vec<CudaOrdinal>> {
    let Some(list) = &opts.gpus else {
        return Ok(visible.to_vec());
    };
    for g in list {
        if !visible.contains(g) {
            return Err(CliError::Usage {
                problem: format!(
                    "GPU {g} is not a CUDA ordinal of this process (visible: {})",
                    visible
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                fix: "give --gpus with ordinals as `numapin topo` lists them in the CUDA column"
                    .into(),
            });
        }
    }
    Ok(list.clone())
}

/// The arena's figures on the calling thread's node: buffer latency
/// (against malloc), region creation (against the driver's or plain
/// locked memory) and the allocator's overhead. The first failure of a
/// measurement that pins memory comes back; those after it that pin
/// memory are skipped.
fn arena_figures(
    rt: &Runtime,
    opts: &BenchOptions,
    gpu_ok: bool,
    out: &mut Sink,
) -> Option<CliError> {
    let node0 = rt.calling_thread_node();
    let mut failure = arena_latency(rt, opts, node0, out).err();
    let base = measure::malloc_free_ns(64 << 10, 20_000 * opts.reps.max(1));
    out.push(BenchResult::new("malloc_free", "ns", &base).with("bytes", 64 << 10));
    if failure.is_none() {
        failure = region_creation(rt, opts, node0, gpu_ok, out).err();
    }
    out.progress("arena overhead");
    let s = measure::overhead_ratio(SizeMix::LogUniform, 256, 256 << 20, 10);
    out.push(
        BenchResult::new("arena_overhead", "ratio", &s).with("sizes", "4 KiB-256 MiB log-uniform"),
    );
    failure
}

/// A 64 KiB buffer's alloc+free latency on `node0`, on one thread and on
/// several at once.
fn arena_latency(rt: &Runtime, opts: &BenchOptions, node0: u32, out: &mut Sink) -> Result<()> {
    out.progress("arena alloc+free latency");
    let s = measure::alloc_free_ns(rt, node0, 64 << 10, 20_000 * opts.reps.max(1))?;
    out.push(
        BenchResult::new("arena_alloc_free", "ns", &s)
            .with("node", node0)
            .with("bytes", 64 << 10)
            .with("threads", 1)
            .with_methods(node_methods(rt, node0)),
    );
    let threads = rt.topology().allowed.cpus.len().clamp(2, 8);
    out.progress(&format!(
        "arena alloc+free latency, {threads} threads at once"
    ));
    let s = measure::alloc_free_ns_threads(rt, node0, 64 << 10, threads, 2_000 * opts.reps.max(1))?;
    out.push(
        BenchResult::new("arena_alloc_free", "ns", &s)
            .with("node", node0)
            .with("bytes", 64 << 10)
            .with("threads", threads)
            .with_methods(node_methods(rt, node0)),
    );
    Ok(())
}

/// A 256 MiB region's creation per GiB on `node0`, beside the driver's
/// `cuMemAllocHost` (with a GPU) or plain mmap+mlock (without).
fn region_creation(
    rt: &Runtime,
    opts: &BenchOptions,
    node0: u32,
    gpu_ok: bool,
    out: &mut Sink,
) -> Result<()> {
    out.progress("region creation per GiB");
    let (s, methods) = measure::region_create_ms_per_gib(
        rt,
        node0,
        256 << 20,
        rt.config().populate_threads,
        opts.reps.min(5),
    )?;
    out.push(
        BenchResult::new("region_create_per_gib", "ms", &s)
            .with("node", node0)
            .with("region_bytes", 256 << 20)
            .with_methods(methods),
    );
    if gpu_ok {
        let s = host_alloc_ms_per_gib(256 << 20, opts.reps.min(5))?;
        out.push(BenchResult::new("cuMemAllocHost_per_gib", "ms", &s).with("bytes", 256 << 20));
    } else {
        let s = measure::mmap_mlock_ms_per_gib(256 << 20, opts.reps.min(5))?;
        out.push(BenchResult::new("mmap_mlock_per_gib", "ms", &s).with("bytes", 256 << 20));
    }
    Ok(())
}

/// GPU `g`'s copies both ways from each kind of host memory
/// ([`copy_sources`]).
fn copy_figures(rt: &Runtime, opts: &BenchOptions, g: CudaOrdinal, out: &mut Sink) -> Result<()> {
    for (label, src) in copy_sources(rt, g) {
        out.progress(&format!("GPU {g}: {label} copies"));
        let (h2d, d2h) = copy_gbps_from(rt, g, src, opts.copy_bytes, opts.warmup, opts.reps)?;
        let methods = match src {
            Source::Arena(n) => node_methods(rt, n),
            _ => None,
        };
        for (name, s) in [("h2d", h2d), ("d2h", d2h)] {
            out.push(
                BenchResult::new(name, "GB/s", &s)
                    .with("gpu", g.get())
                    .with("memory", label.as_str())
                    .with("bytes", opts.copy_bytes)
                    .with_methods(methods),
            );
        }
    }
    Ok(())
}

/// The host memory GPU `g`'s copies are measured from, by label:
/// pageable, the driver's pinned memory, the arena on the GPU's node, and
/// on a machine of several nodes the arena on each other node with memory.
fn copy_sources(rt: &Runtime, g: CudaOrdinal) -> Vec<(String, Source)> {
    let t = rt.topology();
    let gpu_node = rt.node_for_gpu(g).ok();
    let mut kinds: Vec<(String, Source)> = vec![
        ("pageable".into(), Source::Pageable),
        ("driver_pinned".into(), Source::DriverPinned),
    ];
    if let Some(n) = gpu_node {
        kinds.push(("arena_local".into(), Source::Arena(n)));
    }
    for node in &t.numa_nodes {
        if Some(node.os_index) != gpu_node && node.memory_bytes > 0 && t.numa_nodes.len() > 1 {
            kinds.push((
                format!("arena_node{}", node.os_index),
                Source::Arena(node.os_index),
            ));
        }
    }
    kinds
}

mod extra {
    //! Measurements of the loader and the staged copy.
    use super::*;
    use numapin::measure::loader::{self as lm, Direction, LoaderBench, Mode};
    use numapin::staged::{SlotWrites, StagedOptions};

    /// The staged copy's figures on each GPU, and the loader's.
    pub(super) fn run(
        rt: &Runtime,
        opts: &BenchOptions,
        ordinals: &[CudaOrdinal],
        gpu_ok: bool,
        out: &mut Sink,
    ) -> Result<()> {
        let has = |m: Measure| opts.measures.contains(&m);
        if gpu_ok && has(Measure::Staged) {
            for &g in ordinals {
                staged(rt, g, opts, out)?;
                if opts.staged_sweep {
                    staged_sweep(rt, g, opts, out)?;
                }
            }
        }
        if has(Measure::Loader) {
            let b = LoaderBench {
                reps: opts.reps.clamp(1, 5),
                ..LoaderBench::default()
            };
            if gpu_ok {
                loader_on_gpus(rt, ordinals, &b, out)?;
            } else {
                out.progress("host-mode loader");
                let hb = LoaderBench {
                    batch_bytes: 16 << 20,
                    batches: 32,
                    ..b.clone()
                };
                let f = lm::loader_gbps(rt, Mode::Host, &hb)?;
                out.push(loader_result(&f, &hb).with("gpus", 0));
            }
            producer_scaling(rt, gpu_ok, b, out)?;
        }
        Ok(())
    }

    /// GPU `g`'s staged copies both ways with the default options (and
    /// how the slots were written, to the device).
    fn staged(rt: &Runtime, g: CudaOrdinal, opts: &BenchOptions, out: &mut Sink) -> Result<()> {
        for (dir, name) in [(Direction::ToDevice, "h2d"), (Direction::FromDevice, "d2h")] {
            out.progress(&format!("GPU {g}: staged {name}"));
            let f = lm::staged_gbps(
                rt,
                g,
                opts.copy_bytes,
                opts.reps,
                dir,
                &StagedOptions::default(),
            )?;
            let mut r = BenchResult::new(name, "GB/s", &f.gbps)
                .with("gpu", g.get())
                .with("memory", "staged")
                .with("bytes", opts.copy_bytes)
                .with("verified", f.verified);
            if dir == Direction::ToDevice {
                let w = numapin::staged::slot_writes_for(
                    rt,
                    g,
                    opts.copy_bytes,
                    &StagedOptions::default(),
                )?;
                r = r.with("slot_writes", slot_writes_name(w));
            }
            out.push(r);
        }
        Ok(())
    }

    /// The loader on each GPU, beside its two stages alone, and on every
    /// GPU at once where there are several.
    fn loader_on_gpus(
        rt: &Runtime,
        ordinals: &[CudaOrdinal],
        b: &LoaderBench,
        out: &mut Sink,
    ) -> Result<()> {
        for &g in ordinals {
            out.progress(&format!("GPU {g}: loader"));
            let f = lm::loader_gbps(rt, Mode::Gpu(g), b)?;
            out.push(loader_result(&f, b).with("gpu", g.get()).with("gpus", 1));
            // The loader's two stages alone, same settings: the
            // producers filling slots (host mode: no copies) and
            // the bare copy loop (no producers).
            out.progress(&format!("GPU {g}: producers alone, copies alone"));
            let p = lm::loader_gbps(
                rt,
                Mode::Host,
                &LoaderBench {
                    sampled_check: true,
                    ..b.clone()
                },
            )?;
            out.push(
                stage_result("loader_producers_only", &p.gbps, b, p.workers)
                    .with("gpu", g.get())
                    .with("check", "sampled")
                    .with("verified", p.verified),
            );
            let c = lm::pinned_copy_gbps(rt, g, b.batch_bytes, b.reps)?;
            out.push(stage_result("loader_copy_only", &c, b, 0).with("gpu", g.get()));
        }
        if ordinals.len() > 1 {
            out.progress("loaders on all GPUs at once");
            let f = lm::loader_gbps_all(rt, ordinals, b)?;
            out.push(
                BenchResult::new("loader", "GB/s", &f.gbps)
                    .with("mode", "gpu")
                    .with("gpus", ordinals.len())
                    .with("batch_bytes", b.batch_bytes)
                    .with("verified", f.verified),
            );
        }
        Ok(())
    }

    /// Producer-bound scaling: the producers alone with 1, 2, 4, ...
    /// workers, up to the node's allowed CPUs.
    fn producer_scaling(rt: &Runtime, gpu_ok: bool, b: LoaderBench, out: &mut Sink) -> Result<()> {
        let cpus = rt
            .place(Target::HostNode(rt.calling_thread_node()))
            .map(|s| s.cpus.len())
            .unwrap_or(1)
            .max(1);
        let sb = LoaderBench {
            batch_bytes: if gpu_ok { b.batch_bytes } else { 16 << 20 },
            batches: if gpu_ok { b.batches } else { 32 },
            sampled_check: true,
            ..b
        };
        let mut n = 1;
        while n <= cpus.min(MAX_SCALING_WORKERS) {
            out.progress(&format!("producers alone, {n} worker(s)"));
            let f = lm::loader_gbps(
                rt,
                Mode::Host,
                &LoaderBench {
                    workers: n,
                    ..sb.clone()
                },
            )?;
            out.push(
                stage_result("loader_producers_scaling", &f.gbps, &sb, n)
                    .with("check", "sampled")
                    .with("verified", f.verified),
            );
            n *= 2;
        }
        Ok(())
    }

    /// The staged copy's threads and chunk sizes swept, at 256 MiB and
    /// 1 GiB, each beside the pinned rate of the same size measured here.
    fn staged_sweep(
        rt: &Runtime,
        g: CudaOrdinal,
        opts: &BenchOptions,
        out: &mut Sink,
    ) -> Result<()> {
        let node = rt.node_for_gpu(g)?;
        let cpus = rt.place(Target::HostNode(node))?.cpus.len().max(1);
        let reps = opts.reps.clamp(1, 3);
        for bytes in [256usize << 20, 1 << 30] {
            out.progress(&format!("GPU {g}: sweep, pinned {bytes} bytes"));
            let (h2d, d2h) = copy_gbps_from(rt, g, Source::Arena(node), bytes, 1, reps)?;
            for (name, s) in [("h2d", h2d), ("d2h", d2h)] {
                out.push(
                    BenchResult::new(name, "GB/s", &s)
                        .with("gpu", g.get())
                        .with("memory", "sweep_pinned")
                        .with("bytes", bytes),
                );
            }
            let mut threads: Vec<usize> = [4, 8, 12, 16]
                .into_iter()
                .map(|t: usize| t.min(cpus))
                .collect();
            threads.dedup();
            for &t in &threads {
                for chunk in [
                    256usize << 10,
                    512 << 10,
                    1 << 20,
                    2 << 20,
                    4 << 20,
                    8 << 20,
                ] {
                    // Copies from the device write the caller's memory with
                    // streaming stores whatever the slot writes are.
                    for (dir, name, writes) in [
                        (Direction::ToDevice, "h2d", SlotWrites::Streaming),
                        (Direction::ToDevice, "h2d", SlotWrites::Cached),
                        (Direction::FromDevice, "d2h", SlotWrites::Auto),
                    ] {
                        let so = StagedOptions::default()
                            .with_threads(t)
                            .with_chunk_bytes(chunk)
                            .with_slot_writes(writes);
                        let writes = slot_writes_name(writes);
                        out.progress(&format!(
                            "GPU {g}: sweep, staged {name} {bytes} bytes, {t} threads, {chunk} byte chunks, {writes} slot writes"
                        ));
                        let f = lm::staged_gbps(rt, g, bytes, reps, dir, &so)?;
                        out.push(
                            BenchResult::new(name, "GB/s", &f.gbps)
                                .with("gpu", g.get())
                                .with("memory", "sweep_staged")
                                .with("bytes", bytes)
                                .with("threads", t)
                                .with("chunk_bytes", chunk)
                                .with("slot_writes", writes)
                                .with("verified", f.verified),
                        );
                    }
                }
            }
        }
        Ok(())
    }

    fn slot_writes_name(w: SlotWrites) -> &'static str {
        match w {
            SlotWrites::Streaming => "streaming",
            SlotWrites::Cached => "cached",
            _ => "-",
        }
    }

    /// Most workers the scaling figures go to.
    const MAX_SCALING_WORKERS: usize = 16;

    fn stage_result(name: &str, s: &Stats, b: &LoaderBench, workers: usize) -> BenchResult {
        let r = BenchResult::new(name, "GB/s", s).with("batch_bytes", b.batch_bytes);
        if workers > 0 {
            r.with("workers", workers)
        } else {
            r
        }
    }

    fn loader_result(f: &lm::LoaderFigure, b: &LoaderBench) -> BenchResult {
        BenchResult::new("loader", "GB/s", &f.gbps)
            .with("mode", f.mode)
            .with("workers", f.workers)
            .with("batch_bytes", b.batch_bytes)
            .with("verified", f.verified)
    }
}

/// The ratios a person reads first, computed from the results.
pub(super) fn ratios(results: &[BenchResult]) -> Vec<(String, f64)> {
    let find = |name: &str, gpu: &Value, memory: &str| {
        results
            .iter()
            .find(|r| {
                r.name == name
                    && r.param("gpu") == Some(gpu)
                    && r.param("memory").and_then(Value::as_str) == Some(memory)
            })
            .map(|r| r.median)
    };
    let mut out = Vec::new();
    let gpus: Vec<Value> = {
        let mut g: Vec<Value> = Vec::new();
        for v in results.iter().filter_map(|r| r.param("gpu")) {
            if !g.contains(v) {
                g.push(v.clone());
            }
        }
        g
    };
    for g in &gpus {
        for dir in ["h2d", "d2h"] {
            if let (Some(a), Some(d)) = (find(dir, g, "arena_local"), find(dir, g, "driver_pinned"))
            {
                out.push((format!("GPU {g} {dir}: arena_local / driver_pinned"), a / d));
            }
            if let (Some(s), Some(p)) = (find(dir, g, "staged"), find(dir, g, "pageable")) {
                out.push((format!("GPU {g} {dir}: staged / pageable"), s / p));
            }
            for r in results
                .iter()
                .filter(|r| r.name == dir && r.param("gpu") == Some(g))
            {
                if let Some(m) = r
                    .param("memory")
                    .and_then(Value::as_str)
                    .filter(|m| m.starts_with("arena_node"))
                {
                    if let Some(l) = find(dir, g, "arena_local") {
                        out.push((format!("GPU {g} {dir}: arena_local / {m}"), l / r.median));
                    }
                }
            }
        }
    }
    // The loader against the slower of its two stages, per GPU.
    for g in &gpus {
        let of = |name: &str| {
            results
                .iter()
                .find(|r| r.name == name && r.param("gpu") == Some(g))
                .map(|r| r.median)
        };
        if let (Some(l), Some(p), Some(c)) = (
            of("loader"),
            of("loader_producers_only"),
            of("loader_copy_only"),
        ) {
            out.push((
                format!("GPU {g} loader / min(producers alone, copies alone)"),
                l / p.min(c),
            ));
        }
    }
    // Producer scaling: rate(n) / (n x rate(1)).
    let scaling: Vec<(u32, f64)> = results
        .iter()
        .filter(|r| r.name == "loader_producers_scaling")
        .filter_map(|r| Some((u32::try_from(r.param("workers")?.as_u64()?).ok()?, r.median)))
        .collect();
    if let Some(&(_, one)) = scaling.iter().find(|(n, _)| *n == 1) {
        for &(n, rate) in scaling.iter().filter(|(n, _)| *n > 1) {
            out.push((
                format!("producers alone, {n} workers / ({n} x 1 worker)"),
                rate / (f64::from(n) * one),
            ));
        }
    }
    let med = |name: &str| results.iter().find(|r| r.name == name).map(|r| r.median);
    if let (Some(a), Some(b)) = (med("cuMemAllocHost_per_gib"), med("region_create_per_gib")) {
        out.push(("cuMemAllocHost / arena region, per GiB".into(), a / b));
    }
    if let (Some(a), Some(b)) = (med("mmap_mlock_per_gib"), med("region_create_per_gib")) {
        out.push(("mmap+mlock / arena region, per GiB".into(), a / b));
    }
    out
}
