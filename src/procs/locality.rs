//! The `cpus` and `memory` checks: where a process's threads ran and where
//! its data is, against its GPU's node.

use std::collections::BTreeMap;

use super::expect::{gpu_where, Expected};
use super::snapshot::ProcessSnapshot;
use super::words::{check, node_list};
use crate::arena::fmt_bytes;
use crate::cpulist::CpuList;
use crate::doctor::{Check, Verdict};
use crate::topology::Topology;

/// Data off the GPU's node below this is not worth a verdict (a small
/// process's stacks and libraries' data).
pub const MIN_OFF_NODE_BYTES: u64 = 16 << 20;

/// Threads per node (`None`: a CPU of no known node), with their CPUs.
pub(super) fn threads_by_node(
    t: &Topology,
    s: &ProcessSnapshot,
) -> BTreeMap<Option<u32>, (u32, CpuList)> {
    let mut out: BTreeMap<Option<u32>, (u32, CpuList)> = BTreeMap::new();
    for (&cpu, &n) in &s.threads.last_cpu {
        let e = out.entry(t.node_of_cpu(cpu)).or_default();
        e.0 += n;
        e.1 = e.1.union(&CpuList::from_iter_unsorted([cpu]));
    }
    out
}

fn node_name(n: Option<u32>) -> String {
    n.map_or("no known node".into(), |n| format!("node {n}"))
}

/// The nodes holding any of `cpus`.
pub(super) fn nodes_of(t: &Topology, cpus: &CpuList) -> Vec<u32> {
    t.numa_nodes
        .iter()
        .filter(|n| !n.cpus.is_disjoint(cpus))
        .map(|n| n.os_index)
        .collect()
}

/// The CPUs of `nodes`.
fn cpus_of(t: &Topology, nodes: &[u32]) -> CpuList {
    nodes
        .iter()
        .filter_map(|&n| t.node(n))
        .fold(CpuList::new(), |a, n| a.union(&n.cpus))
}

/// The fix for a process bound away from its GPU (or not bound):
/// `numapin exec` or `numapin.bind()`, and when its CPUs exclude the GPU's
/// node, where such a binding may come from.
fn bind_fix(t: &Topology, s: &ProcessSnapshot, e: &Expected, affinity: bool) -> String {
    let binding = match &e.plan {
        Some(p) => format!(" (CPUs {}, memory on {})", p.cpus, node_list(&p.mems)),
        None => String::new(),
    };
    let mut fix = format!(
        "start it bound near its GPU: `numapin exec -- CMD` under the launcher{binding}, or `numapin.bind()` first thing in the Python script"
    );
    let home = cpus_of(t, &e.nodes);
    if let Some(a) = s
        .allowed_cpus
        .as_ref()
        .filter(|a| affinity && !home.is_empty() && a.is_disjoint(&home))
    {
        fix = format!(
            "it may run only on CPUs {a}, none of {}'s: drop the binding that put it there (`taskset`, `numactl`, the launcher's) and {fix}; if the job's cgroup is what excludes CPUs {home}, give the job its GPU's CPUs (Slurm `--cpu-bind` / `--gres-flags=enforce-binding`, `docker --cpuset-cpus`, the Kubernetes topology manager `single-numa-node`)",
            node_list(&e.nodes)
        );
    }
    fix
}

/// How the threads are spread, in words: `its thread last ran on CPU 2
/// (node 2)`, `its 12 threads last ran on node 0 (CPUs 0-5)`, `of its 12
/// threads, 10 last ran on node 0 (CPUs 0-5), 2 on node 1 (CPUs 56-57)`.
fn ran_text(t: &Topology, s: &ProcessSnapshot) -> String {
    let by_node = threads_by_node(t, s);
    let count = s.threads.count;
    match by_node.iter().next() {
        Some((n, (_, cpus))) if by_node.len() == 1 && count == 1 => {
            format!("its thread last ran on CPU {cpus} ({})", node_name(*n))
        }
        Some((n, (_, cpus))) if by_node.len() == 1 => {
            format!(
                "its {count} threads last ran on {} (CPUs {cpus})",
                node_name(*n)
            )
        }
        _ => {
            let parts: Vec<String> = by_node
                .iter()
                .enumerate()
                .map(|(i, (n, (c, cpus)))| {
                    let verb = if i == 0 { " last ran" } else { "" };
                    format!("{c}{verb} on {} (CPUs {cpus})", node_name(*n))
                })
                .collect();
            format!("of its {count} threads, {}", parts.join(", "))
        }
    }
}

/// Where the threads last ran.
pub(super) fn cpus(t: &Topology, s: &ProcessSnapshot, e: &Expected) -> Option<Check> {
    let pid = s.pid;
    if e.nodes.is_empty() {
        return Some(unknown_node(t, e, "cpus", pid));
    }
    let count = s.threads.count;
    if count == 0 {
        return None;
    }
    let on: u32 = threads_by_node(t, s)
        .iter()
        .filter(|(n, _)| n.is_some_and(|n| e.nodes.contains(&n)))
        .map(|(_, (c, _))| c)
        .sum();
    let off = count - on;
    let home = cpus_of(t, &e.nodes);
    let (bound, may) = match &s.allowed_cpus {
        Some(a) => (
            a.is_subset(&home),
            format!("it may run on CPUs {a} ({})", node_list(&nodes_of(t, a))),
        ),
        None => (false, "its allowed CPUs are unknown".into()),
    };
    let mut evidence = format!("{}; {}; {may}", gpu_where(t, e), ran_text(t, s));
    let verdict = if off * 2 > count {
        Verdict::Fail
    } else if off > 0 {
        Verdict::Warn
    } else if !bound {
        evidence.push_str(": nothing keeps them on its GPU's node");
        Verdict::Warn
    } else {
        Verdict::Ok
    };
    Some(check(
        "cpus",
        pid,
        verdict,
        evidence,
        bind_fix(t, s, e, true),
    ))
}

fn unknown_node(t: &Topology, e: &Expected, name: &'static str, pid: u32) -> Check {
    let gpus: Vec<String> = e
        .gpus
        .iter()
        .map(|&g| super::expect::gpu_label(t, g))
        .collect();
    check(
        name,
        pid,
        Verdict::Warn,
        format!(
            "{}: the NUMA node is unknown (the firmware gives none), so its placement cannot be judged",
            gpus.join(", ")
        ),
        "see the warnings of `numapin topo`; on a VM, an instance type that exposes NUMA locality",
    )
}

/// A memory policy as `numa_maps` prints it: its mode and nodes.
fn policy_nodes(policy: &str) -> (&str, Option<Vec<u32>>) {
    let (mode, nodes) = match policy.split_once(':') {
        Some((m, n)) => (m, CpuList::parse(n).ok().map(|l| l.iter().collect())),
        None => (policy, None),
    };
    (mode.split('=').next().unwrap_or(mode), nodes)
}

/// The policy's verdict: `fail` when it takes memory from other nodes
/// only (bind, prefer), `warn` when it spreads it over others too
/// (interleave, or bind/prefer over several nodes).
fn policy_verdict(policy: Option<&str>, e: &Expected) -> (Verdict, String) {
    let Some(p) = policy else {
        return (Verdict::Ok, "memory policy unknown".into());
    };
    let (mode, nodes) = policy_nodes(p);
    let Some(nodes) = nodes else {
        return (Verdict::Ok, format!("memory policy {p}"));
    };
    let here = nodes.iter().any(|n| e.nodes.contains(n));
    let others = nodes.iter().any(|n| !e.nodes.contains(n));
    let v = match (mode, here, others) {
        (_, _, false) => Verdict::Ok,
        ("bind" | "prefer" | "prefer (many)", false, _) => Verdict::Fail,
        _ => Verdict::Warn,
    };
    let text = match v {
        Verdict::Fail => format!(
            "memory policy {p}: its new memory comes from {} only",
            node_list(&nodes)
        ),
        Verdict::Warn => format!("memory policy {p}: new memory also goes to other nodes"),
        _ => format!("memory policy {p}"),
    };
    (v, text)
}

/// Where the process's own data is.
pub(super) fn memory(t: &Topology, s: &ProcessSnapshot, e: &Expected) -> Option<Check> {
    let pid = s.pid;
    if e.nodes.is_empty() {
        return Some(unknown_node(t, e, "memory", pid));
    }
    let Some(m) = &s.memory else {
        let why = s
            .unread
            .iter()
            .find(|u| u.part == "memory")
            .map_or("not read".to_string(), |u| u.why.clone());
        return Some(check(
            "memory",
            pid,
            Verdict::Warn,
            format!("where its memory is cannot be told: {why}"),
            "run numapin ps as the process's user, or as root",
        ));
    };
    let total = m.data_total();
    let on: u64 = m
        .data
        .iter()
        .filter(|(n, _)| e.nodes.contains(n))
        .map(|(_, &b)| b)
        .sum();
    let off = total - on;
    let (pv, policy) = policy_verdict(m.policy.as_deref(), e);
    let bytes_v = if off >= MIN_OFF_NODE_BYTES && off * 2 > total {
        Verdict::Fail
    } else if off >= MIN_OFF_NODE_BYTES && off * 10 > total {
        Verdict::Warn
    } else {
        Verdict::Ok
    };
    let per_node = m
        .data
        .iter()
        .map(|(n, &b)| format!("node {n} {}", fmt_bytes(b)))
        .collect::<Vec<_>>()
        .join(", ");
    let share = match (off * 100).checked_div(total) {
        None => "no data present".to_string(),
        Some(_) if off == 0 => format!("all of its {} of data is on it", fmt_bytes(total)),
        Some(pct) => format!(
            "{pct}% of its {} of data is off it ({per_node}){}",
            fmt_bytes(total),
            if off < MIN_OFF_NODE_BYTES {
                format!(
                    ", under the {} worth judging",
                    fmt_bytes(MIN_OFF_NODE_BYTES)
                )
            } else {
                String::new()
            }
        ),
    };
    let evidence = format!("{}; {share}; {policy}", gpu_where(t, e));
    let fix = format!(
        "{}; memory placed already stays until the process restarts, or moves with `migratepages {} <from-nodes> {}`",
        bind_fix(t, s, e, false),
        s.pid,
        e.nodes.iter().copied().collect::<CpuList>()
    );
    Some(check("memory", pid, pv.max(bytes_v), evidence, fix))
}
