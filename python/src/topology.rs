//! The machine as Python sees it: `numapin.topology()` (this machine's or a
//! saved one's) and `numapin.bind()` (the calling process near its GPU).

use std::path::{Path, PathBuf};

use numapin::affinity::{self, MemPolicy, Mode, PlanOptions, RankChoice};
use numapin::topology::ProbeOptions;
use numapin::{CudaOrdinal, Topology};
use pyo3::prelude::*;

use crate::args::{Choice, Choices, Names};
use crate::errors::to_py;

impl Choices for Mode {
    const ARG: &'static str = "mode";
    const WHAT: &'static str = "a binding mode";
    const NAMES: Names<Self> = &[
        ("node", Mode::Node, "the GPU's NUMA node"),
        ("socket", Mode::Socket, "its package"),
        (
            "exclusive",
            Mode::Exclusive,
            "a share of the node's cores per rank",
        ),
        ("cache", Mode::Cache, "one last-level cache per rank"),
        ("core", Mode::Core, "one core per rank"),
    ];

    /// The library's spellings (`core-complex` for `cache`).
    fn parse(name: &str) -> Option<Self> {
        name.parse().ok()
    }
}

/// `bind(memory=...)`: the memory policy set with the CPUs, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MemoryPolicy(Option<MemPolicy>);

/// `memory="bind"`, the default.
const BIND: MemoryPolicy = MemoryPolicy(Some(MemPolicy::Bind));

impl Choices for MemoryPolicy {
    const ARG: &'static str = "memory";
    const WHAT: &'static str = "a memory policy numapin sets";
    const NAMES: Names<Self> = &[
        ("bind", BIND, "only the GPU's node"),
        (
            "preferred",
            MemoryPolicy(Some(MemPolicy::Preferred)),
            "that node first",
        ),
        ("none", MemoryPolicy(None), "CPUs only"),
    ];
}

/// The saved machine at `input` (an hwloc XML export, a `numapin topo
/// --json` file, an NCCL topology, a captured root), or this one probed.
/// Called with the GIL released.
pub(crate) fn read(input: Option<&Path>, opts: &ProbeOptions) -> Result<Topology, numapin::Error> {
    Ok(match input {
        Some(p) => Topology::load(p, opts)?,
        None => Topology::probe(opts)?,
    })
}

/// The topology of this machine, or of a saved machine at `input`: its
/// JSON (the documented schema) and the `numapin topo` text.
#[pyfunction]
#[pyo3(signature = (input=None))]
pub(crate) fn topology(py: Python<'_>, input: Option<PathBuf>) -> PyResult<(String, String)> {
    py.detach(|| {
        let t = read(input.as_deref(), &ProbeOptions::from_process())?;
        Ok::<_, numapin::Error>((t.to_json(), t.to_text()))
    })
    .map_err(|e| to_py(py, &e))
}

/// Binds the calling process near its GPU (see `numapin.bind`); returns
/// the plan's JSON and how the GPU was chosen.
#[pyfunction]
#[pyo3(
    signature = (local_rank=None, *, gpu=None, node=None, mode=Choice(Mode::Node), memory=Choice(BIND), input=None),
    text_signature = "(local_rank=None, *, gpu=None, node=None, mode='node', memory='bind', input=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn bind(
    py: Python<'_>,
    local_rank: Option<u32>,
    gpu: Option<u32>,
    node: Option<u32>,
    mode: Choice<Mode>,
    memory: Choice<MemoryPolicy>,
    input: Option<PathBuf>,
) -> PyResult<(String, String)> {
    let (Choice(mode), Choice(MemoryPolicy(memory))) = (mode, memory);
    py.detach(|| {
        let topo = read(input.as_deref(), &ProbeOptions::from_process())?;
        let (mut plan, why) = match node {
            Some(n) => (
                affinity::plan_node(&topo, n)?,
                format!("NUMA node {n} (chosen)"),
            ),
            None => {
                let choice = RankChoice::default()
                    .with_local_rank(local_rank)
                    .with_gpu(gpu.map(CudaOrdinal));
                affinity::rank_plan(&topo, choice, mode, &PlanOptions::default())?
            }
        };
        // A saved machine is described, not bound.
        if input.is_none() {
            match memory {
                Some(policy) => {
                    // Refused by a seccomp profile: the CPUs are bound, and
                    // the plan says memory follows first touch.
                    if let affinity::Binding::CpusOnly { reason } =
                        affinity::bind_current_process(&plan, policy)?
                    {
                        plan.warnings.push(reason);
                    }
                }
                None => affinity::bind_current_process_cpus(&plan)?,
            }
        }
        let json = serde_json::to_string(&plan).expect("a plan always serializes");
        Ok::<_, numapin::Error>((json, why))
    })
    .map_err(|e| to_py(py, &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_is_named_and_core_complex_is_cache() {
        for m in Mode::ALL {
            assert_eq!(Mode::parse(m.as_str()), Some(m));
            assert!(Mode::NAMES
                .iter()
                .any(|(n, v, _)| *v == m && *n == m.as_str()));
        }
        assert_eq!(Mode::parse("core-complex"), Some(Mode::Cache));
    }
}
