//! `numapin doctor`: what is misconfigured on this GPU server.
//!
//! Each [`Check`] has a [`Verdict`], the evidence it read and, when there is
//! something to do, the fix. The checks are pure functions of their inputs
//! ([`checks`]): the [`Topology`] and a [`SystemView`] of this machine's live
//! state (limits, CUDA driver, memory policy, THP, NUMA balancing, IOMMU),
//! which [`SystemView::read`] fills in, so every verdict can be tested with
//! synthetic inputs. The pin probe ([`pin_probe`]) is the one check that acts:
//! it makes a small pinned region on each node the way the arena does and
//! checks where its pages are.
//!
//! With a saved machine (`--input`), only the checks that read the topology
//! run; those that read this machine's live state are listed in
//! [`LIVE_CHECKS`] and reported as not run (see `docs/doctor.md`).

use serde::Serialize;

use super::system::{DriverState, SystemView};
use super::{checks, containers, huge_pages, pin_probe};

use numapin::topology::Topology;

/// How a check came out. Ordered: `Ok < Warn < Fail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Verdict {
    /// Nothing to do.
    Ok,
    /// Worth a look: costs performance or hides information, numapin still works.
    Warn,
    /// Broken: numapin (or the workload) cannot do its job this way.
    Fail,
}

/// One diagnosis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Check {
    /// A stable name (`memlock`, `pcie_link`, `pin_probe`, ...; the list is
    /// in `docs/doctor.md`).
    pub(crate) name: &'static str,
    /// The verdict.
    pub(crate) verdict: Verdict,
    /// What was read, with the values, in a sentence a person can check.
    pub(crate) evidence: String,
    /// What to do (`None` when there is nothing to do).
    pub(crate) fix: Option<String>,
    /// The GPU it is about ([`numapin::topology::Gpu::index`]), if any.
    pub(crate) gpu: Option<numapin::GpuIndex>,
    /// The NUMA node it is about, if any.
    pub(crate) node: Option<u32>,
    /// The NIC it is about (its position in
    /// [`numapin::topology::Topology::nics`]), if any.
    pub(crate) nic: Option<usize>,
}

impl Check {
    /// A passing check.
    pub(crate) fn ok(name: &'static str, evidence: impl Into<String>) -> Self {
        Self::new(name, Verdict::Ok, evidence, None)
    }

    /// A warning with its fix.
    pub(crate) fn warn(
        name: &'static str,
        evidence: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(name, Verdict::Warn, evidence, Some(fix.into()))
    }

    /// A failure with its fix.
    pub(crate) fn fail(
        name: &'static str,
        evidence: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(name, Verdict::Fail, evidence, Some(fix.into()))
    }

    fn new(
        name: &'static str,
        verdict: Verdict,
        evidence: impl Into<String>,
        fix: Option<String>,
    ) -> Self {
        Self {
            name,
            verdict,
            evidence: evidence.into(),
            fix,
            gpu: None,
            node: None,
            nic: None,
        }
    }

    /// The same check, about GPU `gpu`.
    pub(crate) fn for_gpu(mut self, gpu: numapin::GpuIndex) -> Self {
        self.gpu = Some(gpu);
        self
    }

    /// The same check, about NIC `nic`.
    pub(crate) fn for_nic(mut self, nic: usize) -> Self {
        self.nic = Some(nic);
        self
    }

    /// The same check, about NUMA node `node`.
    pub(crate) fn for_node(mut self, node: u32) -> Self {
        self.node = Some(node);
        self
    }
}

/// The checks every report on this machine holds, in report order (GPU
/// checks once per GPU, `pin_probe` once per node). A `cuda_visible_devices`
/// warning comes after `gpu_visible` when the topology has notes about
/// `CUDA_VISIBLE_DEVICES`.
#[cfg(test)]
pub(crate) const CHECK_NAMES: &[&str] = &[
    "memlock",
    "cgroup_memory",
    "cuda_driver",
    "gpu_visible",
    "pcie_link",
    "gpu_locality",
    "gpu_cpus_allowed",
    "gpu_memory_allowed",
    "nic_locality",
    "nic_pcie_link",
    "memory_policy",
    "numa_syscalls",
    "container",
    "transparent_hugepages",
    "huge_pages",
    "numa_balancing",
    "iommu",
    "pin_probe",
];

/// The checks that read this machine's live state rather than the topology
/// (not run for a saved machine given with `--input`).
pub(crate) const LIVE_CHECKS: &[&str] = &[
    "memlock",
    "cgroup_memory",
    "cuda_driver",
    "memory_policy",
    "numa_syscalls",
    "container",
    "transparent_hugepages",
    "huge_pages",
    "numa_balancing",
    "iommu",
    "pin_probe",
    "storage_locality",
];

/// What `numapin doctor` runs.
#[derive(Debug, Clone)]
pub(crate) struct DoctorOptions {
    /// Whether the topology is this machine's (probed live). When false (a
    /// saved machine), the [`LIVE_CHECKS`] are not run.
    pub(crate) live: bool,
    /// Whether the CUDA driver may be loaded (`--no-cuda` turns it off).
    pub(crate) cuda: bool,
    /// Whether to run the pin probe on each node.
    pub(crate) pin_probe: bool,
    /// Bytes of each pin probe region (rounded up to 2 MiB).
    pub(crate) probe_bytes: usize,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        Self {
            live: true,
            cuda: true,
            pin_probe: true,
            probe_bytes: pin_probe::DEFAULT_PROBE_BYTES,
        }
    }
}

/// Runs every check that applies: the topology checks always, the live
/// checks (and pin probe) when `opts.live`; returns them with the live
/// state they read.
pub(crate) fn run_checks(
    topo: &Topology,
    opts: &DoctorOptions,
) -> (Vec<Check>, Option<SystemView>) {
    let view = opts.live.then(|| SystemView::read(topo, opts.cuda));
    let mut out = evaluate(topo, view.as_ref());
    if opts.live {
        let mounts = numapin::storage::mounted(topo);
        out.extend(super::storage::storage_locality(topo, &mounts));
    }
    if opts.live && opts.pin_probe {
        out.extend(pin_probe::probe_all(topo, opts));
    }
    (out, view)
}

/// The checks for a topology and (for this machine) its live state, without
/// the pin probe: a pure function of its inputs.
pub(crate) fn evaluate(topo: &Topology, view: Option<&SystemView>) -> Vec<Check> {
    let mut out = Vec::new();
    if let Some(v) = view {
        let driver = matches!(v.cuda_driver, DriverState::Loaded(_));
        out.push(checks::memlock(topo, &v.memlock, v.cap_ipc_lock, driver));
        out.push(containers::cgroup_memory(
            &v.cgroup,
            numapin::runtime::DEFAULT_BUDGET_FRACTION,
            checks::memlock_need(topo).bytes,
        ));
        out.push(checks::cuda_driver(topo, &v.cuda_driver));
    }
    out.extend(checks::gpu_visibility(topo));
    out.extend(checks::pcie_links(topo));
    out.extend(checks::locality(topo));
    out.extend(checks::gpu_cpus_allowed(topo));
    out.extend(checks::gpu_memory_allowed(topo));
    out.extend(checks::nic_locality(topo));
    out.extend(checks::nic_pcie_links(topo));
    if let Some(v) = view {
        let mut policy = checks::memory_policy(topo, &v.mempolicy);
        if let Some(note) = &v.mempolicy_note {
            policy.evidence.push_str(&format!(" ({note})"));
        }
        out.push(policy);
        let nodes = topo
            .numa_nodes
            .iter()
            .filter(|n| n.memory_bytes > 0)
            .count();
        out.push(containers::numa_syscalls(&v.numa_calls, &v.security, nodes));
        out.push(containers::container(&v.container));
        out.push(checks::transparent_hugepages(
            v.thp_enabled.as_deref(),
            v.thp_defrag.as_deref(),
        ));
        out.push(huge_pages::huge_pages(topo, &v.huge_pages));
        out.push(checks::numa_balancing(topo, v.numa_balancing.as_deref()));
        out.push(checks::iommu(topo, &v.iommu));
    }
    out
}

/// The exit code for a set of checks: 1 when any fails, otherwise 0.
pub(crate) fn exit_code(checks: &[Check]) -> i32 {
    i32::from(checks.iter().any(|c| c.verdict == Verdict::Fail))
}
