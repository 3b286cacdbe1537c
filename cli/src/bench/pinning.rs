//! `numapin bench --only pinning`: what pinning costs, step by step and by
//! region backend, with the driver's own `cuMemAllocHost` as the same-run
//! baseline, and the copy rates from each backend's memory.

use super::report::{BenchOptions, BenchResult, Sink};
use crate::error::Result;
use numapin::measure::arena::Stats;
use numapin::measure::cold_pin as cold;
use numapin::measure::copy::{copy_gbps_from, host_alloc_ms_per_gib, Source};
use numapin::measure::pinning as pm;
use numapin::runtime::{Backend, Runtime};
use numapin::text::fmt_bytes;
use numapin::CudaOrdinal;

/// Concurrent registrations of a region's parts measured against one call.
const REGISTER_PARTS: [usize; 4] = [1, 2, 4, 8];

/// Part sizes of registration while populating, against one registration
/// after populating (0).
const PART_BYTES: [usize; 4] = [0, 32 << 20, 64 << 20, 128 << 20];

/// Bytes of each registered part in the copies across parts.
const SPAN_PART_BYTES: usize = 64 << 20;

/// Where the pinning figures are measured: the calling thread's node, with
/// the repetitions of a region-sized measurement.
struct Pin<'a> {
    rt: &'a Runtime,
    node: u32,
    reps: usize,
}

impl<'a> Pin<'a> {
    /// The calling thread's node with the repetitions of `opts` (at most
    /// 5), and the node's pinned-byte budget.
    fn here(rt: &'a Runtime, opts: &BenchOptions) -> Result<(Pin<'a>, u64)> {
        let node = rt.calling_thread_node();
        let budget = rt
            .stats()
            .iter()
            .find(|s| s.node == node)
            .map_or(0, |s| s.budget);
        let reps = opts.reps.clamp(1, 5);
        Ok((Pin { rt, node, reps }, budget))
    }

    /// Figure `name` (ms) of regions of `bytes` on the node.
    fn figure(&self, name: &str, s: &Stats, bytes: usize) -> BenchResult {
        BenchResult::new(name, "ms", s)
            .with("node", self.node)
            .with("region_bytes", bytes)
    }
}

/// The pinning figures at each of `opts.region_sizes` within the node's
/// budget (a note for each size over it), then the placement checks,
/// registration and copies on the smallest.
pub(super) fn run(
    rt: &Runtime,
    opts: &BenchOptions,
    ordinals: &[CudaOrdinal],
    gpu_ok: bool,
    out: &mut Sink,
) -> Result<()> {
    let (pin, budget) = Pin::here(rt, opts)?;
    let node = pin.node;
    let backends: Vec<Backend> = if gpu_ok {
        Backend::ALL.to_vec()
    } else {
        vec![Backend::Mapped]
    };
    for &bytes in &opts.region_sizes {
        if bytes as u64 > budget {
            out.note(format!(
                "pinning: {} regions skipped: over node {node}'s budget of {} pinned bytes",
                fmt_bytes(bytes as u64),
                fmt_bytes(budget)
            ));
            continue;
        }
        for &b in &backends {
            creation_by_backend(&pin, bytes, b, out)?;
        }
        if gpu_ok {
            creation_with_the_driver(&pin, bytes, out)?;
        }
    }

    if gpu_ok {
        cold_pinning(&pin, opts, budget, out)?;
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
    placement_checks(&pin, bytes, out)?;
    if gpu_ok {
        registration(&pin, bytes, out)?;
        // Copies from each backend's memory, on the first GPU.
        if let Some(&g) = ordinals.first() {
            if 4 * SPAN_PART_BYTES as u64 <= budget {
                copies_across_parts(&pin, g, out)?;
            }
            for b in Backend::ALL {
                copies_from_backend(&pin, opts, g, b, out)?;
            }
        }
    }
    Ok(())
}

/// Creating and releasing a region of `bytes` with backend `b`, in total
/// and by step. A backend other than the mapped one may fail (a note).
fn creation_by_backend(pin: &Pin, bytes: usize, b: Backend, out: &mut Sink) -> Result<()> {
    let node = pin.node;
    out.progress(&format!(
        "pinning: {} regions, {} backend",
        fmt_bytes(bytes as u64),
        b.as_str()
    ));
    let f = match pm::region_create(pin.rt, node, bytes, b, pin.reps) {
        Ok(f) => f,
        Err(e) if b != Backend::Mapped => {
            out.note(format!("pinning: the {} backend failed: {e}", b.as_str()));
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let base = |name: &str, s: &Stats| {
        BenchResult::new(name, "ms", s)
            .with("node", node)
            .with("backend", b.as_str())
            .with("region_bytes", f.bytes)
    };
    out.push(
        base("pin_create_per_gib", &f.create)
            .with("pages", f.pages.0)
            .with("pages_on_node", f.pages.1)
            .with_methods(Some(f.methods)),
    );
    for (step, s) in &f.steps {
        out.push(base("pin_step_per_gib", s).with("step", *step));
    }
    out.push(base("pin_release_per_gib", &f.release));
    Ok(())
}

/// With a driver: regions of `bytes` checked on 1, 2 and 4 threads,
/// registered in parts while populating, and `cuMemAllocHost` of the same
/// size as the baseline.
fn creation_with_the_driver(pin: &Pin, bytes: usize, out: &mut Sink) -> Result<()> {
    let (rt, node, reps) = (pin.rt, pin.node, pin.reps);
    out.progress(&format!(
        "pinning: {} regions, registered in parts while populating",
        fmt_bytes(bytes as u64)
    ));
    out.progress(&format!(
        "pinning: {} regions, placement check on 1, 2 and 4 threads",
        fmt_bytes(bytes as u64)
    ));
    for (threads, create, verify) in
        pm::region_create_verify_threads(rt, node, bytes, &[1, 2, 4], reps)?
    {
        for (name, s) in [
            ("pin_verify_threads_create_per_gib", create),
            ("pin_verify_threads_verify_per_gib", verify),
        ] {
            out.push(
                BenchResult::new(name, "ms", &s)
                    .with("node", node)
                    .with("threads", threads)
                    .with("region_bytes", bytes),
            );
        }
    }
    for (part, s) in pm::region_create_parts(rt, node, bytes, &PART_BYTES, reps)? {
        out.push(
            BenchResult::new("pin_parts_per_gib", "ms", &s)
                .with("node", node)
                .with("part_bytes", part)
                .with("region_bytes", bytes),
        );
    }
    out.progress(&format!(
        "pinning: {} regions, cuMemAllocHost",
        fmt_bytes(bytes as u64)
    ));
    let s = host_alloc_ms_per_gib(bytes, reps)?;
    out.push(
        BenchResult::new("pin_create_per_gib", "ms", &s)
            .with("backend", "cuMemAllocHost")
            .with("region_bytes", bytes),
    );
    Ok(())
}

/// The placement check of a region of `bytes` through numa_maps and
/// through move_pages on 1, 2, 4 threads (a note where it is refused).
fn placement_checks(pin: &Pin, bytes: usize, out: &mut Sink) -> Result<()> {
    out.progress("pinning: placement checks");
    let v = pm::verify_costs(pin.rt, pin.node, bytes, pin.reps)?;
    let mut checks = vec![("numa_maps", 1, v.numa_maps)];
    match v.move_pages {
        Some(by_threads) => {
            for (n, s) in by_threads {
                checks.push(("move_pages", n, s));
            }
        }
        None => out.note("pinning: move_pages is refused here, not measured".into()),
    }
    for (method, threads, s) in checks {
        out.push(
            BenchResult::new("pin_verify_per_gib", "ms", &s)
                .with("node", pin.node)
                .with("method", method)
                .with("threads", threads)
                .with("region_bytes", bytes),
        );
    }
    Ok(())
}

/// Registering a region of `bytes` with the driver in 1, 2, 4 and 8
/// concurrent parts.
fn registration(pin: &Pin, bytes: usize, out: &mut Sink) -> Result<()> {
    for parts in REGISTER_PARTS {
        out.progress(&format!("pinning: registration in {parts} part(s)"));
        let s = pm::register_parts(pin.rt, pin.node, bytes, parts, pin.reps)?;
        out.push(
            pin.figure("pin_register_per_gib", &s, bytes)
                .with("parts", parts),
        );
    }
    Ok(())
}

/// GPU `g`'s copies inside one registered part and across two (a note
/// where the driver refuses the latter).
fn copies_across_parts(pin: &Pin, g: CudaOrdinal, out: &mut Sink) -> Result<()> {
    out.progress(&format!("pinning: GPU {g} copies across registered parts"));
    let s = pm::span_copy(pin.rt, pin.node, g, SPAN_PART_BYTES, pin.reps)?;
    let mut ranges = vec![("inside", &s.inside)];
    match &s.across {
        Ok(f) => ranges.push(("across", f)),
        Err(e) => out.note(format!(
            "pinning: a copy across two registered parts was refused ({e}): regions are registered in one call unless register_in_parts is on, which keeps every buffer inside one part"
        )),
    }
    for (range, f) in ranges {
        out.push(
            BenchResult::new("h2d", "GB/s", f)
                .with("gpu", g.get())
                .with("memory", format!("parts_{range}"))
                .with("bytes", s.bytes)
                .with("verified", s.verified),
        );
    }
    Ok(())
}

/// GPU `g`'s copies both ways from arena memory of backend `b`. A backend
/// other than the mapped one may fail (a note).
fn copies_from_backend(
    pin: &Pin,
    opts: &BenchOptions,
    g: CudaOrdinal,
    b: Backend,
    out: &mut Sink,
) -> Result<()> {
    let rt = pin.rt;
    out.progress(&format!("pinning: GPU {g} copies, {} backend", b.as_str()));
    let cfg = rt.config().clone().with_backend(b);
    let rtb = match Runtime::new(rt.topology().clone(), cfg) {
        Ok(r) => r,
        Err(e) => {
            out.note(format!("pinning: {} runtime: {e}", b.as_str()));
            return Ok(());
        }
    };
    let (h2d, d2h) = match copy_gbps_from(
        &rtb,
        g,
        Source::Arena(pin.node),
        opts.copy_bytes,
        opts.warmup,
        opts.reps,
    ) {
        Ok(v) => v,
        Err(e) if b != Backend::Mapped => {
            out.note(format!(
                "pinning: copies from the {} backend failed: {e}",
                b.as_str()
            ));
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    for (name, s) in [("h2d", h2d), ("d2h", d2h)] {
        out.push(
            BenchResult::new(name, "GB/s", &s)
                .with("gpu", g.get())
                .with("memory", format!("backend_{}", b.as_str()))
                .with("bytes", opts.copy_bytes),
        );
    }
    Ok(())
}

/// `numapin bench --only cold-pinning`: the cold-pinning figures alone, on
/// the calling thread's node.
pub(super) fn run_cold(rt: &Runtime, opts: &BenchOptions, out: &mut Sink) -> Result<()> {
    let (pin, budget) = Pin::here(rt, opts)?;
    cold_pinning(&pin, opts, budget, out)
}

/// Regions of 1 GiB and more made from nothing by each way of making them
/// (every setting at the smallest such size, one piece against the
/// default parts at the others), then, at that smallest size, faulting in
/// alone by each method and registration with each flag set.
fn cold_pinning(pin: &Pin, opts: &BenchOptions, budget: u64, out: &mut Sink) -> Result<()> {
    let mut sizes: Vec<usize> = opts
        .region_sizes
        .iter()
        .copied()
        .filter(|&b| b >= 1 << 30 && b as u64 <= budget)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let Some(&first) = sizes.first() else {
        return Ok(());
    };
    let threads = numapin::measure::pinning::populate_threads(pin.rt, pin.node)?;
    let all = cold::cold_settings(threads, true, true);
    for &bytes in &sizes {
        out.progress(&format!(
            "pinning: cold {} regions, each way of making them",
            fmt_bytes(bytes as u64)
        ));
        let settings: Vec<cold::ColdSetting> = if bytes == first {
            all.clone()
        } else {
            all.iter()
                .filter(|s| {
                    s.pages == numapin::runtime::HugePages::Transparent
                        && s.verify_threads == 0
                        && !s.populate_write
                        && (s.part_bytes == 0
                            || (s.part_bytes == 256 << 20
                                && s.populate_threads == threads.saturating_sub(2).max(1)))
                })
                .cloned()
                .collect()
        };
        for f in cold::region_create_cold(pin.rt, pin.node, bytes, &settings, pin.reps)? {
            let label = f.setting.label();
            if let Some(e) = &f.failed {
                out.note(format!(
                    "pinning: cold {label} at {}: {e}",
                    fmt_bytes(bytes as u64)
                ));
                continue;
            }
            let base = |name: &str, s: &Stats| {
                BenchResult::new(name, "ms", s)
                    .with("node", pin.node)
                    .with("setting", label.clone())
                    .with("part_bytes", f.setting.part_bytes)
                    .with("populate_threads", f.setting.populate_threads)
                    .with("verify_threads", f.setting.verify_threads)
                    .with("region_bytes", f.bytes)
            };
            out.push(
                base("pin_cold_create_per_gib", &f.create)
                    .with("pages", f.pages.0)
                    .with("pages_on_node", f.pages.1),
            );
            for (step, s) in &f.steps {
                out.push(base("pin_cold_step_per_gib", s).with("step", *step));
            }
        }
    }
    out.progress("pinning: faulting in by each method");
    for (how, s) in cold::populate_methods(pin.rt, pin.node, first, pin.reps)? {
        out.push(
            pin.figure("pin_populate_per_gib", &s, first)
                .with("method", how),
        );
    }
    out.progress("pinning: registration flags");
    for (flags, s) in cold::register_flags(pin.rt, pin.node, first, pin.reps)? {
        out.push(
            pin.figure("pin_register_flags_per_gib", &s, first)
                .with("flags", flags),
        );
    }
    Ok(())
}
