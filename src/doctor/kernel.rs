//! The checks of the kernel's settings for this process: its memory
//! policy (`memory_policy`), transparent huge pages
//! (`transparent_hugepages`), automatic NUMA balancing (`numa_balancing`)
//! and the IOMMU (`iommu`).

use super::check::Check;
use super::words::{list, multi_node, nodes_text, visible_gpu_nodes};
use crate::gpu::GpuIndex;
use crate::system::{Iommu, MempolicyError, PolicyMode, PolicySource, Thp, ThreadPolicy};
use crate::topology::Topology;

/// The process's memory policy against its GPUs' nodes (`memory_policy`).
///
/// `ok` for the default and local policies, and for a policy whose nodes
/// include every visible GPU's node. A `bind` policy with none of the GPUs'
/// nodes is a `fail`: every ordinary allocation (pageable tensors, staging
/// copies, the loader's buffers) is forced across the socket link. Other
/// policies with none of them, or any policy that leaves out some GPU's
/// node, are a `warn`. (Arena regions set their own `mbind`, so numapin's
/// pinned memory is placed right either way.)
///
/// When `get_mempolicy` was refused and the policy came from
/// `/proc/self/numa_maps`, the evidence says so.
pub(crate) fn memory_policy(t: &Topology, policy: &Result<ThreadPolicy, MempolicyError>) -> Check {
    let p = match policy {
        Ok(p) => p,
        Err(e) => return Check::warn(
            POLICY,
            format!("cannot read the memory policy (get_mempolicy): {e}"),
            "run where NUMA system calls are allowed (a seccomp profile may block get_mempolicy)",
        ),
    };
    let mut c = judge_policy(t, p.mode, &p.nodes);
    if let PolicySource::NumaMaps { refused } = &p.source {
        c.evidence.push_str(&format!(
            " (read from /proc/self/numa_maps: get_mempolicy is refused ({refused}))"
        ));
    }
    c
}

const POLICY: &str = "memory_policy";

/// The verdict on a policy of `mode` over `nodes` (see [`memory_policy`]).
fn judge_policy(t: &Topology, mode: PolicyMode, nodes: &[u32]) -> Check {
    let name = mode.as_str();
    if matches!(mode, PolicyMode::Default | PolicyMode::Local) {
        return Check::ok(
            POLICY,
            format!(
                "memory policy {name}: memory comes from the node of the CPU that first touches it"
            ),
        );
    }
    let gpu_nodes = visible_gpu_nodes(t);
    let ev = format!(
        "memory policy {name} over {}; the GPUs this process sees are on {}",
        nodes_text(nodes),
        nodes_text(&gpu_nodes)
    );
    if gpu_nodes.is_empty() {
        return Check::ok(POLICY, format!("{ev} (no GPU node to compare with)"));
    }
    let outside: Vec<u32> = gpu_nodes
        .iter()
        .copied()
        .filter(|n| !nodes.contains(n))
        .collect();
    let fix = "start the job without the memory binding (`numactl --membind` / `--preferred` / `--interleave` around it, or a launcher's set_mempolicy), or bind each rank near its own GPU with `numapin exec -- CMD` (see `numapin affinity`)";
    if outside.is_empty() {
        Check::ok(POLICY, format!("{ev}: every GPU node is included"))
    } else if outside.len() == gpu_nodes.len() && mode == PolicyMode::Bind {
        Check::fail(
            POLICY,
            format!("{ev}: bound away from every GPU's node, so this process's ordinary memory (pageable buffers, staging copies) is all remote to its GPUs"),
            fix,
        )
    } else {
        Check::warn(
            POLICY,
            format!("{ev}: GPU node(s) {} left out", list(&outside)),
            fix,
        )
    }
}

/// Transparent huge pages (`transparent_hugepages`). Arena regions ask for
/// huge pages with `MADV_HUGEPAGE`, which works in `always` and `madvise`
/// mode. `warn` for `never` (regions are built from 4 KiB pages: slower to
/// populate, lock and register, more TLB misses), for `defrag` = `always`
/// (any huge page fault of any process may stall in direct compaction), and
/// when the files are unreadable or unrecognised; `ok` otherwise.
pub(crate) fn transparent_hugepages(thp: &Thp) -> Check {
    const NAME: &str = "transparent_hugepages";
    const ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
    const DEFRAG: &str = "/sys/kernel/mm/transparent_hugepage/defrag";
    let Some(enabled) = thp.enabled.as_deref() else {
        return Check::warn(
            NAME,
            format!("{ENABLED} is not readable: the kernel has no transparent huge pages, so arena regions use 4 KiB pages"),
            "use a kernel built with CONFIG_TRANSPARENT_HUGEPAGE (every distribution kernel is)",
        );
    };
    let mode = thp.enabled_mode();
    let defrag_mode = thp.defrag_mode();
    let ev = format!(
        "enabled: {}, defrag: {}",
        mode.unwrap_or("?"),
        defrag_mode.unwrap_or("not readable")
    );
    match mode {
        Some("always") | Some("madvise") if defrag_mode == Some("always") => Check::warn(
            NAME,
            format!("{ev}: every huge page fault of every process may stall in direct compaction"),
            format!("`echo defer+madvise > {DEFRAG}` as root (lasts until reboot; set it in a boot-time unit or tuned profile to keep it)"),
        ),
        Some("always") | Some("madvise") => Check::ok(
            NAME,
            format!("{ev}: arena regions get huge pages (MADV_HUGEPAGE)"),
        ),
        Some("never") => Check::warn(
            NAME,
            format!("{ev}: arena regions are built from 4 KiB pages (512 times as many to populate, lock, register and map as with 2 MiB pages)"),
            format!("`echo madvise > {ENABLED}` as root (lasts until reboot); add `transparent_hugepage=madvise` to the kernel command line to keep it"),
        ),
        _ => Check::warn(
            NAME,
            format!("{ENABLED} holds {:?}, which numapin does not recognise", enabled.trim()),
            format!("check the kernel's documentation for {ENABLED}"),
        ),
    }
}

/// Automatic NUMA balancing (`numa_balancing`). `warn` when on with more
/// than one node: the kernel unmaps pages to see where they are used and
/// migrates them, which adds hinting faults and moves the process's
/// pageable memory (locked arena pages are not moved). `ok` when off, with
/// one node, or when the kernel lacks the feature.
pub(crate) fn numa_balancing(t: &Topology, value: Option<&str>) -> Check {
    const NAME: &str = "numa_balancing";
    const FILE: &str = "/proc/sys/kernel/numa_balancing";
    let Some(value) = value else {
        return Check::ok(
            NAME,
            format!("{FILE} is not readable: the kernel has no automatic NUMA balancing"),
        );
    };
    let v = value.trim();
    match v.parse::<u32>() {
        Ok(0) => Check::ok(NAME, format!("{FILE} = 0: automatic NUMA balancing is off")),
        Ok(n) if !multi_node(t) => Check::ok(
            NAME,
            format!("{FILE} = {n}: on, but the machine has one NUMA node, so nothing moves"),
        ),
        Ok(n) => Check::warn(
            NAME,
            format!(
                "{FILE} = {n}: automatic NUMA balancing is on{}, on a machine with {} nodes: the kernel periodically unmaps processes' pages to see which node uses them and migrates them (hinting faults, copies); locked arena pages stay, pageable memory moves",
                if n & 2 != 0 { " (with memory tiering)" } else { "" },
                t.numa_nodes.len()
            ),
            "for jobs whose threads and memory are bound (numapin exec, arenas): `sysctl -w kernel.numa_balancing=0` as root, and a file in /etc/sysctl.d/ to keep it",
        ),
        Err(_) => Check::warn(
            NAME,
            format!("{FILE} holds {v:?}, which numapin does not recognise"),
            format!("check the kernel's documentation for {FILE}"),
        ),
    }
}

/// The IOMMU (`iommu`), where readable.
///
/// `fail` when a GPU's IOMMU domain is `blocked` (it cannot DMA at all);
/// `warn` when a GPU's domain translates DMA (`DMA`, `DMA-FQ`), or when an
/// IOMMU is active, the GPUs' domains are unreadable and the command line
/// has no passthrough (`iommu=pt`); `ok` for passthrough (`identity`), no
/// active IOMMU, no GPU, or nothing readable.
pub(crate) fn iommu(t: &Topology, v: &Iommu) -> Check {
    const NAME: &str = "iommu";
    let params = v.params();
    let pt = params.iter().any(|(k, val)| {
        (*k == "iommu" && *val == "pt") || (*k == "iommu.passthrough" && *val == "1")
    });
    let active = v.units.as_ref().is_some_and(|u| !u.is_empty()) || v.groups.unwrap_or(0) > 0;
    let known: Vec<(GpuIndex, &str)> = v
        .gpu_domains
        .iter()
        .filter_map(|(g, d)| d.as_deref().map(|d| (*g, d)))
        .collect();
    let ev = iommu_evidence(v, &params, &known);
    let pt_fix = "unless these devices need DMA isolation (VFIO passthrough to VMs, untrusted devices), add `iommu=pt` to the kernel command line and reboot: the IOMMU stays on for VFIO and interrupt remapping, devices owned by host drivers get identity mappings; GPUDirect RDMA and peer-to-peer setups usually require this";
    let gpus_of = |want: &dyn Fn(&str) -> bool| -> Vec<u32> {
        known
            .iter()
            .filter(|(_, d)| want(d))
            .map(|(g, _)| g.get())
            .collect()
    };
    let blocked = gpus_of(&|d| d == "blocked");
    let translated = gpus_of(&|d| d == "DMA" || d == "DMA-FQ");
    if !blocked.is_empty() {
        return Check::fail(
            NAME,
            format!("{ev}: GPU(s) {} are in a blocked IOMMU domain and cannot DMA", list(&blocked)),
            "bind the GPU to its driver (nvidia) rather than leaving it unbound or with a blocking domain: `lspci -k` shows the driver in use",
        );
    }
    if !translated.is_empty() {
        return Check::warn(
            NAME,
            format!("{ev}: DMA of GPU(s) {} is translated by the IOMMU, which costs copy bandwidth (IOTLB misses) and slows registering pinned memory", list(&translated)),
            pt_fix,
        );
    }
    if t.gpus.is_empty() || !known.is_empty() || !active {
        let what = if !known.is_empty() {
            "passthrough or unmanaged for every GPU"
        } else if !active {
            "no IOMMU active: DMA goes straight to memory"
        } else {
            "no GPU to check"
        };
        return Check::ok(NAME, format!("{ev}: {what}"));
    }
    if pt {
        return Check::ok(NAME, format!("{ev}: passthrough by default (iommu=pt)"));
    }
    Check::warn(
        NAME,
        format!("{ev}: an IOMMU is active and the GPUs' domain types are not readable; without iommu=pt kernels usually translate DMA"),
        pt_fix,
    )
}

/// What the IOMMU check read, in one sentence: the command line's IOMMU
/// parameters, the units, the groups and the GPUs' domains.
fn iommu_evidence(v: &Iommu, params: &[(&str, &str)], known: &[(GpuIndex, &str)]) -> String {
    let mut ev = vec![match &v.cmdline {
        None => "kernel command line not readable".to_string(),
        Some(_) if params.is_empty() => "no IOMMU parameters on the kernel command line".into(),
        Some(_) => format!(
            "kernel command line: {}",
            params
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    }];
    ev.push(match &v.units {
        None => "/sys/class/iommu not readable".into(),
        Some(u) if u.is_empty() => "no IOMMU units in /sys/class/iommu".into(),
        Some(u) => format!("IOMMU units {}", u.join(", ")),
    });
    if let Some(n) = v.groups {
        ev.push(format!("{n} IOMMU group(s)"));
    }
    if !known.is_empty() {
        ev.push(format!(
            "GPU domains: {}",
            known
                .iter()
                .map(|(g, d)| format!("GPU {g} {d}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    ev.join("; ")
}
