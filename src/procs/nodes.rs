//! The summary per NUMA node over every process listed: their memory there
//! and what numapin pins there, against the node's size and the default
//! budget.

use std::collections::BTreeMap;

use serde::Serialize;

use super::verdict::ProcessReport;
use crate::arena::{fmt_bytes, DEFAULT_BUDGET_FRACTION};
use crate::doctor::Check;
use crate::topology::Topology;

/// One node's row.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NodeUse {
    /// The node.
    pub node: u32,
    /// Its memory (0 when the description does not know it, or the node
    /// is not in it).
    pub memory_bytes: u64,
    /// The pinned budget one numapin runtime has there by default
    /// ([`DEFAULT_BUDGET_FRACTION`] of its memory).
    pub default_budget_bytes: u64,
    /// The listed processes' own data there.
    pub data_bytes: u64,
    /// The listed processes' mapped files there (page cache, counted once
    /// per process that maps it).
    pub file_bytes: u64,
    /// What numapin pins there in the listed processes (their published
    /// arenas).
    pub numapin_pinned_bytes: u64,
    /// Listed processes with data there.
    pub processes: u32,
}

/// One row per node of the description (and per node only the
/// processes' memory names), and a `node_budget` warning for each node
/// where numapin pins more than one runtime's default budget in all.
pub fn node_use(topo: &Topology, reports: &[ProcessReport]) -> (Vec<NodeUse>, Vec<Check>) {
    let mut rows: BTreeMap<u32, NodeUse> = topo
        .numa_nodes
        .iter()
        .map(|n| {
            (
                n.os_index,
                NodeUse {
                    node: n.os_index,
                    memory_bytes: n.memory_bytes,
                    default_budget_bytes: crate::num::share(
                        n.memory_bytes,
                        DEFAULT_BUDGET_FRACTION,
                    ),
                    ..NodeUse::default()
                },
            )
        })
        .collect();
    for r in reports {
        let s = &r.snapshot;
        if let Some(m) = &s.memory {
            for (&n, &b) in &m.data {
                let row = rows.entry(n).or_insert_with(|| NodeUse {
                    node: n,
                    ..NodeUse::default()
                });
                row.data_bytes = row.data_bytes.saturating_add(b);
                row.processes += u32::from(b > 0);
            }
            for (&n, &b) in &m.file {
                let row = rows.entry(n).or_insert_with(|| NodeUse {
                    node: n,
                    ..NodeUse::default()
                });
                row.file_bytes = row.file_bytes.saturating_add(b);
            }
        }
        if let Some(p) = s.numapin.published() {
            for (n, a) in p.per_node() {
                let row = rows.entry(n).or_insert_with(|| NodeUse {
                    node: n,
                    ..NodeUse::default()
                });
                row.numapin_pinned_bytes = row.numapin_pinned_bytes.saturating_add(a.pinned);
            }
        }
    }
    let checks = rows
        .values()
        .filter(|r| r.memory_bytes > 0 && r.numapin_pinned_bytes > r.default_budget_bytes)
        .map(|r| {
            Check::warn(
                "node_budget",
                format!(
                    "numapin pins {} on node {} over the processes listed, more than one runtime's default budget ({}, {:.0}% of the node's {}): together they may leave the node short",
                    fmt_bytes(r.numapin_pinned_bytes),
                    r.node,
                    fmt_bytes(r.default_budget_bytes),
                    DEFAULT_BUDGET_FRACTION * 100.0,
                    fmt_bytes(r.memory_bytes)
                ),
                "keep the machine budget on (the default; NUMAPIN_MACHINE_BUDGET=auto, a fraction such as 0.5 or bytes such as 64GiB per node), which every numapin process of a user shares, or give each process a share of the node: `RuntimeConfig::with_budget_bytes`, `numapin.configure(budget_bytes=...)`",
            )
            .for_node(r.node)
        })
        .collect();
    (rows.into_values().collect(), checks)
}
