//! What was read of a process, in sentences for the text report.

use super::attribution::GpuSource;
use super::expect::contexts;
use super::locality::{nodes_of, threads_by_node};
use super::publish::Publication;
use super::snapshot::ProcessSnapshot;
use super::words::node_list;
use crate::arena::fmt_bytes;
use crate::topology::Topology;

/// `node 0 1.0 GiB, node 1 2.0 MiB`.
fn per_node(m: &std::collections::BTreeMap<u32, u64>) -> String {
    if m.is_empty() {
        return "none".into();
    }
    m.iter()
        .map(|(n, &b)| format!("node {n} {}", fmt_bytes(b)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn opt_bytes(b: Option<u64>) -> String {
    b.map_or("?".into(), fmt_bytes)
}

/// The sentences, one per aspect: environment, GPUs, threads, memory,
/// numapin, and what could not be read.
pub(super) fn facts(t: &Topology, s: &ProcessSnapshot) -> Vec<String> {
    let mut out = vec![environment(s), gpus(t, s), threads(t, s), memory(s)];
    out.extend(numapin(s));
    for u in &s.unread {
        out.push(format!("not read: {}: {}", u.part, u.why));
    }
    out
}

/// `environment: LOCAL_RANK=0 ... CUDA_VISIBLE_DEVICES unset`.
fn environment(s: &ProcessSnapshot) -> String {
    let Some(e) = &s.environment else {
        return "environment: not readable".into();
    };
    let mut vars: Vec<String> = e
        .launcher
        .iter()
        .chain(&e.nic)
        .map(|(k, v)| format!("{k}={}", crate::report::shorten(v)))
        .collect();
    vars.push(match &e.cuda_visible_devices {
        Some(v) => format!("CUDA_VISIBLE_DEVICES={}", crate::report::quote(v)),
        None => "CUDA_VISIBLE_DEVICES unset".into(),
    });
    if let Some(o) = &e.cuda_device_order {
        vars.push(format!("CUDA_DEVICE_ORDER={}", crate::report::shorten(o)));
    }
    format!("environment: {}", vars.join(" "))
}

/// `GPUs: NVML lists it on GPU 1 (522.0 MiB); device files: GPU 0
/// (0000:...) open and mapped; the NVIDIA driver open`, or `GPUs (device
/// files, approximate: why): ...`.
fn gpus(t: &Topology, s: &ProcessSnapshot) -> String {
    let files: Vec<String> = s
        .gpus
        .iter()
        .map(|g| {
            let name = match (g.gpu, &g.bus_id) {
                (Some(i), Some(b)) => format!("GPU {i} ({b})"),
                (None, Some(b)) => format!("{b} (not a GPU of the description)"),
                _ => format!("{} (bus id unknown)", g.path),
            };
            let how = match (g.mapped, g.descriptor) {
                (true, true) => "open and mapped",
                (true, false) => "mapped",
                _ => "open",
            };
            format!("{name} {how}")
        })
        .collect();
    let driver = if s.nvidia_driver {
        "; the NVIDIA driver open"
    } else {
        ""
    };
    let files = if files.is_empty() {
        "none open or mapped".into()
    } else {
        files.join(", ")
    };
    let a = &s.attribution;
    match a.source {
        GpuSource::Nvml => format!(
            "GPUs: NVML lists it on {}; device files: {files}{driver}",
            contexts(t, &a.contexts)
        ),
        GpuSource::DeviceFiles => format!(
            "GPUs (device files, approximate: {}): {files}{driver}",
            a.approximate.as_deref().unwrap_or("NVML not asked")
        ),
    }
}

/// `threads: 12, last ran 12 on node 0 (CPUs 0-5); may run on CPUs ...`.
fn threads(t: &Topology, s: &ProcessSnapshot) -> String {
    let ran = threads_by_node(t, s)
        .iter()
        .map(|(n, (c, cpus))| {
            let n = n.map_or("no known node".into(), |n| format!("node {n}"));
            format!("{c} on {n} (CPUs {cpus})")
        })
        .collect::<Vec<_>>()
        .join(", ");
    let ran = if ran.is_empty() {
        "nowhere known".into()
    } else {
        ran
    };
    let may = s.allowed_cpus.as_ref().map_or("?".into(), |a| {
        format!("{a} ({})", node_list(&nodes_of(t, a)))
    });
    format!(
        "threads: {}, last ran {ran}; may run on CPUs {may}",
        s.threads.count
    )
}

/// `memory: data node 0 1 GiB; files ...; policy ...; VmRSS ...`.
fn memory(s: &ProcessSnapshot) -> String {
    match &s.memory {
        None => "memory: not readable".into(),
        Some(m) => format!(
            "memory: data {}; files {}; policy {}; VmRSS {}, VmLck {}, VmPin {}",
            per_node(&m.data),
            per_node(&m.file),
            m.policy.as_deref().unwrap_or("unknown"),
            opt_bytes(s.rss_bytes),
            opt_bytes(s.locked_bytes),
            opt_bytes(s.pinned_bytes)
        ),
    }
}

/// `numapin: 1 runtime(s); node 0 2 region(s) ...`, when published.
fn numapin(s: &ProcessSnapshot) -> Option<String> {
    let p = match &s.numapin {
        Publication::NotFound => return None,
        Publication::Unusable(why) => return Some(format!("numapin: stats not published: {why}")),
        Publication::Read(p) => p,
    };
    let nodes: Vec<String> = p
        .per_node()
        .iter()
        .filter(|(_, b)| b.regions > 0)
        .map(|(n, b)| {
            format!(
                "node {n} {} region(s) {} pinned, {} in use",
                b.regions,
                fmt_bytes(b.pinned),
                fmt_bytes(b.in_use)
            )
        })
        .collect();
    let cut = if p.truncated {
        " (truncated by the writer: too many runtimes to publish)"
    } else {
        ""
    };
    let held = if nodes.is_empty() {
        "no region".into()
    } else {
        nodes.join("; ")
    };
    Some(format!(
        "numapin: {} runtime(s){cut}; {held}",
        p.runtimes.len()
    ))
}
