//! From a reader's raw description to a [`Topology`]: CUDA ordinals and the
//! warnings a person should read.
//!
//! [`finish`] runs the steps in order: the description is checked for
//! contradictions, the CUDA variables are read, the ordinals come from the
//! driver ([`driver_ordinals`]) or are assumed from PCI order
//! ([`assumed_ordinals`]), the GPUs are numbered, and each GPU gets the
//! warnings about its locality and what this process may use of it.

use super::visible::{DeviceOrder, VisibleDevices, VisibleEntry};
use super::Result;
use super::{
    Allowed, CudaInfo, Gpu, NodeKind, NumaNode, ProbeOptions, RawGpu, RawTopology, Topology,
    Warning, WarningKind, SCHEMA_VERSION,
};
use crate::cpulist::CpuList;
use crate::gpu::{CudaOrdinal, GpuIndex};
use crate::num::u32_saturating;
use crate::platform::cuda::{CudaDevice, Enumeration};

/// `raw` finished: `cuda` is what the driver said (live probe only), `live`
/// whether `raw` describes this machine.
pub(crate) fn finish(
    mut raw: RawTopology,
    source: String,
    opts: &ProbeOptions,
    cuda: Option<Enumeration>,
    live: bool,
) -> Result<Topology> {
    check_consistent(&raw, &source)?;
    let order = DeviceOrder::from_env(opts.env.cuda_device_order.as_deref())?;
    let visible = match &opts.env.cuda_visible_devices {
        Some(v) => Some(VisibleDevices::parse(v)?),
        None => None,
    };
    let mut warnings = std::mem::take(&mut raw.warnings);
    let all_cpus = super::cpus_of_all(&raw.numa_nodes, &raw.packages);
    let mut cuda_info = CudaInfo {
        driver_version: None,
        ordinal_source: String::new(),
        visible_devices: opts.env.cuda_visible_devices.clone(),
        device_order: order.as_str().into(),
        ordinals: Vec::new(),
    };
    match cuda {
        Some(Enumeration::Devices {
            driver_version,
            devices,
        }) => {
            cuda_info.driver_version = Some(driver_version);
            cuda_info.ordinal_source = "driver".into();
            let ctx = Context {
                all_cpus: &all_cpus,
                visible: visible.as_ref(),
            };
            cuda_info.ordinals = driver_ordinals(&mut raw, &devices, ctx, &mut warnings);
        }
        other => {
            if live {
                warn_driver_unavailable(&raw.gpus, other, &mut warnings);
            }
            cuda_info.ordinal_source = if raw.gpus.is_empty() {
                "none"
            } else {
                "pci_order"
            }
            .into();
            cuda_info.ordinals =
                assumed_ordinals(&raw.gpus, order, visible.as_ref(), &mut warnings)?;
        }
    }
    let gpus = numbered(raw.gpus, &cuda_info.ordinals);
    let multi_node = raw.numa_nodes.len() > 1;
    for g in &gpus {
        gpu_warnings(g, multi_node, &raw.allowed, &all_cpus, &mut warnings);
    }
    let (nics, storage) = super::iodev::finish(raw.io, &gpus);
    Ok(Topology {
        schema_version: SCHEMA_VERSION,
        source,
        packages: raw.packages,
        numa_nodes: raw.numa_nodes,
        gpus,
        allowed: raw.allowed,
        warnings,
        cores: raw.cores,
        caches: raw.caches,
        cuda: cuda_info,
        nics,
        storage,
    })
}

/// With one node holding memory, every page of the machine is on it: some
/// VMs (memory plugged in after boot) give that node less in its sysfs
/// `meminfo`, which hwloc reads, than the machine's `MemTotal` (4.3 GiB of
/// 126 GiB on one GPU VM measured), and the budget, a share of the node's
/// memory, would be a share of that. The node's memory is then the
/// machine's `total` (less GPU memory nodes', which `MemTotal` counts where
/// they are online; `total` already less the huge page pools, as hwloc
/// counts a node's memory), with a warning saying so. A node short of
/// `total` by an eighth or less keeps its figure.
pub(crate) fn only_node_memory(nodes: &mut [NumaNode], total: Option<u64>) -> Option<Warning> {
    let gpu_memory: u64 = nodes
        .iter()
        .filter(|n| n.kind == NodeKind::GpuMemory)
        .map(|n| n.memory_bytes)
        .sum();
    let total = total?.checked_sub(gpu_memory)?;
    let mut with_memory = nodes
        .iter_mut()
        .filter(|n| n.memory_bytes > 0 && n.kind != NodeKind::GpuMemory);
    let node = with_memory.next()?;
    if with_memory.next().is_some() || node.memory_bytes >= total - total / 8 {
        return None;
    }
    let message = format!(
        "NUMA node {} reports {} of memory and the machine {} (/proc/meminfo MemTotal, less huge pages and GPU memory); as the only node with memory it holds all of it, so numapin counts {} for it (its budget is a share of that)",
        node.os_index,
        crate::report::table::bytes(node.memory_bytes),
        crate::report::table::bytes(total),
        crate::report::table::bytes(total),
    );
    node.memory_bytes = total;
    Some(warning(WarningKind::MissingInformation, None, message))
}

/// A warning of `kind`, about `gpu` if any.
fn warning(kind: WarningKind, gpu: Option<GpuIndex>, message: String) -> Warning {
    Warning { kind, gpu, message }
}

/// What the driver steps need besides the description.
#[derive(Clone, Copy)]
struct Context<'a> {
    all_cpus: &'a CpuList,
    visible: Option<&'a VisibleDevices>,
}

/// The ordinals as the driver enumerated them: each device matched to its
/// GPU by bus id (a device hwloc did not see is added, locality unknown),
/// named after the driver, and marked MIG when it is an instance.
fn driver_ordinals(
    raw: &mut RawTopology,
    devices: &[CudaDevice],
    ctx: Context<'_>,
    warnings: &mut Vec<Warning>,
) -> Vec<VisibleEntry> {
    for d in devices {
        let pos = match raw.gpus.iter().position(|g| g.pci_bus_id == d.pci_bus_id) {
            Some(p) => p,
            None => add_unmatched(raw, d, ctx.all_cpus, warnings),
        };
        let g = &mut raw.gpus[pos];
        g.name = Some(d.name.clone());
        if g.uuid.is_none() {
            g.uuid = Some(d.uuid.clone());
        }
    }
    // Positions may have moved while inserting: map by bus id now.
    let tokens = ctx.visible.map(|v| v.tokens.clone()).unwrap_or_default();
    let token = |d: &CudaDevice| tokens.get(d.ordinal as usize).map(|(t, _)| t);
    let entries = devices
        .iter()
        .map(|d| {
            let gpu = raw
                .gpus
                .iter()
                .position(|g| g.pci_bus_id == d.pci_bus_id)
                .map(|p| GpuIndex(u32_saturating(p)));
            let instances = devices.iter().filter(|o| o.pci_bus_id == d.pci_bus_id);
            let mig = instances.count() > 1
                || token(d).is_some_and(|t| t.to_ascii_uppercase().starts_with("MIG-"));
            let entry = match ctx.visible {
                Some(_) => token(d).cloned().unwrap_or_else(|| "?".into()),
                None => "*".into(),
            };
            VisibleEntry {
                ordinal: CudaOrdinal(d.ordinal),
                entry,
                gpu,
                mig,
            }
        })
        .collect();
    if let Some(v) = ctx.visible {
        if v.tokens.is_empty() {
            warnings.push(warning(
                WarningKind::CudaVisibleDevices,
                None,
                format!(
                    "CUDA_VISIBLE_DEVICES={} hides every GPU from CUDA",
                    crate::report::quote(&v.raw)
                ),
            ));
        }
    }
    entries
}

/// Adds a device the driver sees and hwloc does not (no PCI sysfs in some
/// containers), locality unknown unless the machine has one node; returns
/// its position.
fn add_unmatched(
    raw: &mut RawTopology,
    d: &CudaDevice,
    all_cpus: &CpuList,
    warnings: &mut Vec<Warning>,
) -> usize {
    warnings.push(warning(
        WarningKind::UnmatchedCudaDevice,
        None,
        format!(
            "CUDA device {} ({}) has no PCI device in hwloc's view of this machine (is /sys/bus/pci visible?): its locality is unknown",
            d.ordinal, d.pci_bus_id
        ),
    ));
    let mut with_cpus = raw.numa_nodes.iter().filter(|n| !n.cpus.is_empty());
    let single = match (with_cpus.next(), with_cpus.next()) {
        (Some(n), None) => Some(n.os_index),
        _ => None,
    };
    raw.gpus.push(RawGpu {
        pci_bus_id: d.pci_bus_id.clone(),
        vendor: 0x10de,
        class: 0x0302,
        numa_node: single,
        package: (raw.packages.len() == 1).then_some(0),
        local_cpus: all_cpus.clone(),
        ..Default::default()
    });
    raw.gpus.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
    raw.gpus
        .iter()
        .position(|g| g.pci_bus_id == d.pci_bus_id)
        .unwrap_or(0)
}

/// Warns that the driver could not be used on a machine with NVIDIA GPUs.
fn warn_driver_unavailable(
    gpus: &[RawGpu],
    cuda: Option<Enumeration>,
    warnings: &mut Vec<Warning>,
) {
    if !gpus.iter().any(|g| g.vendor == 0x10de) {
        return;
    }
    let why = match cuda {
        Some(Enumeration::Unavailable(why)) => why,
        _ => "not loaded".into(),
    };
    warnings.push(warning(
        WarningKind::CudaUnavailable,
        None,
        format!(
            "the CUDA driver is unavailable ({why}): GPU names and UUIDs are unknown and CUDA ordinals are assumed from PCI bus order"
        ),
    ));
}

/// CUDA's order without the driver: PCI order for `PCI_BUS_ID`; for
/// `FASTEST_FIRST`, identical GPUs also enumerate in PCI order (a warning
/// says so when the models differ). `CUDA_VISIBLE_DEVICES` then picks.
fn assumed_ordinals(
    gpus: &[RawGpu],
    order: DeviceOrder,
    visible: Option<&VisibleDevices>,
    warnings: &mut Vec<Warning>,
) -> Result<Vec<VisibleEntry>> {
    let pci_order: Vec<u32> = (0..u32_saturating(gpus.len())).collect();
    if order == DeviceOrder::FastestFirst {
        let mut models: Vec<u16> = gpus.iter().map(|g| g.device).collect();
        models.sort_unstable();
        models.dedup();
        if models.len() > 1 {
            warnings.push(warning(
                WarningKind::CudaVisibleDevices,
                None,
                "GPUs of different models and CUDA_DEVICE_ORDER=FASTEST_FIRST: without the driver, CUDA ordinals are a guess in PCI order (set CUDA_DEVICE_ORDER=PCI_BUS_ID to make them certain)".into(),
            ));
        }
    }
    let Some(v) = visible else {
        return Ok(pci_order
            .iter()
            .map(|&g| VisibleEntry {
                ordinal: CudaOrdinal(g),
                entry: "*".into(),
                gpu: Some(GpuIndex(g)),
                mig: false,
            })
            .collect());
    };
    let uuids: Vec<Option<String>> = gpus.iter().map(|g| g.uuid.clone()).collect();
    let (entries, notes) = v.resolve(&pci_order, &uuids)?;
    for n in notes {
        warnings.push(warning(WarningKind::CudaVisibleDevices, None, n));
    }
    if v.tokens.is_empty() {
        warnings.push(warning(
            WarningKind::CudaVisibleDevices,
            None,
            format!("CUDA_VISIBLE_DEVICES={:?} hides every GPU from CUDA", v.raw),
        ));
    }
    Ok(entries)
}

/// The GPUs in PCI order, numbered, each with the ordinal that maps to it.
fn numbered(gpus: Vec<RawGpu>, ordinals: &[VisibleEntry]) -> Vec<Gpu> {
    gpus.into_iter()
        .enumerate()
        .map(|(i, g)| Gpu {
            index: GpuIndex(u32_saturating(i)),
            cuda_ordinal: ordinals
                .iter()
                .find(|e| e.gpu == Some(GpuIndex(u32_saturating(i))))
                .map(|e| e.ordinal),
            pci_bus_id: g.pci_bus_id,
            name: g.name,
            uuid: g.uuid,
            numa_node: g.numa_node,
            package: g.package,
            local_cpus: g.local_cpus,
            pcie: g.pcie,
            vendor_id: format!("0x{:04x}", g.vendor),
            device_id: format!("0x{:04x}", g.device),
            class_id: format!("0x{:04x}", g.class),
        })
        .collect()
}

/// A GPU's warnings: its node unknown on a multi-node machine, or its
/// CPUs or node not (all) allowed to this process.
fn gpu_warnings(
    g: &Gpu,
    multi_node: bool,
    allowed: &Allowed,
    all_cpus: &CpuList,
    warnings: &mut Vec<Warning>,
) {
    let label = format!("GPU {} ({})", g.index, g.pci_bus_id);
    if g.numa_node.is_none() && multi_node {
        let spans = if g.local_cpus.is_empty() || g.local_cpus == *all_cpus {
            "hangs off the whole machine".to_string()
        } else {
            format!(
                "is near CPUs {} which span several NUMA nodes",
                g.local_cpus
            )
        };
        warnings.push(warning(
            WarningKind::GpuLocalityUnknown,
            Some(g.index),
            format!(
                "{label} {spans}: the firmware gives no NUMA node for it (sysfs numa_node = -1, common on cloud VMs), so its node is unknown and numapin will not guess node 0. On bare metal enable ACPI NUMA/SRAT proximity information in the firmware; on a VM choose an instance type that exposes it"
            ),
        ));
        return;
    }
    if g.local_cpus.is_empty() {
        return;
    }
    if let Some(w) = excluded_cpus_warning(g, &label, &allowed.cpus) {
        warnings.push(w);
    }
    if let Some(n) = g.numa_node {
        let nodes = &allowed.numa_nodes;
        if !nodes.is_empty() && !nodes.contains(&n) {
            warnings.push(warning(
                WarningKind::GpuNodeExcluded,
                Some(g.index),
                format!(
                    "{label}: its NUMA node {n} is not among the nodes this process may allocate on ({nodes:?}); its buffers cannot be local"
                ),
            ));
        }
    }
}

/// The warning for a GPU some or all of whose local CPUs are not allowed.
fn excluded_cpus_warning(g: &Gpu, label: &str, allowed: &CpuList) -> Option<Warning> {
    let excluded = g.local_cpus.difference(allowed);
    if excluded == g.local_cpus {
        Some(warning(
            WarningKind::GpuCpusExcluded,
            Some(g.index),
            format!(
                "{label}: none of its local CPUs ({}) are allowed to this process (allowed: {}); threads feeding it will cross the socket link. Check the job's cgroup/cpuset (Slurm --cpu-bind, docker --cpuset-cpus) or taskset",
                g.local_cpus,
                if allowed.is_empty() { "none".to_string() } else { allowed.to_string() }
            ),
        ))
    } else if !excluded.is_empty() {
        Some(warning(
            WarningKind::GpuCpusPartlyExcluded,
            Some(g.index),
            format!(
                "{label}: {} of its {} local CPUs are not allowed to this process (excluded: {excluded})",
                excluded.len(),
                g.local_cpus.len()
            ),
        ))
    } else {
        None
    }
}

/// Refuses descriptions that contradict themselves (a hand-edited or hostile
/// file): numapin's answers would be meaningless.
fn check_consistent(raw: &RawTopology, source: &str) -> Result<()> {
    let bad = |problem: String| {
        super::TopologyError::input(
            source,
            format!("the file is malformed: {problem}"),
            "give an unmodified export (`lstopo --of xml`, `numapin topo --export`) or capture",
        )
    };
    let mut seen = std::collections::BTreeSet::new();
    for n in &raw.numa_nodes {
        if !seen.insert(n.os_index) {
            return Err(bad(format!("two NUMA nodes are numbered {}", n.os_index)));
        }
    }
    let mut owner = std::collections::HashMap::new();
    for n in &raw.numa_nodes {
        for c in n.cpus.iter() {
            if let Some(other) = owner.insert(c, n.os_index) {
                return Err(bad(format!(
                    "NUMA nodes {other} and {} share CPU {c}",
                    n.os_index
                )));
            }
        }
    }
    let mut buses = std::collections::BTreeSet::new();
    for g in &raw.gpus {
        if !buses.insert(g.pci_bus_id.as_str()) {
            return Err(bad(format!("two devices have PCI bus id {}", g.pci_bus_id)));
        }
    }
    Ok(())
}
