//! The words every check of a process uses: a check made for a process,
//! a list of nodes as people read it.

use crate::cpulist::CpuList;
use crate::doctor::{Check, Verdict};

/// A check about process `pid`: `verdict` with `evidence`, and `fix`
/// when the verdict is warn or fail.
pub(super) fn check(
    name: &'static str,
    pid: u32,
    verdict: Verdict,
    evidence: impl Into<String>,
    fix: impl Into<String>,
) -> Check {
    let c = match verdict {
        Verdict::Fail => Check::fail(name, evidence, fix),
        Verdict::Warn => Check::warn(name, evidence, fix),
        Verdict::Skip => Check::skip(name, evidence),
        _ => Check::ok(name, evidence),
    };
    c.for_process(pid)
}

/// `node 1`, `nodes 0-1`.
pub(super) fn node_list(nodes: &[u32]) -> String {
    match nodes {
        [n] => format!("node {n}"),
        _ => format!("nodes {}", nodes.iter().copied().collect::<CpuList>()),
    }
}
