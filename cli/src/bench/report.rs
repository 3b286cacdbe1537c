//! What `numapin bench` reports: each figure ([`BenchResult`]), the
//! options of a run ([`BenchOptions`]), the run's report and the machine
//! it ran on.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use numapin::measure::arena::Stats;
use numapin::runtime::{RegionMethods, Runtime};
use numapin::CudaOrdinal;

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub(super) struct BenchResult {
    /// The figure's name (`h2d`, `arena_alloc_free`, ...).
    pub(crate) name: String,
    /// Its unit (`GB/s`, `ns`, `ms`, `ratio`).
    pub(crate) unit: String,
    /// Median over the repetitions.
    pub(crate) median: f64,
    /// Smallest repetition.
    pub(crate) min: f64,
    /// Largest repetition.
    pub(crate) max: f64,
    /// Timed repetitions.
    pub(crate) reps: usize,
    /// Parameters (`gpu`, `memory`, `bytes`, ...).
    #[serde(flatten)]
    pub(crate) params: BTreeMap<String, Value>,
}

impl BenchResult {
    /// A result from measured statistics.
    pub(super) fn new(name: &str, unit: &str, s: &Stats) -> Self {
        Self {
            name: name.into(),
            unit: unit.into(),
            median: s.median,
            min: s.min,
            max: s.max,
            reps: s.samples,
            params: BTreeMap::new(),
        }
    }

    /// Adds a parameter.
    pub(super) fn with(mut self, key: &str, v: impl Into<Value>) -> Self {
        self.params.insert(key.into(), v.into());
        self
    }

    /// A parameter's value.
    pub(super) fn param(&self, key: &str) -> Option<&Value> {
        self.params.get(key)
    }

    /// Adds how the regions behind the figure were placed, pinned and
    /// verified, and their pages (`placed=first_touch pinned=mlock
    /// verified=numa_maps page_kind=thp` under a seccomp profile that refuses
    /// mbind and move_pages).
    pub(super) fn with_methods(self, m: Option<RegionMethods>) -> Self {
        match m {
            None => self,
            Some(m) => self
                .with("placed", m.placed.as_str())
                .with("pinned", m.pinned.as_str())
                .with("verified", m.verified.as_str())
                .with("page_kind", m.pages.as_str()),
        }
    }
}

/// The methods of a node's regions when they all share them (what the
/// arena figures on that node ran on), from its stats.
pub(super) fn node_methods(rt: &Runtime, node: u32) -> Option<RegionMethods> {
    rt.stats()
        .into_iter()
        .find(|s| s.node == node)?
        .shared_methods()
}

/// Which measurements to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Measure {
    /// Arena alloc+free latency, region creation cost, arena overhead.
    Arena,
    /// Per-GPU host-to-device and device-to-host copies by memory kind.
    Copy,
    /// The staged copy of pageable memory.
    Staged,
    /// All GPUs at once.
    AllGpus,
    /// Loader throughput.
    Loader,
    /// Pinning itself: region creation per step and per backend, release,
    /// placement checks, registration in parts, copies per backend, and
    /// the cold-pinning figures.
    Pinning,
    /// Only the cold-pinning figures of `pinning`: regions of 1 GiB and more
    /// made from nothing by each way of making them.
    ColdPinning,
}

/// What to measure and how long.
#[derive(Debug, Clone)]
pub(super) struct BenchOptions {
    /// CUDA ordinals to measure (all visible when `None`).
    pub(crate) gpus: Option<Vec<CudaOrdinal>>,
    /// Bytes per copy.
    pub(crate) copy_bytes: usize,
    /// Timed repetitions per figure.
    pub(crate) reps: usize,
    /// Untimed repetitions before them.
    pub(crate) warmup: usize,
    /// Measurements to run.
    pub(crate) measures: Vec<Measure>,
    /// Region sizes the pinning figures are measured at.
    pub(crate) region_sizes: Vec<usize>,
    /// Whether the staged figures sweep threads and chunk sizes.
    pub(crate) staged_sweep: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            gpus: None,
            copy_bytes: 256 << 20,
            reps: 10,
            warmup: 2,
            measures: vec![
                Measure::Arena,
                Measure::Copy,
                Measure::Staged,
                Measure::AllGpus,
                Measure::Loader,
                Measure::Pinning,
            ],
            region_sizes: vec![256 << 20, 4 << 30],
            staged_sweep: false,
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub(super) struct BenchReport {
    /// Version of this JSON schema.
    pub(crate) schema_version: u32,
    /// The machine the figures come from.
    pub(crate) machine: Machine,
    /// The figures.
    pub(crate) results: Vec<BenchResult>,
    /// Sentences a person should read (no GPU, a skipped measurement, ...).
    pub(crate) notes: Vec<String>,
}

/// Where a run's measurements go: the report they fill, and the line
/// that says what runs now.
pub(super) struct Sink<'a> {
    report: &'a mut BenchReport,
    progress: &'a mut dyn FnMut(&str),
}

impl<'a> Sink<'a> {
    /// Fills `report`, telling `progress` what runs now.
    pub(super) fn new(report: &'a mut BenchReport, progress: &'a mut dyn FnMut(&str)) -> Self {
        Self { report, progress }
    }

    /// Says what runs now.
    pub(super) fn progress(&mut self, what: &str) {
        (self.progress)(what);
    }

    /// Adds a figure.
    pub(super) fn push(&mut self, r: BenchResult) {
        self.report.results.push(r);
    }

    /// Adds a sentence for the reader.
    pub(super) fn note(&mut self, n: String) {
        self.report.notes.push(n);
    }
}

/// The machine, as the report names it.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Machine {
    /// Host name.
    pub(crate) hostname: String,
    /// CPU model.
    pub(crate) cpu: String,
    /// Logical CPUs this process may use.
    pub(crate) cpus: usize,
    /// NUMA nodes.
    pub(crate) numa_nodes: usize,
    /// CUDA driver version (`12080` = 12.8), if any.
    pub(crate) cuda_driver: Option<u32>,
    /// The GPUs measured: CUDA ordinal, name, bus id, node.
    pub(crate) gpus: Vec<Value>,
}

pub(super) fn machine(rt: &Runtime, ordinals: &[CudaOrdinal]) -> Machine {
    let t = rt.topology();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "unknown".into());
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    Machine {
        hostname,
        cpu,
        cpus: t.allowed.cpus.len(),
        numa_nodes: t.numa_nodes.len(),
        cuda_driver: t.cuda.driver_version,
        gpus: ordinals
            .iter()
            .filter_map(|o| t.gpu_by_ordinal(*o).map(|g| (o, g)))
            .map(|(o, g)| serde_json::json!({"cuda_ordinal": o, "name": g.name, "pci_bus_id": g.pci_bus_id, "numa_node": g.numa_node}))
            .collect(),
    }
}
