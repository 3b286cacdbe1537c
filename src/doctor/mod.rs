//! What keeps GPU data movement slow or broken on this machine, as data:
//! the checks behind `numapin doctor`, for a trainer to log at start-up.
//!
//! ```no_run
//! use numapin::doctor::{self, DoctorOptions, Verdict};
//! use numapin::topology::{ProbeOptions, Topology};
//!
//! let topo = Topology::probe(&ProbeOptions::from_process())?;
//! let report = doctor::run(&topo, &DoctorOptions::default());
//! for c in report.checks.iter().filter(|c| c.verdict >= Verdict::Warn) {
//!     eprintln!("{} {}: {}", c.verdict, c.name, c.evidence);
//!     if let Some(fix) = &c.fix {
//!         eprintln!("  fix: {fix}");
//!     }
//! }
//! # Ok::<(), numapin::Error>(())
//! ```
//!
//! Each [`Check`] has a name (one of [`CHECKS`]), a [`Subject`] (the
//! machine, a GPU, a node or a NIC), a [`Verdict`], the evidence it read and,
//! when there is something to do, the fix. The checks are pure functions of
//! the [`Topology`] and a [`SystemSnapshot`] of the live state
//! ([`evaluate`]), so every verdict can be tested with synthetic inputs;
//! [`run`] reads the snapshot and adds the pin probe, the one check that
//! acts: it makes a small pinned region on each node the way the arena
//! does and checks where its pages are.
//!
//! For a saved machine (a topology read from a file), only the checks of
//! the topology run; those that read this machine's live state
//! ([`LIVE_CHECKS`]) come back as [`Verdict::Skip`] with the reason
//! (`docs/doctor.md` has the rules of every check in prose).

mod check;
mod containers;
mod gpu;
mod huge_pages;
mod kernel;
mod limits;
mod nic;
mod pin_probe;
mod storage;
mod words;

use std::path::PathBuf;

pub use check::{Check, Subject, Verdict};

use crate::runtime::DEFAULT_BUDGET_FRACTION;
use crate::system::{SnapshotOptions, SystemSnapshot};
use crate::topology::Topology;

/// Every check's name, in report order (GPU checks once per GPU,
/// `pin_probe` once per node). A `cuda_visible_devices` warning comes after
/// `gpu_visible` when the topology has notes about `CUDA_VISIBLE_DEVICES`.
pub const CHECKS: &[&str] = &[
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
    "storage_locality",
    "pin_probe",
];

/// The checks that read this machine's live state rather than the
/// topology (skipped for a saved machine).
pub const LIVE_CHECKS: &[&str] = &[
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
    "storage_locality",
    "pin_probe",
];

/// What [`run`] does. Start from `DoctorOptions::default()` (every check,
/// with the CUDA driver, on this machine's files).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DoctorOptions {
    /// Whether the CUDA driver may be loaded (for the `cuda_driver` check
    /// and to register the pin probe's regions).
    pub cuda: bool,
    /// Whether to pin a probe region on each NUMA node (`pin_probe`).
    pub pin_probe: bool,
    /// Bytes of each pin probe region (rounded up to 2 MiB; default 2 MiB,
    /// small enough for an 8 MiB memlock limit).
    pub probe_bytes: usize,
    /// Whether to read the live state (limits, driver, kernel settings)
    /// and run the pin probe at all; even when true, they are read only
    /// for a topology of this machine (`source` `"live"`, as
    /// [`Topology::probe`] makes it).
    pub live_state: bool,
    /// The filesystem root the live state's files are read under (`/`;
    /// see [`SnapshotOptions::root`]).
    pub root: PathBuf,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        Self {
            cuda: true,
            pin_probe: true,
            probe_bytes: pin_probe::DEFAULT_PROBE_BYTES,
            live_state: true,
            root: PathBuf::from("/"),
        }
    }
}

with_setters!(DoctorOptions {
    with_cuda => cuda: bool,
    with_pin_probe => pin_probe: bool,
    with_probe_bytes => probe_bytes: usize,
    with_live_state => live_state: bool,
    with_root => root: PathBuf,
});

/// What [`run`] found.
#[derive(Debug)]
#[non_exhaustive]
pub struct Report {
    /// Every check, in report order ([`CHECKS`]), then those skipped.
    pub checks: Vec<Check>,
    /// The live state the checks read (`None` for a saved machine).
    pub system: Option<SystemSnapshot>,
}

impl Report {
    /// The worst verdict ([`Verdict::Skip`] when nothing ran).
    pub fn worst(&self) -> Verdict {
        self.checks
            .iter()
            .map(|c| c.verdict)
            .max()
            .unwrap_or(Verdict::Skip)
    }

    /// How many checks came out `verdict`.
    pub fn count(&self, verdict: Verdict) -> usize {
        self.checks.iter().filter(|c| c.verdict == verdict).count()
    }
}

/// Runs every check that applies to `topo`: those of the topology always;
/// for this machine's topology, the live state's (read now) and the pin
/// probe; the others come back as [`Verdict::Skip`] with the reason.
/// Never fails: what cannot be read is a check's evidence.
pub fn run(topo: &Topology, opts: &DoctorOptions) -> Report {
    let live = opts.live_state && topo.source == "live";
    if !live {
        let mut checks = evaluate(topo, None);
        let why = if topo.source != "live" {
            format!("reads this machine's live state, not {}'s", topo.source)
        } else {
            "the live state was not asked for (DoctorOptions::live_state)".to_string()
        };
        checks.extend(LIVE_CHECKS.iter().map(|&n| Check::skip(n, why.clone())));
        return Report {
            checks,
            system: None,
        };
    }
    let snapshot_opts = SnapshotOptions::default()
        .with_cuda(opts.cuda)
        .with_root(opts.root.clone());
    let system = SystemSnapshot::read(topo, &snapshot_opts);
    let mut checks = evaluate(topo, Some(&system));
    if opts.pin_probe {
        checks.extend(pin_probe::probe_all(topo, opts.probe_bytes, opts.cuda));
    } else {
        checks.push(Check::skip(
            "pin_probe",
            "not asked for (DoctorOptions::pin_probe)",
        ));
    }
    Report {
        checks,
        system: Some(system),
    }
}

/// The checks for a topology and (for this machine) its live state,
/// without the pin probe, in report order: a pure function of its inputs.
/// With no snapshot, only the checks of the topology.
pub fn evaluate(topo: &Topology, system: Option<&SystemSnapshot>) -> Vec<Check> {
    let mut out = Vec::new();
    if let Some(s) = system {
        let driver = s.cuda_driver.version().is_some();
        let need = limits::memlock_need(topo).bytes;
        out.push(limits::memlock(topo, &s.memlock, s.cap_ipc_lock(), driver));
        out.push(limits::cgroup_memory(
            &s.cgroup,
            DEFAULT_BUDGET_FRACTION,
            need,
        ));
        out.push(gpu::cuda_driver(topo, &s.cuda_driver));
    }
    out.extend(gpu::gpu_visibility(topo));
    out.extend(gpu::pcie_links(topo));
    out.extend(gpu::locality(topo));
    out.extend(gpu::gpu_cpus_allowed(topo));
    out.extend(gpu::gpu_memory_allowed(topo));
    out.extend(nic::nic_locality(topo));
    out.extend(nic::nic_pcie_links(topo));
    if let Some(s) = system {
        let nodes = topo
            .numa_nodes
            .iter()
            .filter(|n| n.memory_bytes > 0)
            .count();
        out.push(kernel::memory_policy(topo, &s.mempolicy));
        out.push(containers::numa_syscalls(&s.numa_calls, &s.security, nodes));
        out.push(containers::container(&s.container));
        out.push(kernel::transparent_hugepages(&s.thp));
        out.push(huge_pages::huge_pages(topo, &s.huge_pages));
        out.push(kernel::numa_balancing(topo, s.numa_balancing.as_deref()));
        out.push(kernel::iommu(topo, &s.iommu));
        out.extend(storage::storage_locality(topo, &s.mounts));
    }
    out
}

#[cfg(test)]
mod tests;
