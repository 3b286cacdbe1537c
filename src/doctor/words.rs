//! What the checks share: how GPUs, NICs and node lists are named in
//! evidence sentences, and the one-check-per-GPU pattern.

use super::check::Check;
use crate::cpulist::CpuList;
use crate::topology::{Gpu, PcieLink, Topology};

/// PCI vendor id of NVIDIA.
pub(super) const NVIDIA: &str = "0x10de";

/// `GPU 0 (0000:07:00.0)`.
pub(super) fn label(g: &Gpu) -> String {
    format!("GPU {} ({})", g.index, g.pci_bus_id)
}

pub(super) fn is_nvidia(g: &Gpu) -> bool {
    g.vendor_id.eq_ignore_ascii_case(NVIDIA)
}

pub(super) fn multi_node(t: &Topology) -> bool {
    t.numa_nodes.len() > 1
}

/// Whether the topology is this machine's (probed live).
pub(super) fn live(t: &Topology) -> bool {
    t.source == "live"
}

/// Who the allowed sets belong to, for evidence sentences.
pub(super) fn whose(t: &Topology) -> String {
    if live(t) {
        "this process".into()
    } else {
        format!("the process that recorded {}", t.source)
    }
}

/// `0-3,8`, or `none`.
pub(super) fn list(nodes: &[u32]) -> String {
    if nodes.is_empty() {
        "none".into()
    } else {
        nodes.iter().copied().collect::<CpuList>().to_string()
    }
}

/// `node 3`, `nodes 0-3`, `no node`.
pub(super) fn nodes_text(nodes: &[u32]) -> String {
    match nodes.len() {
        0 => "no node".into(),
        1 => format!("node {}", nodes[0]),
        _ => format!("nodes {}", list(nodes)),
    }
}

/// The single `ok` of a GPU check on a machine without GPUs.
pub(super) fn no_gpus(name: &'static str, what: &str) -> Check {
    Check::ok(name, format!("no GPUs found: {what}"))
}

/// The GPUs this process sees (those with a CUDA ordinal).
pub(super) fn visible_gpus(t: &Topology) -> impl Iterator<Item = &Gpu> {
    t.gpus.iter().filter(|g| g.cuda_ordinal.is_some())
}

/// The nodes of the GPUs this process sees, sorted, without repeats.
pub(super) fn visible_gpu_nodes(t: &Topology) -> Vec<u32> {
    let mut nodes: Vec<u32> = visible_gpus(t).filter_map(|g| g.numa_node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes
}

/// The nodes with memory that the process may use.
pub(super) fn memory_nodes(t: &Topology) -> Vec<u32> {
    t.numa_nodes
        .iter()
        .filter(|n| n.memory_bytes > 0)
        .filter(|n| t.allowed.numa_nodes.is_empty() || t.allowed.numa_nodes.contains(&n.os_index))
        .map(|n| n.os_index)
        .collect()
}

fn hidden(name: &'static str, g: &Gpu) -> Check {
    Check::ok(
        name,
        format!(
            "{}: not visible to this process (CUDA_VISIBLE_DEVICES), not checked",
            label(g)
        ),
    )
    .for_gpu(g.index)
}

/// One check per GPU (`f` given the GPU and its label, the GPU set on the
/// result), or one `ok` saying there is no GPU (`none` says what is then not
/// checked). With `visible_only`, GPUs hidden by `CUDA_VISIBLE_DEVICES` get
/// an `ok` saying they were not checked.
pub(super) fn per_gpu(
    t: &Topology,
    name: &'static str,
    none: &str,
    visible_only: bool,
    f: impl Fn(&Gpu, String) -> Check,
) -> Vec<Check> {
    if t.gpus.is_empty() {
        return vec![no_gpus(name, none)];
    }
    t.gpus
        .iter()
        .map(|g| {
            if visible_only && g.cuda_ordinal.is_none() {
                return hidden(name, g);
            }
            f(g, label(g)).for_gpu(g.index)
        })
        .collect()
}

/// `Gen4 x16`, `Gen4`, `x16`, `?`.
fn link_part(g: Option<u8>, w: Option<u8>) -> String {
    match (g, w) {
        (Some(g), Some(w)) => format!("Gen{g} x{w}"),
        (Some(g), None) => format!("Gen{g}"),
        (None, Some(w)) => format!("x{w}"),
        (None, None) => "?".into(),
    }
}

/// A device's PCIe link as the link checks compare it.
pub(super) struct Link<'a> {
    /// The link.
    pub(super) pcie: &'a PcieLink,
    /// Now: `Gen4 x16`.
    pub(super) now: String,
    /// Its maximum: `Gen5 x16`.
    pub(super) max: String,
    /// Fewer lanes than its maximum.
    pub(super) narrow: bool,
    /// A lower generation than its maximum.
    pub(super) slow: bool,
}

/// The link of the device labelled `l`, or, when its generation and width
/// are not reported, check `name`'s `ok` saying so.
pub(super) fn link<'a>(
    t: &Topology,
    name: &'static str,
    l: &str,
    pcie: Option<&'a PcieLink>,
) -> Result<Link<'a>, Check> {
    let Some(p) = pcie.filter(|p| p.current_gen.is_some() || p.current_width.is_some()) else {
        let by = if live(t) { "sysfs" } else { t.source.as_str() };
        return Err(Check::ok(
            name,
            format!("{l}: link generation and width not reported by {by} (nothing to compare)"),
        ));
    };
    Ok(Link {
        pcie: p,
        now: link_part(p.current_gen, p.current_width),
        max: link_part(p.max_gen, p.max_width),
        narrow: matches!((p.current_width, p.max_width), (Some(c), Some(m)) if c < m),
        slow: matches!((p.current_gen, p.max_gen), (Some(c), Some(m)) if c < m),
    })
}
