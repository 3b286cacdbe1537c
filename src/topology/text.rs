//! The text report of a topology (`numapin topo`, `Topology::to_text`).

use super::{NodeKind, PcieLink, Topology};
use crate::report::table::{bytes, Table};

fn pcie(p: &Option<PcieLink>) -> String {
    let Some(p) = p else { return "-".into() };
    let part = |g: Option<u8>, w: Option<u8>| match (g, w) {
        (Some(g), Some(w)) => format!("Gen{g} x{w}"),
        (Some(g), None) => format!("Gen{g}"),
        (None, Some(w)) => format!("x{w}"),
        (None, None) => "?".into(),
    };
    let now = part(p.current_gen, p.current_width);
    let s = if p.max_gen.is_some() || p.max_width.is_some() {
        format!("{now} (max {})", part(p.max_gen, p.max_width))
    } else if p.current_gen.is_none() && p.current_width.is_none() {
        p.speed_gbps.map_or("-".into(), |s| format!("{s:.1} GB/s"))
    } else {
        now
    };
    s
}

fn opt<T: std::fmt::Display>(v: Option<T>, none: &str) -> String {
    v.map_or_else(|| none.to_string(), |v| v.to_string())
}

/// The human-readable report: a summary line, the GPUs (with the
/// locality matrix), the NICs and storage devices, the nodes, the
/// packages, the CUDA ordinals and the warnings.
pub(crate) fn render(t: &Topology) -> String {
    let mut out = summary(t);
    if t.gpus.is_empty() {
        out.push_str("GPUs: none found\n\n");
    } else {
        out.push_str(&gpu_table(t));
        out.push('\n');
        if t.gpus.len() > 1 || !t.nics.is_empty() {
            out.push_str(&matrix(t));
            out.push('\n');
        }
    }
    out.push_str(&devices(t));
    out.push_str(&node_table(t));
    if !t.packages.is_empty() {
        out.push('\n');
        out.push_str(&package_table(t));
    }
    out.push('\n');
    out.push_str(&cuda_line(t));
    if !t.warnings.is_empty() {
        out.push_str("\nWarnings:\n");
        for w in &t.warnings {
            out.push_str(&format!("  - {}\n", w.message));
        }
    }
    out
}

/// The first line: what the description holds and what this process may
/// use.
fn summary(t: &Topology) -> String {
    let nodes: Vec<String> = t.allowed.numa_nodes.iter().map(u32::to_string).collect();
    format!(
        "{}: {} package(s), {} NUMA node(s), {} GPU(s); this process may use CPUs {} and nodes {}\n\n",
        t.source,
        t.packages.len(),
        t.numa_nodes.len(),
        t.gpus.len(),
        if t.allowed.cpus.is_empty() { "-".into() } else { t.allowed.cpus.to_string() },
        if nodes.is_empty() { "-".into() } else { nodes.join(",") },
    )
}

fn gpu_table(t: &Topology) -> String {
    let mut g = Table::new([
        "GPU",
        "CUDA",
        "BUS ID",
        "NAME",
        "NODE",
        "PKG",
        "LOCAL CPUS",
        "PCIE",
    ]);
    for gpu in &t.gpus {
        g.row([
            gpu.index.to_string(),
            opt(gpu.cuda_ordinal, "-"),
            gpu.pci_bus_id.clone(),
            gpu.name.clone().unwrap_or_else(|| "-".into()),
            opt(gpu.numa_node, "unknown"),
            opt(gpu.package, "?"),
            gpu.local_cpus.to_string(),
            pcie(&gpu.pcie),
        ]);
    }
    g.render()
}

fn node_table(t: &Topology) -> String {
    let mut n = Table::new(["NODE", "PKG", "CPUS", "MEMORY", "KIND", "DISTANCES"]);
    for node in &t.numa_nodes {
        n.row([
            node.os_index.to_string(),
            opt(node.package, "?"),
            if node.cpus.is_empty() {
                "-".into()
            } else {
                node.cpus.to_string()
            },
            if node.memory_bytes == 0 {
                "-".into()
            } else {
                bytes(node.memory_bytes)
            },
            match node.kind {
                NodeKind::Normal => "",
                NodeKind::Cpuless => "no CPUs",
                NodeKind::Memoryless => "no memory",
                NodeKind::GpuMemory => "GPU memory",
            }
            .to_string(),
            node.distances
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(" "),
        ]);
    }
    n.render()
}

fn package_table(t: &Topology) -> String {
    let mut p = Table::new(["PKG", "CPUS", "NODES", "CORES"]);
    for pkg in &t.packages {
        let cores = t
            .cores
            .iter()
            .filter(|c| c.cpus.is_subset(&pkg.cpus))
            .count();
        p.row([
            pkg.index.to_string(),
            pkg.cpus.to_string(),
            pkg.numa_nodes
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
            if t.cores.is_empty() {
                "?".into()
            } else {
                cores.to_string()
            },
        ]);
    }
    p.render()
}

/// The CUDA line: the driver, the variables and each ordinal's GPU.
fn cuda_line(t: &Topology) -> String {
    let driver = t
        .cuda
        .driver_version
        .map_or("no CUDA driver".to_string(), |v| {
            format!("CUDA driver {}.{}", v / 1000, (v % 1000) / 10)
        });
    let cvd = t
        .cuda
        .visible_devices
        .as_deref()
        .map_or("unset".to_string(), crate::report::quote);
    let map: Vec<String> = t
        .cuda
        .ordinals
        .iter()
        .map(|e| {
            format!(
                "{}->{}{}",
                e.ordinal,
                opt(e.gpu, "?"),
                if e.mig { " (MIG)" } else { "" }
            )
        })
        .collect();
    format!(
        "{driver}; CUDA_VISIBLE_DEVICES {cvd}; order {}; ordinals (CUDA->GPU, {}): {}\n",
        t.cuda.device_order,
        t.cuda.ordinal_source,
        if map.is_empty() {
            "none".into()
        } else {
            map.join(" ")
        }
    )
}

/// How two GPUs relate through the host: the path a peer copy staged in
/// host memory, or a thread serving both, would take.
fn relation(t: &Topology, a: &super::Gpu, b: &super::Gpu) -> &'static str {
    if a.index == b.index {
        return "X";
    }
    match (a.numa_node, b.numa_node, a.package, b.package) {
        (Some(x), Some(y), _, _) if x == y => "NODE",
        (_, _, Some(p), Some(q)) if p != q => "SYS",
        (Some(_), Some(_), Some(p), Some(q)) if p == q => "SOCK",
        (Some(_), Some(_), _, _) if t.packages.is_empty() => "NUMA",
        _ => "?",
    }
}

/// A GPU-by-GPU matrix of host-side locality, as `nvidia-smi topo -m`
/// shows its link matrix, with a column per NIC: the PCI path to it.
fn matrix(t: &Topology) -> String {
    let mut header = vec![String::new()];
    header.extend(t.gpus.iter().map(|g| format!("GPU{}", g.index)));
    header.extend((0..t.nics.len()).map(|i| format!("NIC{i}")));
    let mut m = Table::new(header);
    for a in &t.gpus {
        let mut row = vec![format!("GPU{}", a.index)];
        row.extend(t.gpus.iter().map(|b| relation(t, a, b).to_string()));
        row.extend(t.nics.iter().map(|n| n.relation_to(a.index).to_string()));
        m.row(row);
    }
    let mut s = m.render();
    if t.gpus.len() > 1 {
        s.push_str("NODE = same NUMA node, SOCK = same socket but another node, SYS = other socket, NUMA = other node (socket unknown), ? = locality unknown\n");
    }
    if !t.nics.is_empty() {
        s.push_str("GPU-NIC: PIX = through one PCIe switch, PXB = several switches, PHB = the PCIe host bridge, NODE = another host bridge of the same NUMA node, SOCK = another node of the same socket, SYS = the other socket or locality unknown\n");
    }
    s
}

/// The NIC and storage tables (nothing when there are none). A NIC's GPUS
/// are those [`Topology::nic_pairing`] gives it.
fn devices(t: &Topology) -> String {
    let mut out = String::new();
    let pairing = t.nic_pairing();
    for (title, list) in [("NIC", &t.nics), ("STORAGE", &t.storage)] {
        if list.is_empty() {
            continue;
        }
        let mut header = vec![title, "BUS ID", "KIND", "NAMES", "NODE", "PKG", "PCIE"];
        if title == "NIC" && !t.gpus.is_empty() {
            header.push("GPUS");
        }
        let mut tab = Table::new(header);
        for (i, d) in list.iter().enumerate() {
            let mut row = vec![
                i.to_string(),
                d.pci_bus_id.clone().unwrap_or_else(|| "-".into()),
                d.kind.to_string(),
                if d.names.is_empty() {
                    "-".into()
                } else {
                    d.names.join(",")
                },
                opt(d.numa_node, "unknown"),
                opt(d.package, "?"),
                pcie(&d.pcie),
            ];
            if title == "NIC" && !t.gpus.is_empty() {
                let gpus: Vec<String> = pairing
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.iter().any(|c| c.nic == i))
                    .map(|(g, _)| g.to_string())
                    .collect();
                row.push(if gpus.is_empty() {
                    "-".into()
                } else {
                    gpus.join(",")
                });
            }
            tab.row(row);
        }
        out.push_str(&tab.render());
        if title == "NIC" && !t.gpus.is_empty() {
            out.push_str("GPUS = the GPUs each NIC is paired with (each GPU's nearest NICs, shared evenly; `numapin affinity` gives them per rank)\n");
        }
        out.push('\n');
    }
    out
}
