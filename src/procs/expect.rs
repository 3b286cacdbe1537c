//! Which GPU a process works for, and so which node it belongs on: the
//! `gpu` check. The GPU comes from the library's own answers: the
//! launcher's local rank or the one GPU `CUDA_VISIBLE_DEVICES` leaves, as
//! [`rank_plan`] chooses it for `numapin exec` (under the process's own
//! `CUDA_VISIBLE_DEVICES` and cpuset), else the one GPU the process has open.

use std::borrow::Cow;
use std::ffi::OsString;

use serde::Serialize;

use super::attribution::{GpuContext, GpuSource};
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

/// What a process works on, by its [`Attribution`](super::Attribution).
struct Used {
    /// The GPUs of the topology it works on, ascending.
    gpus: Vec<GpuIndex>,
    /// In words: `NVML lists it on GPU 1 (522.0 MiB)`, `it has GPU 0-3
    /// mapped`.
    phrase: String,
    /// By NVML (exact), rather than device files (approximate).
    exact: bool,
    /// With device files: why they are approximate, ready to append.
    approximate: String,
    /// Device files that name no GPU of the topology.
    unknown: usize,
}

/// The GPUs a process works on: those NVML lists it on; without NVML,
/// its device files mapped, else those open (approximate).
fn used(t: &Topology, s: &ProcessSnapshot) -> Used {
    let unknown = s.gpus.iter().filter(|g| g.gpu.is_none()).count();
    let a = &s.attribution;
    if a.source == GpuSource::Nvml {
        let mut gpus: Vec<GpuIndex> = a.contexts.iter().filter_map(|c| c.gpu).collect();
        gpus.sort_unstable();
        gpus.dedup();
        return Used {
            gpus,
            phrase: format!("NVML lists it on {}", contexts(t, &a.contexts)),
            exact: true,
            approximate: String::new(),
            unknown,
        };
    }
    let mapped = s.gpus.iter().any(|g| g.mapped);
    let mut gpus: Vec<GpuIndex> = s
        .gpus
        .iter()
        .filter(|g| g.mapped || !mapped)
        .filter_map(|g| g.gpu)
        .collect();
    gpus.sort_unstable();
    gpus.dedup();
    let how = if mapped { "mapped" } else { "open" };
    let phrase = if gpus.is_empty() {
        "no GPU device open or mapped (yet)".to_string()
    } else {
        format!("it has GPU {} {how}", list(&gpus))
    };
    let why = a.approximate.as_deref().unwrap_or("NVML not asked");
    Used {
        gpus,
        phrase,
        exact: false,
        approximate: format!(
            " (device files, approximate: the CUDA driver opens and maps every GPU it can see; {why})"
        ),
        unknown,
    }
}

/// `GPU 0 (2.0 GiB), GPU 1 (522.0 MiB)`: each GPU with the memory on it.
pub(super) fn contexts(t: &Topology, cs: &[GpuContext]) -> String {
    cs.iter()
        .map(|c| {
            let name = match c.gpu {
                Some(g) if t.gpu(g).is_some() => format!("GPU {g}"),
                _ => format!("{} (not a GPU of the description)", c.bus_id),
            };
            match c.used_bytes {
                Some(b) => format!("{name} ({})", crate::arena::fmt_bytes(b)),
                None => format!("{name} (memory not given)"),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
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
    let used = used(&t, s);
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
        Some(Ok((p, line))) => by_launcher(&t, s, p, &line, &used),
        Some(Err(e)) => {
            notes.push(crate::report::with_causes(&e));
            by_devices(&t, s, &used)
        }
        None => by_devices(&t, s, &used),
    };
    // What could not be used of its variables is a warning at least: the
    // GPU CUDA gives it may not be the one judged against.
    let trouble = !notes.is_empty();
    if used.unknown > 0 {
        notes.push(format!(
            "{} GPU device file(s) name no GPU of the description (no /proc/driver/nvidia/gpus/*/information for their minor)",
            used.unknown
        ));
    }
    for n in notes {
        c.evidence.push_str(&format!("; {n}"));
    }
    if trouble && matches!(c.verdict, Verdict::Ok | Verdict::Skip) {
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

/// The GPU(s) it works on, without a launcher's choice.
fn by_devices(t: &Topology, s: &ProcessSnapshot, used: &Used) -> (Check, Option<Expected>) {
    let pid = s.pid;
    let expected = match used.gpus.as_slice() {
        [g] => Some(one_open(t, *g, used)),
        [] => None,
        many => Some(several(t, many, used)),
    };
    let c = match &expected {
        Some(e) if e.nodes.len() > 1 && used.exact => check(
            "gpu",
            pid,
            Verdict::Warn,
            e.how.clone(),
            "run one process per GPU (`torchrun --nproc-per-node`), each bound near its own GPU with `numapin exec -- CMD`",
        ),
        Some(e) if e.nodes.len() > 1 => check(
            "gpu",
            pid,
            Verdict::Skip,
            format!("{}{}: not judged", e.how, used.approximate),
            "",
        ),
        Some(e) => check("gpu", pid, Verdict::Ok, format!("{}{}", e.how, used.approximate), ""),
        None => no_gpu(s),
    };
    (c, expected)
}

/// The rank's GPU, checked against what the process works on: a verdict
/// from NVML's lists; from device files, words only (`ok`, or `skip` where
/// they disagree with the rank).
fn by_launcher(
    t: &Topology,
    s: &ProcessSnapshot,
    plan: RankPlan,
    line: &str,
    used: &Used,
) -> (Check, Option<Expected>) {
    let pid = s.pid;
    let g = plan.gpu.expect("a rank plan names its GPU");
    let nodes: Vec<u32> = t.gpu(g).and_then(|x| x.numa_node).into_iter().collect();
    // rank_plan's sentence: "GPU 3 (bus) chosen by ...; mode node".
    let why = line.split_once(" chosen by ").map_or(line, |(_, w)| w);
    let why = why.split("; mode ").next().unwrap_or(why);
    let how = format!("{}, chosen by {why}", gpu_label(t, g));
    let evidence = format!("{how}; {}", used.phrase);
    let others: Vec<GpuIndex> = used.gpus.iter().copied().filter(|&u| u != g).collect();
    let elsewhere = !used.gpus.is_empty() && !used.gpus.contains(&g);
    let check = if elsewhere && used.exact {
        check(
            "gpu",
            pid,
            Verdict::Fail,
            format!("{evidence}: not its rank's GPU"),
            "make each rank use its own GPU: `torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"]))` before any CUDA work, or let the launcher give each rank one GPU in CUDA_VISIBLE_DEVICES",
        )
    } else if elsewhere {
        check(
            "gpu",
            pid,
            Verdict::Skip,
            format!("{evidence}, not its rank's{}: not judged", used.approximate),
            "",
        )
    } else if used.exact && !others.is_empty() {
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
        check(
            "gpu",
            pid,
            Verdict::Ok,
            format!("{evidence}{}", used.approximate),
            "",
        )
    };
    let expected = Expected {
        gpus: vec![g],
        nodes,
        how,
        plan: Some(plan),
    };
    (check, Some(expected))
}

/// The only GPU `used` names: `the only GPU NVML lists it on`.
fn only(used: &Used) -> &'static str {
    if used.exact {
        "the only GPU NVML lists it on"
    } else if used.phrase.ends_with("mapped") {
        "the only GPU it has mapped"
    } else {
        "the only GPU it has open"
    }
}

/// The one GPU the process works on.
fn one_open(t: &Topology, g: GpuIndex, used: &Used) -> Expected {
    let how = format!(
        "{}: {}; no launcher rank variable",
        gpu_label(t, g),
        only(used)
    );
    let plan = match t.gpu(g).and_then(|x| x.cuda_ordinal) {
        Some(o) => rank_plan(
            t,
            RankChoice::default()
                .with_gpu(Some(o))
                .with_gpu_from(Some("the GPU it works on"))
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
fn several(t: &Topology, gpus: &[GpuIndex], used: &Used) -> Expected {
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
        how: format!("{} ({on}); no launcher rank variable", used.phrase),
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
