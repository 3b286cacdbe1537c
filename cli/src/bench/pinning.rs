//! `numapin bench --only pinning`: what pinning costs, step by step and by
//! region backend, with the driver's own `cuMemAllocHost` as the same-run
//! baseline, and the copy rates from each backend's memory.

use super::report::{BenchOptions, BenchReport, BenchResult};
use crate::error::Result;
use numapin::measure::arena::Stats;
use numapin::measure::copy::{copy_gbps_from, host_alloc_ms_per_gib, Source};
use numapin::measure::pinning as pm;
use numapin::runtime::{Backend, Runtime};
use numapin::CudaOrdinal;

/// Concurrent registrations of a region's parts measured against one call.
const REGISTER_PARTS: [usize; 4] = [1, 2, 4, 8];

/// Part sizes of registration while populating, against one registration
/// after populating (0).
const PART_BYTES: [usize; 4] = [0, 32 << 20, 64 << 20, 128 << 20];

pub(super) fn run(
    rt: &Runtime,
    opts: &BenchOptions,
    ordinals: &[CudaOrdinal],
    gpu_ok: bool,
    report: &mut BenchReport,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let node = rt.calling_thread_node();
    let budget = rt.arena(node)?.config().budget;
    let reps = opts.reps.clamp(1, 5);
    let backends: Vec<Backend> = if gpu_ok {
        Backend::ALL.to_vec()
    } else {
        vec![Backend::Mapped]
    };
    for &bytes in &opts.region_sizes {
        if bytes as u64 > budget {
            report.notes.push(format!(
                "pinning: {} regions skipped: over node {node}'s budget of {} pinned bytes",
                numapin::text::fmt_bytes(bytes as u64),
                numapin::text::fmt_bytes(budget)
            ));
            continue;
        }
        for &b in &backends {
            progress(&format!(
                "pinning: {} regions, {} backend",
                numapin::text::fmt_bytes(bytes as u64),
                b.as_str()
            ));
            let f = match pm::region_create(rt, node, bytes, b, reps) {
                Ok(f) => f,
                Err(e) if b != Backend::Mapped => {
                    report
                        .notes
                        .push(format!("pinning: the {} backend failed: {e}", b.as_str()));
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let base = |name: &str, s: &Stats| {
                BenchResult::new(name, "ms", s)
                    .with("node", node)
                    .with("backend", b.as_str())
                    .with("region_bytes", f.bytes)
            };
            report.results.push(
                base("pin_create_per_gib", &f.create)
                    .with("pages", f.pages.0)
                    .with("pages_on_node", f.pages.1)
                    .with_methods(Some(f.methods)),
            );
            for (step, s) in &f.steps {
                report
                    .results
                    .push(base("pin_step_per_gib", s).with("step", *step));
            }
            report.results.push(base("pin_release_per_gib", &f.release));
        }
        if gpu_ok {
            progress(&format!(
                "pinning: {} regions, registered in parts while populating",
                numapin::text::fmt_bytes(bytes as u64)
            ));
            progress(&format!(
                "pinning: {} regions, placement check on 1, 2 and 4 threads",
                numapin::text::fmt_bytes(bytes as u64)
            ));
            for (threads, create, verify) in
                pm::region_create_verify_threads(rt, node, bytes, &[1, 2, 4], reps)?
            {
                for (name, s) in [
                    ("pin_verify_threads_create_per_gib", create),
                    ("pin_verify_threads_verify_per_gib", verify),
                ] {
                    report.results.push(
                        BenchResult::new(name, "ms", &s)
                            .with("node", node)
                            .with("threads", threads)
                            .with("region_bytes", bytes),
                    );
                }
            }
            for (part, s) in pm::region_create_parts(rt, node, bytes, &PART_BYTES, reps)? {
                report.results.push(
                    BenchResult::new("pin_parts_per_gib", "ms", &s)
                        .with("node", node)
                        .with("part_bytes", part)
                        .with("region_bytes", bytes),
                );
            }
            progress(&format!(
                "pinning: {} regions, cuMemAllocHost",
                numapin::text::fmt_bytes(bytes as u64)
            ));
            let s = host_alloc_ms_per_gib(bytes, reps)?;
            report.results.push(
                BenchResult::new("pin_create_per_gib", "ms", &s)
                    .with("backend", "cuMemAllocHost")
                    .with("region_bytes", bytes),
            );
        }
    }

    // The placement checks and registration, on the smallest size.
    let Some(&bytes) = opts
        .region_sizes
        .iter()
        .filter(|&&b| b as u64 <= budget)
        .min()
    else {
        return Ok(());
    };
    progress("pinning: placement checks");
    let v = pm::verify_costs(rt, node, bytes, reps)?;
    let mut checks = vec![("numa_maps", 1, v.numa_maps)];
    match v.move_pages {
        Some(by_threads) => {
            for (n, s) in by_threads {
                checks.push(("move_pages", n, s));
            }
        }
        None => report
            .notes
            .push("pinning: move_pages is refused here, not measured".into()),
    }
    for (method, threads, s) in checks {
        report.results.push(
            BenchResult::new("pin_verify_per_gib", "ms", &s)
                .with("node", node)
                .with("method", method)
                .with("threads", threads)
                .with("region_bytes", bytes),
        );
    }
    if gpu_ok {
        for parts in REGISTER_PARTS {
            progress(&format!("pinning: registration in {parts} part(s)"));
            let s = pm::register_parts(rt, node, bytes, parts, reps)?;
            report.results.push(
                BenchResult::new("pin_register_per_gib", "ms", &s)
                    .with("node", node)
                    .with("parts", parts)
                    .with("region_bytes", bytes),
            );
        }
        // Copies from each backend's memory, on the first GPU.
        if let Some(&g) = ordinals.first() {
            let part = 64 << 20;
            if 4 * part as u64 <= budget {
                progress(&format!("pinning: GPU {g} copies across registered parts"));
                let s = pm::span_copy(rt, node, g, part, reps)?;
                let mut ranges = vec![("inside", &s.inside)];
                match &s.across {
                    Ok(f) => ranges.push(("across", f)),
                    Err(e) => report.notes.push(format!(
                        "pinning: a copy across two registered parts was refused ({e}): regions are registered in one call unless register_in_parts is on, which keeps every buffer inside one part"
                    )),
                }
                for (range, f) in ranges {
                    report.results.push(
                        BenchResult::new("h2d", "GB/s", f)
                            .with("gpu", g.get())
                            .with("memory", format!("parts_{range}"))
                            .with("bytes", s.bytes)
                            .with("verified", s.verified),
                    );
                }
            }
            for b in Backend::ALL {
                progress(&format!("pinning: GPU {g} copies, {} backend", b.as_str()));
                let cfg = rt.config().clone().with_backend(b);
                let rtb = match Runtime::new(rt.topology().clone(), cfg) {
                    Ok(r) => r,
                    Err(e) => {
                        report
                            .notes
                            .push(format!("pinning: {} runtime: {e}", b.as_str()));
                        continue;
                    }
                };
                let (h2d, d2h) = match copy_gbps_from(
                    &rtb,
                    g,
                    Source::Arena(node),
                    opts.copy_bytes,
                    opts.warmup,
                    opts.reps,
                ) {
                    Ok(v) => v,
                    Err(e) if b != Backend::Mapped => {
                        report.notes.push(format!(
                            "pinning: copies from the {} backend failed: {e}",
                            b.as_str()
                        ));
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                };
                for (name, s) in [("h2d", h2d), ("d2h", d2h)] {
                    report.results.push(
                        BenchResult::new(name, "GB/s", &s)
                            .with("gpu", g.get())
                            .with("memory", format!("backend_{}", b.as_str()))
                            .with("bytes", opts.copy_bytes),
                    );
                }
            }
        }
    }
    Ok(())
}
