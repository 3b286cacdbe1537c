//! The loader and staged-copy figures of docs/BENCHMARKS.md, all in one
//! run, with their baselines and ratios:
//!
//! ```text
//! cargo run --release --example loader_gpu -- [--batch-mib 64] [--batches 64]
//!     [--reps 3] [--staged-mib 1024] [--gpus 0,1,2,3] [--json]
//!     [--workers N] [--depth N] [--fill streaming|cached] [--empty-producer]
//!     [--stages-only] [--interference]
//! ```
//!
//! `--stages-only` measures the loader beside its two stages alone (the
//! producers filling slots without copies, and the bare copy loop) and
//! nothing else; `--fill cached` has the producers write with ordinary
//! stores instead of streaming ones. `--interference` measures only the
//! bare copy loop while 16 threads write other memory at several paces (how
//! much a producer's writes slow the DMA engine's reads).
//!
//! Prints one table (and with `--json` one JSON object per line after it).
//! Without a GPU it measures host mode only and says so.
// Sizes and counts from the command line, far inside every type's range.
#![allow(clippy::cast_possible_truncation)]
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

use std::process::ExitCode;

use numapin::measure::loader::{self as measure, Cost, Direction, LoaderBench, Mode, Stats};
use numapin::runtime::{Runtime, RuntimeConfig};
use numapin::staged::StagedOptions;
use numapin::topology::{ProbeOptions, Topology};
use numapin::CudaOrdinal;

/// Bytes in a MiB (the unit of the size arguments).
const MIB: usize = 1 << 20;

struct Args {
    batch_mib: usize,
    batches: u64,
    reps: usize,
    staged_mib: usize,
    gpus: Option<Vec<CudaOrdinal>>,
    json: bool,
    workers: usize,
    depth: usize,
    empty: bool,
    cached: bool,
    stages_only: bool,
    interference: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        batch_mib: 64,
        batches: 64,
        reps: 3,
        staged_mib: 1024,
        gpus: None,
        json: false,
        workers: 0,
        depth: 0,
        empty: false,
        cached: false,
        stages_only: false,
        interference: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().ok_or(format!("{k} needs a value"));
        let num = |v: String| v.parse::<u64>().map_err(|e| format!("{k} {v}: {e}"));
        match k.as_str() {
            "--batch-mib" => a.batch_mib = num(val()?)? as usize,
            "--batches" => a.batches = num(val()?)?,
            "--reps" => a.reps = num(val()?)? as usize,
            "--staged-mib" => a.staged_mib = num(val()?)? as usize,
            "--gpus" => {
                a.gpus = Some(
                    val()?
                        .split(',')
                        .map(|g| {
                            g.trim()
                                .parse()
                                .map(CudaOrdinal)
                                .map_err(|e| format!("--gpus {g}: {e}"))
                        })
                        .collect::<Result<_, _>>()?,
                )
            }
            "--json" => a.json = true,
            "--workers" => a.workers = num(val()?)? as usize,
            "--empty-producer" => a.empty = true,
            "--depth" => a.depth = num(val()?)? as usize,
            "--stages-only" => a.stages_only = true,
            "--interference" => a.interference = true,
            "--fill" => match val()?.as_str() {
                "streaming" => a.cached = false,
                "cached" => a.cached = true,
                v => return Err(format!("--fill {v}: expected streaming or cached")),
            },
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    if a.batch_mib == 0 || a.batches == 0 || a.reps == 0 || a.staged_mib == 0 {
        return Err("sizes, batches and reps must be at least 1".into());
    }
    Ok(a)
}

/// Rows of cells, printed with each column padded to its widest cell.
struct Table(Vec<Vec<String>>);

impl Table {
    fn new<const N: usize>(header: [&str; N]) -> Self {
        Table(vec![header.iter().map(|s| s.to_string()).collect()])
    }
    fn row<const N: usize>(&mut self, cells: [String; N]) {
        self.0.push(cells.to_vec());
    }
    fn render(&self) -> String {
        let n = self.0.iter().map(Vec::len).max().unwrap_or(0);
        let w: Vec<usize> = (0..n)
            .map(|i| {
                self.0
                    .iter()
                    .filter_map(|r| r.get(i))
                    .map(|c| c.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        self.0
            .iter()
            .map(|r| {
                let line: Vec<String> = r
                    .iter()
                    .enumerate()
                    .map(|(i, c)| format!("{c:<0$}", w[i]))
                    .collect();
                line.join("  ").trim_end().to_string()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn f(x: f64) -> String {
    format!("{x:.1}")
}

struct Report {
    table: Table,
    json: Vec<serde_json::Value>,
}

impl Report {
    fn new() -> Self {
        Report {
            table: Table::new([
                "measurement",
                "unit",
                "median",
                "min",
                "max",
                "ratio",
                "note",
            ]),
            json: Vec::new(),
        }
    }

    fn row(&mut self, what: &str, unit: &str, s: &Stats, ratio: Option<(f64, &str)>, note: &str) {
        let r = ratio
            .map(|(r, of)| format!("{r:.2}x {of}"))
            .unwrap_or_default();
        self.table.row([
            what.to_string(),
            unit.to_string(),
            f(s.median),
            f(s.min),
            f(s.max),
            r.clone(),
            note.to_string(),
        ]);
        self.json.push(serde_json::json!({
            "name": what, "unit": unit, "median": s.median, "min": s.min, "max": s.max,
            "ratio": ratio.map(|(r, _)| r), "ratio_of": ratio.map(|(_, o)| o), "note": note,
        }));
    }

    /// Prints the table, then with `json` each row as a JSON object.
    fn print(&self, json: bool) {
        println!("{}", self.table.render());
        if json {
            for j in &self.json {
                println!("{j}");
            }
        }
    }
}

fn verified(v: bool) -> &'static str {
    if v {
        "verified"
    } else {
        "NOT VERIFIED"
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loader_gpu: {e}");
            ExitCode::from(if e.kind() == numapin::ErrorKind::Input {
                2
            } else {
                1
            })
        }
    }
}

fn run() -> numapin::Result<()> {
    let args = match parse() {
        Ok(a) => a,
        Err(problem) => {
            eprintln!(
                "loader_gpu: {problem}\n  fix: see the usage at the top of examples/loader_gpu.rs"
            );
            std::process::exit(2);
        }
    };
    let topo = Topology::probe(&ProbeOptions::from_process())?;
    let all: Vec<CudaOrdinal> = topo.gpus.iter().filter_map(|g| g.cuda_ordinal).collect();
    let rt = Runtime::new(topo, RuntimeConfig::default())?;
    let bench = loader_bench(&args);
    let mut rep = Report::new();
    if !numapin::gpu::available() || all.is_empty() {
        println!("no CUDA GPU here: host mode only");
        let host = measure::loader_gbps(&rt, Mode::Host, &bench)?;
        rep.row(
            "loader, host mode",
            "GB/s",
            &host.gbps,
            None,
            verified(host.verified),
        );
        println!("{}", rep.table.render());
        return Ok(());
    }
    let gpus = args.gpus.clone().unwrap_or(all);
    let g = gpus[0];
    bind_near(&rt, g)?;
    if args.interference {
        interference(&rt, g, &args, &mut rep)?;
        println!("{}", rep.table.render());
        return Ok(());
    }
    let bare = measure::pinned_copy_gbps(&rt, g, bench.batch_bytes, args.reps.max(5))?;
    rep.row(
        &format!("bare cuMemcpyHtoDAsync loop, GPU {g}"),
        "GB/s",
        &bare,
        None,
        &format!("{} MiB copies from an arena buffer", args.batch_mib),
    );
    let plain = measure::loader_gbps(&rt, Mode::Gpu(g), &bench)?;
    rep.row(
        &format!("loader, GPU {g}, {} producer", producer_name(&args)),
        "GB/s",
        &plain.gbps,
        Some((plain.gbps.median / bare.median, "bare")),
        &format!("{} workers, {}", plain.workers, verified(plain.verified)),
    );
    if args.stages_only {
        producers_alone(&rt, &bench, plain.gbps.median, bare.median, &mut rep)?;
        rep.print(args.json);
        return Ok(());
    }
    busy_kernel(&rt, g, &bench, &bare, &mut rep)?;
    aggregate(&rt, &gpus, &bench, &mut rep)?;
    producer_bound(&rt, g, &args, &bench, &mut rep)?;
    staged_copies(&rt, g, &args, &mut rep)?;
    rep.print(args.json);
    Ok(())
}

/// The loader measurement the arguments ask for.
fn loader_bench(args: &Args) -> LoaderBench {
    LoaderBench {
        batch_bytes: args.batch_mib * MIB,
        batches: args.batches,
        reps: args.reps,
        workers: args.workers,
        depth: args.depth,
        cost: if args.empty {
            Cost::Nothing
        } else if args.cached {
            Cost::FillCached
        } else {
            Cost::Fill
        },
        ..LoaderBench::default()
    }
}

/// What the producers do, as the loader's row names it.
fn producer_name(args: &Args) -> &'static str {
    if args.empty {
        "empty"
    } else if args.cached {
        "cached-fill"
    } else {
        "fill"
    }
}

/// Binds this thread to GPU `g`'s CPUs (those this process may use): the
/// pageable buffers of the copy baselines are made by this thread, and so
/// are local, as the staged copy's slots are.
fn bind_near(rt: &Runtime, g: CudaOrdinal) -> numapin::Result<()> {
    if let Some(gpu) = rt.topology().gpu_by_ordinal(g) {
        let cpus = gpu.local_cpus.intersection(&rt.topology().allowed.cpus);
        if !cpus.is_empty() {
            numapin::affinity::bind_current_thread(&cpus)?;
        }
    }
    Ok(())
}

/// `--interference`: the bare copy loop alone, then while 16 threads write
/// other memory at several paces.
fn interference(
    rt: &Runtime,
    g: CudaOrdinal,
    args: &Args,
    rep: &mut Report,
) -> numapin::Result<()> {
    // (writers, pace in GB/s; 0: unpaced)
    let mut alone = None;
    for (writers, pace) in [
        (0, 0.0),
        (16, 20.0),
        (16, 40.0),
        (16, 60.0),
        (16, 80.0),
        (16, 0.0),
    ] {
        let (copy, writes) = measure::pinned_copy_under_writes(
            rt,
            g,
            args.batch_mib * MIB,
            args.reps.max(5),
            writers,
            pace,
        )?;
        let base = *alone.get_or_insert(copy.median);
        let what = match (writers, pace) {
            (0, _) => "no writers".to_string(),
            (w, 0.0) => format!("{w} writers, unpaced"),
            (w, p) => format!("{w} writers paced to {p} GB/s"),
        };
        rep.row(
            &format!("bare copy loop, {what}"),
            "GB/s",
            &copy,
            Some((copy.median / base, "no writers")),
            &format!("writers wrote {writes:.1} GB/s (streaming stores)"),
        );
    }
    Ok(())
}

/// `--stages-only`: the producers alone (host mode), against the loader
/// (`loader` GB/s) over the slower of its two stages (`bare` the copies').
fn producers_alone(
    rt: &Runtime,
    bench: &LoaderBench,
    loader: f64,
    bare: f64,
    rep: &mut Report,
) -> numapin::Result<()> {
    let alone = measure::loader_gbps(
        rt,
        Mode::Host,
        &LoaderBench {
            sampled_check: true,
            ..bench.clone()
        },
    )?;
    let min = alone.gbps.median.min(bare);
    rep.row(
        "producers alone (host mode, sampled check)",
        "GB/s",
        &alone.gbps,
        Some((loader / min, "loader / slower stage")),
        verified(alone.verified),
    );
    Ok(())
}

/// The loader while a kernel runs on another stream, and how much the
/// loader slows that kernel.
fn busy_kernel(
    rt: &Runtime,
    g: CudaOrdinal,
    bench: &LoaderBench,
    bare: &Stats,
    rep: &mut Report,
) -> numapin::Result<()> {
    let busy = measure::loader_gbps(
        rt,
        Mode::Gpu(g),
        &LoaderBench {
            spin_kernel: true,
            ..bench.clone()
        },
    )?;
    rep.row(
        &format!("loader, GPU {g}, kernel on another stream"),
        "GB/s",
        &busy.gbps,
        Some((busy.gbps.median / bare.median, "bare")),
        verified(busy.verified),
    );
    let alone = measure::spin_kernel_ms(g, 20)?;
    rep.row("busy kernel alone", "ms", &alone, None, "");
    if let Some(with) = &busy.kernel_ms {
        rep.row(
            "busy kernel with the loader running",
            "ms",
            with,
            Some((with.median / alone.median, "alone")),
            "1.00x = copies fully hidden",
        );
    }
    Ok(())
}

/// Loaders on every GPU at once, against torch's figure from the issue.
fn aggregate(
    rt: &Runtime,
    gpus: &[CudaOrdinal],
    bench: &LoaderBench,
    rep: &mut Report,
) -> numapin::Result<()> {
    let agg = measure::loader_gbps_all(rt, gpus, bench)?;
    rep.row(
        &format!("loaders on {} GPU(s) at once, aggregate", gpus.len()),
        "GB/s",
        &agg.gbps,
        Some((agg.gbps.median / 151.0, "torch 151 GB/s (issue)")),
        &format!(
            "{}; run benches/baselines/torch_pinned_copy.py for the same-run baseline",
            verified(agg.verified)
        ),
    );
    Ok(())
}

/// Producer-bound scaling (100 us of work per MiB) with 1, 2, 4 and 8
/// workers.
fn producer_bound(
    rt: &Runtime,
    g: CudaOrdinal,
    args: &Args,
    bench: &LoaderBench,
    rep: &mut Report,
) -> numapin::Result<()> {
    let scaling = LoaderBench {
        batches: args.batches.min(32),
        cost: Cost::Busy {
            ns_per_mib: 100_000,
        },
        ..bench.clone()
    };
    let mut one = None;
    for w in [1usize, 2, 4, 8] {
        let s = measure::loader_gbps(
            rt,
            Mode::Gpu(g),
            &LoaderBench {
                workers: w,
                ..scaling.clone()
            },
        )?;
        let base = *one.get_or_insert(s.gbps.median);
        rep.row(
            &format!("producer-bound (100 us/MiB), {w} worker(s)"),
            "GB/s",
            &s.gbps,
            Some((s.gbps.median / base, "1 worker")),
            verified(s.verified),
        );
    }
    Ok(())
}

/// The staged copy both ways against the driver's pageable copy.
fn staged_copies(
    rt: &Runtime,
    g: CudaOrdinal,
    args: &Args,
    rep: &mut Report,
) -> numapin::Result<()> {
    let bytes = args.staged_mib * MIB;
    for (dir, name) in [(Direction::ToDevice, "H2D"), (Direction::FromDevice, "D2H")] {
        let page = measure::pageable_gbps(g, bytes, args.reps, dir)?;
        let staged = measure::staged_gbps(rt, g, bytes, args.reps, dir, &StagedOptions::default())?;
        rep.row(
            &format!("driver pageable copy {name}, {} MiB Vec", args.staged_mib),
            "GB/s",
            &page.gbps,
            None,
            verified(page.verified),
        );
        rep.row(
            &format!("staged copy {name}"),
            "GB/s",
            &staged.gbps,
            Some((staged.gbps.median / page.gbps.median, "pageable")),
            verified(staged.verified),
        );
    }
    Ok(())
}
