//! `numapin ps`: each process that uses a GPU, and whether it sits near it.
//!
//! The reading and the verdicts are the library's ([`numapin::procs`]);
//! this module chooses the processes, repeats the pass for `--watch`,
//! prints the report and decides the exit code: 1 when a verdict fails, 2
//! for a `--pid` that does not exist or bad flags.

mod render;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use numapin::doctor::{Check, Verdict};
use numapin::procs::{
    judge, node_use, DriverQuery, DriverReport, NodeUse, ProcReader, ProcessError, ProcessReport,
    Scan, Unlisted,
};
use numapin::runtime::{machine_budget_usage, MachineUsage};
use numapin::topology::{ProbeEnv, Topology};

use crate::error::{CliError, Result};
use crate::source::TopoSource;

/// Arguments of `numapin ps`.
#[derive(Debug, clap::Args)]
pub(crate) struct PsArgs {
    /// The machine the processes are judged against. Other processes'
    /// CUDA_VISIBLE_DEVICES are theirs: numapin's own is ignored here.
    #[command(flatten)]
    pub(crate) source: TopoSource,
    /// Check these processes (repeatable, or comma-separated) instead of
    /// every process that has a GPU open.
    #[arg(long, value_name = "PID", value_delimiter = ',',
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) pid: Vec<u32>,
    /// Print the report as JSON (with --watch, one line per pass).
    #[arg(long)]
    pub(crate) json: bool,
    /// Check again every SECONDS (0.1 to 86400) until interrupted.
    #[arg(long, value_name = "SECONDS", value_parser = parse_interval)]
    pub(crate) watch: Option<f64>,
    /// With --watch: stop after N passes.
    #[arg(long, value_name = "N", requires = "watch",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) count: Option<u64>,
    /// Read the processes under DIR/proc instead of /proc (a container's
    /// or a saved /proc; tests use folders of fake processes).
    #[arg(long, value_name = "DIR")]
    pub(crate) root: Option<PathBuf>,
    /// Do not ask NVML which processes use which GPU: judge by device
    /// files alone (approximate, never a warning).
    #[arg(long)]
    pub(crate) no_nvml: bool,
    /// Wait at most SECONDS (0.1 to 600) for NVML's process lists in each
    /// pass; past that, device files (NVML can block while another process
    /// pins memory).
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout,
          conflicts_with = "no_nvml")]
    pub(crate) nvml_timeout: Option<f64>,
}

fn parse_timeout(s: &str) -> std::result::Result<f64, String> {
    seconds_within(s, 0.1, 600.0)
}

fn parse_interval(s: &str) -> std::result::Result<f64, String> {
    seconds_within(s, 0.1, 86_400.0)
}

/// A number of seconds from `lo` to `hi`.
fn seconds_within(s: &str, lo: f64, hi: f64) -> std::result::Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(lo..=hi).contains(&v) {
        return Err(format!("{v} s is outside {lo} to {hi}"));
    }
    Ok(v)
}

/// One pass's report.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    /// Where the topology came from (`live` or a file).
    pub(crate) source: String,
    /// The root read below (`/`).
    pub(crate) root: String,
    /// Which pass (1 without --watch).
    pub(crate) pass: u64,
    /// Seconds since the first pass began.
    pub(crate) elapsed_s: f64,
    /// Whether the processes were named with --pid.
    pub(crate) named: bool,
    /// Processes looked at.
    pub(crate) looked_at: usize,
    /// Each process and its checks.
    pub(crate) processes: Vec<ProcessReport>,
    /// Processes whose descriptors this user may not read.
    pub(crate) unreadable: Vec<Unlisted>,
    /// Processes that ended while read.
    pub(crate) exited: Vec<Unlisted>,
    /// Memory per node over the processes listed.
    pub(crate) nodes: Vec<NodeUse>,
    /// Checks of the nodes (numapin's pins against the default budget).
    pub(crate) node_checks: Vec<Check>,
    /// What the driver's per-GPU process lists (NVML) said, which gave
    /// each process's GPUs (`attribution`).
    pub(crate) nvml: DriverReport,
    /// The machine budget's state files this user may read (this
    /// machine's, not read with --root): per node, the bytes every live
    /// numapin process holds and who holds them.
    pub(crate) machine_budget: Vec<MachineUsage>,
    /// What the reader could not use (the NVIDIA driver's GPU files).
    pub(crate) notes: Vec<String>,
    /// Verdict counts and the exit code.
    pub(crate) summary: Summary,
}

/// Verdict counts.
#[derive(Debug, Serialize)]
pub(crate) struct Summary {
    pub(crate) ok: usize,
    pub(crate) warn: usize,
    pub(crate) fail: usize,
    /// Checks not judged (a GPU by device files that disagree with the rank).
    pub(crate) skip: usize,
    pub(crate) exit_code: i32,
}

pub(crate) fn run(a: &PsArgs) -> Result<i32> {
    let root = a.root.clone().unwrap_or_else(|| PathBuf::from("/"));
    if !root.join("proc").is_dir() {
        return Err(CliError::Usage {
            problem: format!(
                "--root {}: no proc folder in it",
                crate::output::escape_controls(&root.display().to_string())
            ),
            fix: "give the folder that holds proc/ (`/` for this machine)".into(),
        });
    }
    let mut o = a.source.options();
    o.env = ProbeEnv::default();
    let topo = a.source.topology_with(&o)?;
    let started = Instant::now();
    let mut pids = a.pid.clone();
    let mut gone: Vec<Unlisted> = Vec::new();
    let mut worst = 0;
    let driver = match (a.no_nvml, a.nvml_timeout) {
        (true, _) => DriverQuery::off(),
        (false, Some(t)) => DriverQuery::nvml(Duration::from_secs_f64(t)),
        (false, None) => DriverQuery::default(),
    };
    let reader = ProcReader::with_root(&topo, &root).with_driver(driver);
    for pass in 1.. {
        let r = one_pass(&topo, &reader, &mut pids, &mut gone, pass, started)?;
        worst = worst.max(r.summary.exit_code);
        render::print(&r, a.json, a.watch.is_some())?;
        match (a.watch, a.count) {
            (Some(_), Some(n)) if pass >= n => break,
            (Some(_), _) if !a.pid.is_empty() && pids.is_empty() => break,
            (Some(s), _) => std::thread::sleep(Duration::from_secs_f64(s)),
            (None, _) => break,
        }
    }
    Ok(worst)
}

/// Reads and judges once. A `--pid` that does not exist is an error on the
/// first pass; on later ones (--watch) it is listed as exited and dropped.
fn one_pass(
    topo: &Topology,
    reader: &ProcReader,
    pids: &mut Vec<u32>,
    gone: &mut Vec<Unlisted>,
    pass: u64,
    started: Instant,
) -> Result<Report> {
    let named = !pids.is_empty() || !gone.is_empty();
    let mut scan = if !named {
        reader.scan()?
    } else {
        loop {
            match reader.read_pids(pids) {
                Err(ProcessError::NoSuchProcess { pid }) if pass > 1 => {
                    pids.retain(|&p| p != pid);
                    gone.push(Unlisted {
                        pid,
                        command: None,
                        uid: None,
                        why: "exited".into(),
                    });
                }
                r => break r?,
            }
        }
    };
    scan.exited.extend(gone.iter().cloned());
    let mut r = report(
        topo,
        reader.root(),
        scan,
        named,
        pass,
        started,
        reader.notes(),
    );
    // The state files are this machine's: not beside another /proc.
    if reader.root() == std::path::Path::new("/") {
        let (found, refused) = machine_budget_usage(None);
        r.machine_budget = found;
        r.notes.extend(refused.iter().map(|e| {
            let fix = e.fix().map_or(String::new(), |f| format!(" (fix: {f})"));
            format!("{}{fix}", numapin::error::with_causes(e))
        }));
    }
    Ok(r)
}

fn report(
    topo: &Topology,
    root: &std::path::Path,
    scan: Scan,
    named: bool,
    pass: u64,
    started: Instant,
    notes: &[String],
) -> Report {
    let processes: Vec<ProcessReport> =
        scan.processes.into_iter().map(|s| judge(topo, s)).collect();
    let (nodes, node_checks) = node_use(topo, &processes);
    let all = || processes.iter().flat_map(|p| &p.checks).chain(&node_checks);
    let count = |v: Verdict| all().filter(|c| c.verdict == v).count();
    let fail = count(Verdict::Fail);
    let skip = count(Verdict::Skip);
    Report {
        source: topo.source.clone(),
        root: root.display().to_string(),
        pass,
        elapsed_s: started.elapsed().as_secs_f64(),
        named,
        looked_at: scan.looked_at,
        summary: Summary {
            ok: count(Verdict::Ok),
            warn: count(Verdict::Warn),
            fail,
            skip,
            exit_code: i32::from(fail > 0),
        },
        processes,
        unreadable: scan.unreadable,
        exited: scan.exited,
        nvml: scan.driver,
        nodes,
        node_checks,
        machine_budget: Vec::new(),
        notes: notes.to_vec(),
    }
}
