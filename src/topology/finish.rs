//! From a reader's raw description to a [`Topology`]: CUDA ordinals and the
//! warnings a person should read.

use super::visible::{DeviceOrder, VisibleDevices, VisibleEntry};
use super::Result;
use super::{
    CudaInfo, Gpu, ProbeOptions, RawGpu, RawTopology, Topology, Warning, WarningKind,
    SCHEMA_VERSION,
};
use crate::cpulist::CpuList;
use crate::gpu::{CudaOrdinal, GpuIndex};
use crate::platform::cuda::Enumeration;

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
    let all_cpus = {
        let mut all = CpuList::new();
        for n in &raw.numa_nodes {
            all = all.union(&n.cpus);
        }
        for p in &raw.packages {
            all = all.union(&p.cpus);
        }
        all
    };
    let cpu_nodes = raw.numa_nodes.iter().filter(|n| !n.cpus.is_empty()).count();

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
            for d in &devices {
                let pos = match raw.gpus.iter().position(|g| g.pci_bus_id == d.pci_bus_id) {
                    Some(p) => p,
                    None => {
                        // The driver sees a device hwloc does not (no PCI
                        // sysfs in some containers): report it, locality
                        // unknown unless the machine has one node.
                        warnings.push(Warning {
                            kind: WarningKind::UnmatchedCudaDevice,
                            gpu: None,
                            message: format!(
                                "CUDA device {} ({}) has no PCI device in hwloc's view of this machine (is /sys/bus/pci visible?): its locality is unknown",
                                d.ordinal, d.pci_bus_id
                            ),
                        });
                        let single = (cpu_nodes == 1)
                            .then(|| {
                                raw.numa_nodes
                                    .iter()
                                    .find(|n| !n.cpus.is_empty())
                                    .map(|n| n.os_index)
                            })
                            .flatten();
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
                };
                let g = &mut raw.gpus[pos];
                g.name = Some(d.name.clone());
                if g.uuid.is_none() {
                    g.uuid = Some(d.uuid.clone());
                }
            }
            // Positions may have moved while inserting: map by bus id now.
            let tokens = visible
                .as_ref()
                .map(|v| v.tokens.clone())
                .unwrap_or_default();
            for d in &devices {
                let gpu = raw
                    .gpus
                    .iter()
                    .position(|g| g.pci_bus_id == d.pci_bus_id)
                    .map(|p| GpuIndex(p as u32));
                let mig = devices
                    .iter()
                    .filter(|o| o.pci_bus_id == d.pci_bus_id)
                    .count()
                    > 1
                    || tokens
                        .get(d.ordinal as usize)
                        .is_some_and(|(t, _)| t.to_ascii_uppercase().starts_with("MIG-"));
                let entry = match &visible {
                    Some(_) => tokens
                        .get(d.ordinal as usize)
                        .map(|(t, _)| t.clone())
                        .unwrap_or_else(|| "?".into()),
                    None => "*".into(),
                };
                cuda_info.ordinals.push(VisibleEntry {
                    ordinal: CudaOrdinal(d.ordinal),
                    entry,
                    gpu,
                    mig,
                });
            }
            if let Some(v) = &visible {
                if v.tokens.is_empty() {
                    warnings.push(Warning {
                        kind: WarningKind::CudaVisibleDevices,
                        gpu: None,
                        message: format!(
                            "CUDA_VISIBLE_DEVICES={} hides every GPU from CUDA",
                            crate::report::quote(&v.raw)
                        ),
                    });
                }
            }
        }
        other => {
            let nvidia = raw.gpus.iter().filter(|g| g.vendor == 0x10de).count();
            if live && nvidia > 0 {
                let why = match other {
                    Some(Enumeration::Unavailable(why)) => why,
                    _ => "not loaded".into(),
                };
                warnings.push(Warning {
                    kind: WarningKind::CudaUnavailable,
                    gpu: None,
                    message: format!(
                        "the CUDA driver is unavailable ({why}): GPU names and UUIDs are unknown and CUDA ordinals are assumed from PCI bus order"
                    ),
                });
            }
            cuda_info.ordinal_source = if raw.gpus.is_empty() {
                "none".into()
            } else {
                "pci_order".into()
            };
            // CUDA's order without the driver: PCI order for PCI_BUS_ID; for
            // FASTEST_FIRST, identical GPUs also enumerate in PCI order.
            let pci_order: Vec<u32> = (0..raw.gpus.len() as u32).collect();
            if order == DeviceOrder::FastestFirst {
                let mut models: Vec<u16> = raw.gpus.iter().map(|g| g.device).collect();
                models.sort_unstable();
                models.dedup();
                if models.len() > 1 {
                    warnings.push(Warning {
                        kind: WarningKind::CudaVisibleDevices,
                        gpu: None,
                        message: "GPUs of different models and CUDA_DEVICE_ORDER=FASTEST_FIRST: without the driver, CUDA ordinals are a guess in PCI order (set CUDA_DEVICE_ORDER=PCI_BUS_ID to make them certain)".into(),
                    });
                }
            }
            let uuids: Vec<Option<String>> = raw.gpus.iter().map(|g| g.uuid.clone()).collect();
            match &visible {
                Some(v) => {
                    let (entries, notes) = v.resolve(&pci_order, &uuids)?;
                    for n in notes {
                        warnings.push(Warning {
                            kind: WarningKind::CudaVisibleDevices,
                            gpu: None,
                            message: n,
                        });
                    }
                    if v.tokens.is_empty() {
                        warnings.push(Warning {
                            kind: WarningKind::CudaVisibleDevices,
                            gpu: None,
                            message: format!(
                                "CUDA_VISIBLE_DEVICES={:?} hides every GPU from CUDA",
                                v.raw
                            ),
                        });
                    }
                    cuda_info.ordinals = entries;
                }
                None => {
                    cuda_info.ordinals = pci_order
                        .iter()
                        .map(|&g| VisibleEntry {
                            ordinal: CudaOrdinal(g),
                            entry: "*".into(),
                            gpu: Some(GpuIndex(g)),
                            mig: false,
                        })
                        .collect();
                }
            }
        }
    }

    let gpus: Vec<Gpu> = raw
        .gpus
        .into_iter()
        .enumerate()
        .map(|(i, g)| Gpu {
            index: GpuIndex(i as u32),
            cuda_ordinal: cuda_info
                .ordinals
                .iter()
                .find(|e| e.gpu == Some(GpuIndex(i as u32)))
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
        .collect();

    for g in &gpus {
        let label = format!("GPU {} ({})", g.index, g.pci_bus_id);
        if g.numa_node.is_none() && raw.numa_nodes.len() > 1 {
            let spans = if g.local_cpus.is_empty() || g.local_cpus == all_cpus {
                "hangs off the whole machine".to_string()
            } else {
                format!(
                    "is near CPUs {} which span several NUMA nodes",
                    g.local_cpus
                )
            };
            warnings.push(Warning {
                kind: WarningKind::GpuLocalityUnknown,
                gpu: Some(g.index),
                message: format!(
                    "{label} {spans}: the firmware gives no NUMA node for it (sysfs numa_node = -1, common on cloud VMs), so its node is unknown and numapin will not guess node 0. On bare metal enable ACPI NUMA/SRAT proximity information in the firmware; on a VM choose an instance type that exposes it"
                ),
            });
            continue;
        }
        if g.local_cpus.is_empty() {
            continue;
        }
        let excluded = g.local_cpus.difference(&raw.allowed.cpus);
        if excluded == g.local_cpus {
            warnings.push(Warning {
                kind: WarningKind::GpuCpusExcluded,
                gpu: Some(g.index),
                message: format!(
                    "{label}: none of its local CPUs ({}) are allowed to this process (allowed: {}); threads feeding it will cross the socket link. Check the job's cgroup/cpuset (Slurm --cpu-bind, docker --cpuset-cpus) or taskset",
                    g.local_cpus,
                    if raw.allowed.cpus.is_empty() { "none".to_string() } else { raw.allowed.cpus.to_string() }
                ),
            });
        } else if !excluded.is_empty() {
            warnings.push(Warning {
                kind: WarningKind::GpuCpusPartlyExcluded,
                gpu: Some(g.index),
                message: format!(
                    "{label}: {} of its {} local CPUs are not allowed to this process (excluded: {excluded})",
                    excluded.len(),
                    g.local_cpus.len()
                ),
            });
        }
        if let Some(n) = g.numa_node {
            if !raw.allowed.numa_nodes.is_empty() && !raw.allowed.numa_nodes.contains(&n) {
                warnings.push(Warning {
                    kind: WarningKind::GpuNodeExcluded,
                    gpu: Some(g.index),
                    message: format!(
                        "{label}: its NUMA node {n} is not among the nodes this process may allocate on ({:?}); its buffers cannot be local",
                        raw.allowed.numa_nodes
                    ),
                });
            }
        }
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
