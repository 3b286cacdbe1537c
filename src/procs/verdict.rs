//! Verdicts in `numapin doctor`'s words and types ([`crate::doctor::Check`]:
//! name, subject (the process, [`Subject::Process`](crate::doctor::Subject::Process)),
//! verdict, evidence, fix). [`judge`] gives one process's checks:
//!
//! | name | fails when |
//! | --- | --- |
//! | `gpu` | its launcher variables choose one GPU and it works on another |
//! | `cpus` | most of its threads last ran off its GPU's node |
//! | `memory` | most of its data (16 MiB or more) is off its GPU's node, or its memory policy takes memory from other nodes only |
//! | `nic` | `UCX_NET_DEVICES` or `NCCL_IB_HCA` selects only NICs farther from its GPU than its nearest |
//! | `numapin` | (warns only) numapin's arenas hold memory off its GPU's node |
//!
//! and warn for the milder cases (a process not bound, a minority of threads
//! or data elsewhere, several GPUs on several nodes, nothing to judge).

use serde::Serialize;

use super::expect::{expect, Expected};
use super::publish::Publication;
use super::snapshot::ProcessSnapshot;
use super::words::node_list;
use crate::arena::fmt_bytes;
use crate::doctor::{Check, Verdict};
use crate::topology::Topology;

/// One process judged.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessReport {
    /// What was read.
    #[serde(flatten)]
    pub snapshot: ProcessSnapshot,
    /// What it was judged against (`None`: no GPU to judge against).
    pub expected: Option<Expected>,
    /// What was read, in sentences (threads and memory per node, ...).
    pub facts: Vec<String>,
    /// The checks, in the order of the module's table.
    pub checks: Vec<Check>,
}

impl ProcessReport {
    /// The worst verdict of its checks (`Ok` without checks).
    pub fn verdict(&self) -> Verdict {
        self.checks
            .iter()
            .map(|c| c.verdict)
            .max()
            .unwrap_or(Verdict::Ok)
    }
}

/// Judges one process against the topology: which GPU it works for
/// (`gpu`), where its threads ran (`cpus`), where its data is (`memory`),
/// which NICs it was told to use (`nic`) and where numapin's arenas in it
/// are (`numapin`). A pure function of its inputs.
pub fn judge(topo: &Topology, snapshot: ProcessSnapshot) -> ProcessReport {
    let s = &snapshot;
    let (gpu, expected) = expect(topo, s);
    let mut checks = vec![gpu];
    if let Some(e) = &expected {
        checks.extend(super::locality::cpus(topo, s, e));
        checks.extend(super::locality::memory(topo, s, e));
        checks.extend(super::nic::nic(topo, s, e));
    }
    checks.extend(numapin(s, expected.as_ref()));
    let facts = super::facts::facts(topo, s);
    ProcessReport {
        snapshot,
        expected,
        facts,
        checks,
    }
}

/// numapin's own arenas against the GPU's node.
fn numapin(s: &ProcessSnapshot, e: Option<&Expected>) -> Option<Check> {
    let Publication::Read(p) = &s.numapin else {
        return None;
    };
    let per_node = p.per_node();
    let held: Vec<String> = per_node
        .iter()
        .filter(|(_, b)| b.regions > 0)
        .map(|(n, b)| {
            format!(
                "node {n}: {} pinned in {} region(s)",
                fmt_bytes(b.pinned),
                b.regions
            )
        })
        .collect();
    let held = if held.is_empty() {
        "numapin holds no region".to_string()
    } else {
        format!("numapin holds {}", held.join(", "))
    };
    let away: Vec<u32> = per_node
        .iter()
        .filter(|(n, b)| {
            b.pinned > 0 && e.is_some_and(|e| !e.nodes.is_empty() && !e.nodes.contains(n))
        })
        .map(|(&n, _)| n)
        .collect();
    let off: u64 = per_node.values().map(|b| b.pages_off_node).sum();
    if !away.is_empty() {
        let nodes = e.map(|e| node_list(&e.nodes)).unwrap_or_default();
        return Some(
            Check::warn(
                "numapin",
                format!("{held}; its GPU is on {nodes}"),
                "allocate for the GPU (`Runtime::alloc(Target::Gpu(N), ..)`, `numapin.empty(..., gpu=N)`): buffers then come from its node's arena",
            )
            .for_process(s.pid),
        );
    }
    if off > 0 {
        return Some(
            Check::warn(
                "numapin",
                format!("{held}; {off} page(s) of its regions are off their node (placement rule `Warn`)"),
                "see the method notes in the process's `stats()`; `numapin doctor` checks pinning on every node",
            )
            .for_process(s.pid),
        );
    }
    Some(Check::ok("numapin", held).for_process(s.pid))
}
