//! Which GPU a process works for, and so which node it belongs on: the
//! `gpu` check. The GPU comes from the library's own answers: the
//! launcher's local rank or the one GPU `CUDA_VISIBLE_DEVICES` leaves, as
//! [`rank_plan`] chooses it for `numapin exec` (under the process's own
//! `CUDA_VISIBLE_DEVICES` and cpuset), else the one GPU the process has open.

use std::borrow::Cow;
use std::ffi::OsString;

use serde::Serialize;

use super::snapshot::ProcessSnapshot;
use super::words::{check, node_list};
use crate::affinity::{launcher, plan, rank_plan, Mode, PlanOptions, RankChoice, RankPlan};
use crate::cpulist::CpuList;
use crate::doctor::{Check, Verdict};
use crate::gpu::GpuIndex;
use crate::topology::{ProbeEnv, Topology};

/// What a process is judged against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Expected {
    /// The GPU(s) it works for.
    pub gpus: Vec<GpuIndex>,
    /// Their NUMA nodes (those known), ascending: where its threads and
    /// memory belong.
    pub nodes: Vec<u32>,
    /// How the GPU was chosen, in a sentence.
    pub how: String,
    /// The binding `numapin exec` would give it (one GPU): its CPUs within
    /// the process's cpuset, memory nodes and NICs.
    pub plan: Option<RankPlan>,
}

/// The GPUs a process works on: those mapped, else those open, known ones
/// first; and how many device files name no GPU of the topology.
fn used(s: &ProcessSnapshot) -> (Vec<GpuIndex>, bool, usize) {
    let mapped = s.gpus.iter().any(|g| g.mapped);
    let mut out: Vec<GpuIndex> = s
        .gpus
        .iter()
        .filter(|g| g.mapped || !mapped)
        .filter_map(|g| g.gpu)
        .collect();
    out.sort_unstable();
    out.dedup();
    let unknown = s.gpus.iter().filter(|g| g.gpu.is_none()).count();
    (out, mapped, unknown)
}

/// `GPU 3 (0000:47:00.0, node 1)`.
pub(super) fn gpu_label(t: &Topology, g: GpuIndex) -> String {
    match t.gpu(g) {
        Some(gpu) => format!(
            "GPU {g} ({}, {})",
            gpu.pci_bus_id,
            gpu.numa_node
                .map_or("node unknown".to_string(), |n| format!("node {n}"))
        ),
        None => format!("GPU {g}"),
    }
}

fn list(gpus: &[GpuIndex]) -> String {
    gpus.iter()
        .map(|g| g.get())
        .collect::<CpuList>()
        .to_string()
}

/// The topology as the process sees it: its CUDA variables and its
/// cpuset's memory nodes (`Mems_allowed_list`). Its CPUs are left as the
/// description has them: a process's CPU list is usually the affinity
/// mask it was started with (`taskset`, a launcher's binding), which
/// `numapin exec` replaces; the plan says what it would bind instead. A
/// value CUDA would not accept is a note, and the description is used as
/// it is.
pub(super) fn seen_by<'a>(
    topo: &'a Topology,
    s: &ProcessSnapshot,
) -> (Cow<'a, Topology>, Option<String>) {
    let env = s.environment.as_ref();
    let probe_env = ProbeEnv {
        cuda_visible_devices: env.and_then(|e| e.cuda_visible_devices.clone()),
        cuda_device_order: env.and_then(|e| e.cuda_device_order.clone()),
    };
    // A saved machine's nodes are not this machine's: its cpuset applies
    // to a live description only.
    let live = topo.source == "live";
    let nodes: Option<Vec<u32>> = s.allowed_nodes.as_ref().filter(|_| live).map(|n| {
        n.iter()
            .copied()
            .filter(|n| topo.allowed.numa_nodes.contains(n))
            .collect()
    });
    let nodes = nodes.filter(|n| !n.is_empty() && *n != topo.allowed.numa_nodes);
    // Most processes see what the description says: no copy for them.
    if probe_env == ProbeEnv::default() && nodes.is_none() && topo.cuda.visible_devices.is_none() {
        return (Cow::Borrowed(topo), None);
    }
    let (mut t, note) = match topo.with_cuda_env(&probe_env) {
        Ok(t) => (t, None),
        Err(e) => (topo.clone(), Some(crate::report::with_causes(&e))),
    };
    if let Some(nodes) = nodes {
        t.allowed.numa_nodes = nodes;
    }
    (Cow::Owned(t), note)
}

/// The `gpu` check and what the process is judged against.
pub(super) fn expect(topo: &Topology, s: &ProcessSnapshot) -> (Check, Option<Expected>) {
    let pid = s.pid;
    let (t, cuda_note) = seen_by(topo, s);
    let (used, mapped, unknown) = used(s);
    let how_used = if mapped { "mapped" } else { "open" };
    let env = s.environment.as_ref();
    let rank = env.map(|e| launcher::local_rank_with(|k| e.get(k).map(OsString::from)));
    let mut notes: Vec<String> = cuda_note.into_iter().collect();
    let rank = match rank {
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            notes.push(crate::report::with_causes(&e));
            None
        }
        None => None,
    };
    if unknown > 0 {
        notes.push(format!(
            "{unknown} GPU device file(s) name no GPU of the description (no /proc/driver/nvidia/gpus/*/information for their minor)"
        ));
    }
    let by_rank = (rank.is_some() || launcher::one_visible_gpu(&t)).then(|| {
        let mut c = RankChoice::default().with_ignore_environment(true);
        if let Some(r) = rank {
            c = c
                .with_local_rank(Some(r.rank))
                .with_local_rank_from(Some(r.variable));
        }
        rank_plan(&t, c, Mode::Node, &PlanOptions::default())
    });
    let (mut c, expected) = match by_rank {
        Some(Ok((p, line))) => by_launcher(&t, s, p, line, &used, how_used),
        Some(Err(e)) => {
            notes.push(crate::report::with_causes(&e));
            by_devices(&t, s, &used, how_used)
        }
        None => by_devices(&t, s, &used, how_used),
    };
    // What could not be used of its variables is a warning at least: the
    // GPU CUDA gives it may not be the one judged against.
    let trouble = !notes.is_empty();
    for n in notes {
        c.evidence.push_str(&format!("; {n}"));
    }
    if trouble && c.verdict == Verdict::Ok {
        c = check(
            "gpu",
            pid,
            Verdict::Warn,
            c.evidence,
            "check the job's launcher variables and CUDA_VISIBLE_DEVICES",
        );
    }
    (c, expected)
}

/// The GPU(s) it has open or mapped, without a launcher's choice.
fn by_devices(
    t: &Topology,
    s: &ProcessSnapshot,
    used: &[GpuIndex],
    how_used: &str,
) -> (Check, Option<Expected>) {
    let pid = s.pid;
    let expected = match used {
        [g] => Some(one_open(t, *g, how_used)),
        [] => None,
        many => Some(several(t, many, how_used)),
    };
    let c = match &expected {
        Some(e) if e.nodes.len() > 1 => check(
            "gpu",
            pid,
            Verdict::Warn,
            e.how.clone(),
            "run one process per GPU (`torchrun --nproc-per-node`), each bound near its own GPU with `numapin exec -- CMD`",
        ),
        Some(e) => check("gpu", pid, Verdict::Ok, e.how.clone(), ""),
        None => no_gpu(s),
    };
    (c, expected)
}

/// The rank's GPU, checked against what the process works on.
fn by_launcher(
    t: &Topology,
    s: &ProcessSnapshot,
    plan: RankPlan,
    line: String,
    used: &[GpuIndex],
    how_used: &str,
) -> (Check, Option<Expected>) {
    let pid = s.pid;
    let g = plan.gpu.expect("a rank plan names its GPU");
    let nodes: Vec<u32> = t.gpu(g).and_then(|x| x.numa_node).into_iter().collect();
    // rank_plan's sentence: "GPU 3 (bus) chosen by ...; mode node".
    let why = line
        .split_once(" chosen by ")
        .map_or(line.as_str(), |(_, w)| w);
    let why = why.split("; mode ").next().unwrap_or(why);
    let how = format!("{}, chosen by {why}", gpu_label(t, g));
    let evidence = match used {
        [] => format!("{how}; no GPU device open or mapped (yet)"),
        _ => format!("{how}; it has GPU {} {how_used}", list(used)),
    };
    let others: Vec<GpuIndex> = used.iter().copied().filter(|&u| u != g).collect();
    let check = if !used.is_empty() && !used.contains(&g) {
        check(
            "gpu",
            pid,
            Verdict::Fail,
            format!("{evidence}: not its rank's GPU"),
            "make each rank use its own GPU: `torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"]))` before any CUDA work, or let the launcher give each rank one GPU in CUDA_VISIBLE_DEVICES",
        )
    } else if how_used == "mapped" && !others.is_empty() {
        check(
            "gpu",
            pid,
            Verdict::Warn,
            format!(
                "{evidence}: GPU {} as well, not its rank's (a CUDA context there: a tensor or call on the wrong device before `torch.cuda.set_device`)",
                list(&others)
            ),
            "set the rank's device first thing (`torch.cuda.set_device(local_rank)`), and use `cuda:{local_rank}` rather than `cuda` or `cuda:0`",
        )
    } else {
        check("gpu", pid, Verdict::Ok, evidence, "")
    };
    let expected = Expected {
        gpus: vec![g],
        nodes,
        how,
        plan: Some(plan),
    };
    (check, Some(expected))
}

/// The one GPU the process works on.
fn one_open(t: &Topology, g: GpuIndex, how_used: &str) -> Expected {
    let how = format!(
        "{}: the only GPU it has {how_used}; no launcher rank variable",
        gpu_label(t, g)
    );
    let plan = match t.gpu(g).and_then(|x| x.cuda_ordinal) {
        Some(o) => rank_plan(
            t,
            RankChoice::default()
                .with_gpu(Some(o))
                .with_gpu_from(Some("the GPU it has open"))
                .with_ignore_environment(true),
            Mode::Node,
            &PlanOptions::default(),
        )
        .ok()
        .map(|(p, _)| p),
        None => plan(t, &[g], Mode::Node, &PlanOptions::default())
            .ok()
            .and_then(|mut p| p.ranks.pop()),
    };
    Expected {
        gpus: vec![g],
        nodes: t.gpu(g).and_then(|x| x.numa_node).into_iter().collect(),
        how,
        plan,
    }
}

/// Several GPUs and no rank: judged against all their nodes.
fn several(t: &Topology, gpus: &[GpuIndex], how_used: &str) -> Expected {
    let mut nodes: Vec<u32> = gpus
        .iter()
        .filter_map(|&g| t.gpu(g).and_then(|x| x.numa_node))
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    let on = match nodes.as_slice() {
        [n] => format!("all on node {n}"),
        _ => format!(
            "on nodes {}: one process cannot be near all of them",
            nodes.iter().copied().collect::<CpuList>()
        ),
    };
    Expected {
        gpus: gpus.to_vec(),
        nodes,
        how: format!(
            "it has GPUs {} {how_used} ({on}); no launcher rank variable",
            list(gpus)
        ),
        plan: None,
    }
}

/// No GPU to judge against.
fn no_gpu(s: &ProcessSnapshot) -> Check {
    let pid = s.pid;
    let env = match &s.environment {
        None => "its environment is not readable",
        Some(_) => "no launcher rank variable (LOCAL_RANK, SLURM_LOCALID, ...) and no single GPU in CUDA_VISIBLE_DEVICES",
    };
    let devices = if s.nvidia_driver {
        "it has the NVIDIA driver open but no GPU device file"
    } else {
        "no GPU device open or mapped"
    };
    check(
        "gpu",
        pid,
        Verdict::Warn,
        format!("{devices}; {env}: nothing to judge its placement against"),
        "give each rank its GPU the usual way (a launcher's LOCAL_RANK, or one GPU in CUDA_VISIBLE_DEVICES), or check it once it has started its CUDA work",
    )
}

/// Where the process's GPU(s) are, to start evidence: `GPU 3 is on node 1`.
pub(super) fn gpu_where(topo: &Topology, e: &Expected) -> String {
    match e.gpus.as_slice() {
        [g] if topo.gpu(*g).is_some() => format!("GPU {g} is on {}", node_list(&e.nodes)),
        _ => format!("its GPUs are on {}", node_list(&e.nodes)),
    }
}
