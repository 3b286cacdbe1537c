//! The checks, as pure functions of the topology and of the live state they
//! are given (see `docs/doctor.md` for the rules in prose).
//!
//! Checks about GPUs give one [`Check`] per GPU (with [`Check::gpu`] set),
//! or a single `ok` one saying there is no GPU, so every check name appears
//! in every report.

use super::system::{iommu_params, mempolicy_name, selected, DriverState, IommuView};
use super::Check;
use numapin::internals::fmt_bytes;
use numapin::runtime::DEFAULT_REGION_BYTES;
use numapin::topology::{Gpu, Relation, Topology, WarningKind};
use numapin::CpuList;

/// PCI vendor id of NVIDIA.
const NVIDIA: &str = "0x10de";

fn label(g: &Gpu) -> String {
    format!("GPU {} ({})", g.index, g.pci_bus_id)
}

fn is_nvidia(g: &Gpu) -> bool {
    g.vendor_id.eq_ignore_ascii_case(NVIDIA)
}

fn multi_node(t: &Topology) -> bool {
    t.numa_nodes.len() > 1
}

fn live(t: &Topology) -> bool {
    t.source == "live"
}

/// Who the allowed sets belong to, for evidence sentences.
fn whose(t: &Topology) -> String {
    if live(t) {
        "this process".into()
    } else {
        format!("the process that recorded {}", t.source)
    }
}

fn list(nodes: &[u32]) -> String {
    if nodes.is_empty() {
        "none".into()
    } else {
        nodes.iter().copied().collect::<CpuList>().to_string()
    }
}

/// `node 3`, `nodes 0-3`, `no node`.
fn nodes_text(nodes: &[u32]) -> String {
    match nodes.len() {
        0 => "no node".into(),
        1 => format!("node {}", nodes[0]),
        _ => format!("nodes {}", list(nodes)),
    }
}

fn no_gpus(name: &'static str, what: &str) -> Check {
    Check::ok(name, format!("no GPUs found: {what}"))
}

/// The GPUs this process sees (those with a CUDA ordinal).
fn visible_gpus(t: &Topology) -> impl Iterator<Item = &Gpu> {
    t.gpus.iter().filter(|g| g.cuda_ordinal.is_some())
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
fn per_gpu(
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

/// What numapin needs locked, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MemlockNeed {
    /// Bytes.
    pub(crate) bytes: u64,
    /// How many default arena regions that is.
    pub(crate) regions: u64,
    /// The sentence that says where the number comes from.
    pub(crate) basis: String,
}

/// What numapin needs RLIMIT_MEMLOCK to allow: one default arena region
/// ([`DEFAULT_REGION_BYTES`], 256 MiB) on each NUMA node that holds a GPU
/// this process sees (plus one for GPUs whose node is unknown); with no
/// visible GPU, one on each node with memory this process may use. That is
/// what the first pinned buffer on each of those nodes takes.
pub(super) fn memlock_need(t: &Topology) -> MemlockNeed {
    let region = fmt_bytes(DEFAULT_REGION_BYTES as u64);
    let mut gpu_nodes: Vec<u32> = visible_gpus(t).filter_map(|g| g.numa_node).collect();
    gpu_nodes.sort_unstable();
    gpu_nodes.dedup();
    let unknown = visible_gpus(t).filter(|g| g.numa_node.is_none()).count();
    let (regions, basis) = if gpu_nodes.is_empty() && unknown == 0 {
        let nodes: Vec<u32> = t
            .numa_nodes
            .iter()
            .filter(|n| n.memory_bytes > 0)
            .filter(|n| {
                t.allowed.numa_nodes.is_empty() || t.allowed.numa_nodes.contains(&n.os_index)
            })
            .map(|n| n.os_index)
            .collect();
        (
            nodes.len().max(1) as u64,
            format!(
                "one {region} arena region on each node with memory ({}; no GPU visible)",
                nodes_text(&nodes)
            ),
        )
    } else {
        let mut basis = format!(
            "one {region} arena region on each node with a GPU ({})",
            nodes_text(&gpu_nodes)
        );
        if unknown > 0 {
            basis.push_str(&format!(
                " and one for the {unknown} GPU(s) whose node is unknown"
            ));
        }
        (gpu_nodes.len() as u64 + u64::from(unknown > 0), basis)
    };
    MemlockNeed {
        bytes: regions * DEFAULT_REGION_BYTES as u64,
        regions,
        basis,
    }
}

/// RLIMIT_MEMLOCK (soft, hard) and CAP_IPC_LOCK against [`memlock_need`].
///
/// `ok` with CAP_IPC_LOCK (the limit does not apply), an unlimited soft
/// limit, or a soft limit at least the need; below it, `fail` without the
/// CUDA driver (the arena checks the soft limit before locking, so the
/// first buffer on a node fails) and `warn` with it (`driver`: regions
/// are then pinned by CUDA registration alone, which the limit does not
/// cover); `warn` when the limit cannot be read.
pub(super) fn memlock(
    t: &Topology,
    limit: &Result<(u64, u64), String>,
    cap_ipc_lock: bool,
    driver: bool,
) -> Check {
    const NAME: &str = "memlock";
    let need = memlock_need(t);
    let (soft, hard) = match limit {
        Ok(l) => *l,
        Err(e) => {
            return Check::warn(
                NAME,
                format!("cannot read RLIMIT_MEMLOCK: {e}"),
                "check the limit with `ulimit -l` in the shell that starts the job",
            )
        }
    };
    let evidence = format!(
        "RLIMIT_MEMLOCK soft {}, hard {}; {}; numapin needs {}: {}",
        fmt_bytes(soft),
        fmt_bytes(hard),
        if cap_ipc_lock {
            "CAP_IPC_LOCK (the limit does not apply)"
        } else {
            "no CAP_IPC_LOCK"
        },
        fmt_bytes(need.bytes),
        need.basis
    );
    if cap_ipc_lock || soft >= need.bytes {
        return Check::ok(NAME, evidence);
    }
    let kib = need.bytes / 1024;
    let hard_note = if hard < need.bytes {
        format!(
            " (the hard limit, {}, is too low as well: raise it as root first, e.g. `* - memlock unlimited` in /etc/security/limits.conf, then log in again)",
            fmt_bytes(hard)
        )
    } else {
        String::new()
    };
    let fix = format!(
        "raise the memlock limit of the process to at least {kib} KiB (unlimited is usual on GPU servers): `ulimit -l unlimited` (or `ulimit -l {kib}`) in the shell that starts it{hard_note}; `LimitMEMLOCK=infinity` in its systemd unit; `docker run --ulimit memlock=-1` for a container; or give the process CAP_IPC_LOCK"
    );
    if driver {
        return Check::warn(
            NAME,
            format!("{evidence}; below it, arena regions are not locked: CUDA registration pins them (the driver's pins do not count against RLIMIT_MEMLOCK)"),
            fix,
        );
    }
    Check::fail(NAME, evidence, fix)
}

fn driver_version_text(v: u32) -> String {
    format!("{}.{} ({v})", v / 1000, v % 1000 / 10)
}

/// The CUDA driver. `ok` when loaded; when it is not: `fail` if the machine
/// has NVIDIA GPUs, `warn` if they exist but the driver was deliberately
/// not loaded (`--no-cuda`, `NUMAPIN_NO_CUDA`), `ok` (saying so) with no
/// NVIDIA GPU.
pub(super) fn cuda_driver(t: &Topology, state: &DriverState) -> Check {
    const NAME: &str = "cuda_driver";
    let nvidia = t.gpus.iter().filter(|g| is_nvidia(g)).count();
    let gpus = format!("{nvidia} NVIDIA GPU(s) on the PCI bus");
    match state {
        DriverState::Loaded(v) => Check::ok(
            NAME,
            format!("CUDA driver {} loaded; {gpus}", driver_version_text(*v)),
        ),
        DriverState::NotLoaded if nvidia == 0 => Check::ok(
            NAME,
            "no CUDA driver loaded (--no-cuda) and no NVIDIA GPU found: none is needed",
        ),
        DriverState::NotLoaded => Check::warn(
            NAME,
            format!("CUDA driver not loaded (--no-cuda), not checked; {gpus}"),
            "run `numapin doctor` without --no-cuda to check the driver",
        ),
        DriverState::Unavailable(why) if nvidia == 0 => Check::ok(
            NAME,
            format!("no CUDA driver ({why}); no NVIDIA GPU found, so none is needed"),
        ),
        DriverState::Unavailable(why) if why.contains("NUMAPIN_NO_CUDA") => Check::warn(
            NAME,
            format!("no CUDA driver ({why}), not checked; {gpus}"),
            "unset NUMAPIN_NO_CUDA to check the driver",
        ),
        DriverState::Unavailable(why) => Check::fail(
            NAME,
            format!("no CUDA driver ({why}); {gpus}"),
            "install the NVIDIA driver for these GPUs (`nvidia-smi` must list them); if it is installed, make libcuda.so findable (ldconfig, LD_LIBRARY_PATH); in a container, start it with the NVIDIA container toolkit (`--gpus all`)",
        ),
    }
}

/// Each GPU against the CUDA ordinals (`gpu_visible`), and the topology's
/// notes about `CUDA_VISIBLE_DEVICES` and CUDA devices without a PCI device
/// (`cuda_visible_devices`, `warn`).
///
/// Per GPU: `ok` when it has a CUDA ordinal from the driver, or is hidden by
/// `CUDA_VISIBLE_DEVICES`; `fail` when the driver enumerated devices and
/// this NVIDIA GPU is not among them with nothing hiding it; without the
/// driver on this machine, `warn` for an NVIDIA GPU (not checked) and `ok`
/// for other accelerators; for a saved machine without driver information,
/// `ok` saying it was not recorded.
pub(super) fn gpu_visibility(t: &Topology) -> Vec<Check> {
    const NAME: &str = "gpu_visible";
    let mut out = Vec::new();
    if t.gpus.is_empty() {
        out.push(no_gpus(
            NAME,
            "no NVIDIA device (vendor 0x10de) or device named with --accelerator-pci-id on the PCI bus",
        ));
    }
    let from_driver = t.cuda.ordinal_source == "driver";
    for g in &t.gpus {
        let l = label(g);
        let name = g
            .name
            .as_deref()
            .map(|n| format!(", {n}"))
            .unwrap_or_default();
        let c = match (g.cuda_ordinal, from_driver) {
            (Some(o), true) => Check::ok(NAME, format!("{l}{name}: CUDA ordinal {o}")),
            (None, _) if t.cuda.visible_devices.is_some() => Check::ok(
                NAME,
                format!(
                    "{l}: hidden from this process by CUDA_VISIBLE_DEVICES={:?}",
                    t.cuda.visible_devices.as_deref().unwrap_or_default()
                ),
            ),
            (None, true) if is_nvidia(g) => Check::fail(
                NAME,
                format!(
                    "{l}: on the PCI bus but the CUDA driver does not list it ({} device(s) listed)",
                    t.cuda.ordinals.len()
                ),
                format!(
                    "look for Xid errors or \"fallen off the bus\" in `dmesg` and check `nvidia-smi`; a GPU the driver cannot initialise is left out of CUDA (reset it with `nvidia-smi -r -i {}` or power-cycle the machine); check it is not bound to vfio-pci (`lspci -k -s {}`)",
                    g.pci_bus_id, g.pci_bus_id
                ),
            ),
            (None, true) => Check::ok(
                NAME,
                format!(
                    "{l}: not an NVIDIA device (vendor {}), so not a CUDA device",
                    g.vendor_id
                ),
            ),
            (o, false) => {
                let assumed = o
                    .map(|o| format!("CUDA ordinal {o} assumed from PCI order"))
                    .unwrap_or_else(|| "no CUDA ordinal".into());
                if !is_nvidia(g) {
                    Check::ok(
                        NAME,
                        format!(
                            "{l}: not an NVIDIA device (vendor {}); {assumed}",
                            g.vendor_id
                        ),
                    )
                } else if live(t) {
                    Check::warn(
                        NAME,
                        format!("{l}: not checked, the CUDA driver was not loaded; {assumed}"),
                        "make the CUDA driver loadable (see the cuda_driver check) to check that CUDA sees every GPU",
                    )
                } else {
                    Check::ok(
                        NAME,
                        format!("{l}: {} records no CUDA driver enumeration; {assumed}", t.source),
                    )
                }
            }
        };
        out.push(c.for_gpu(g.index));
    }
    for w in &t.warnings {
        let fix = match w.kind {
            WarningKind::CudaVisibleDevices => "check CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER against `numapin topo` (ordinals, UUIDs, MIG instances)",
            WarningKind::UnmatchedCudaDevice => "make the PCI devices visible to this process (a container that masks /sys/bus/pci hides them) so each GPU's locality can be read",
            _ => continue,
        };
        let mut c = Check::warn("cuda_visible_devices", w.message.clone(), fix);
        c.gpu = w.gpu;
        out.push(c);
    }
    out
}

fn link_part(g: Option<u8>, w: Option<u8>) -> String {
    match (g, w) {
        (Some(g), Some(w)) => format!("Gen{g} x{w}"),
        (Some(g), None) => format!("Gen{g}"),
        (None, Some(w)) => format!("x{w}"),
        (None, None) => "?".into(),
    }
}

/// Each GPU's PCIe link against its maximum (`pcie_link`).
///
/// * narrower than its maximum width: `fail`. The width is negotiated when
///   the link trains and does not drop for power saving, so a narrow link
///   is a fault (seating, riser, slot wiring, bifurcation) and caps every
///   copy at the fraction of lanes left;
/// * slower generation at full width: `warn`. GPUs (NVIDIA's in particular)
///   lower the link speed when idle, so this is normal at rest; the fix says
///   how to look under load;
/// * at its maximum, or link state not reported: `ok`.
pub(super) fn pcie_links(t: &Topology) -> Vec<Check> {
    const NAME: &str = "pcie_link";
    per_gpu(t, NAME, "no PCIe link to check", false, |g, l| {
        let Some(p) = g
            .pcie
            .as_ref()
            .filter(|p| p.current_gen.is_some() || p.current_width.is_some())
        else {
            return Check::ok(
                NAME,
                format!(
                    "{l}: link generation and width not reported by {} (nothing to compare)",
                    if live(t) { "sysfs" } else { t.source.as_str() }
                ),
            );
        };
        let now = link_part(p.current_gen, p.current_width);
        let max = link_part(p.max_gen, p.max_width);
        let narrow = matches!((p.current_width, p.max_width), (Some(c), Some(m)) if c < m);
        let slow = matches!((p.current_gen, p.max_gen), (Some(c), Some(m)) if c < m);
        let ev = format!("{l}: link running at {now}, maximum {max}");
        if narrow {
            let (c, m) = (p.current_width.unwrap_or(0), p.max_width.unwrap_or(1));
            Check::fail(
                NAME,
                format!(
                    "{ev}: {c} of {m} lanes, so at most {c}/{m} of the bandwidth{}",
                    if slow { ", and a lower generation" } else { "" }
                ),
                format!(
                    "the width is set when the link trains and does not drop when idle: reseat the GPU, check its riser or cable, check the slot is wired x{m} and the firmware's PCIe bifurcation setting, then reboot; `lspci -vv -s {}` shows LnkCap (maximum) and LnkSta (now)",
                    g.pci_bus_id
                ),
            )
        } else if slow {
            Check::warn(
                NAME,
                format!(
                    "{ev}: a lower generation than the maximum; GPUs lower the link speed when idle to save power, so this is expected while the GPU does nothing"
                ),
                format!(
                    "look while a copy runs (`numapin bench`, or any job): `nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.gen.max --format=csv -i {}` or `lspci -vv -s {}` (LnkSta); if it stays low under load, the slot, riser, root port or the firmware's PCIe speed setting limits it",
                    g.pci_bus_id, g.pci_bus_id
                ),
            )
        } else if p.max_gen.is_none() && p.max_width.is_none() {
            Check::ok(
                NAME,
                format!("{l}: link running at {now} (maximum not reported)"),
            )
        } else {
            Check::ok(NAME, format!("{ev}: at its maximum"))
        }
    })
}

/// Each GPU's NUMA node (`gpu_locality`): `warn` when it is unknown on a
/// machine with several nodes (firmware without proximity information, or
/// a VM), `ok` otherwise.
pub(super) fn locality(t: &Topology) -> Vec<Check> {
    const NAME: &str = "gpu_locality";
    per_gpu(t, NAME, "no GPU locality to check", false, |g, l| {
        match g.numa_node {
        Some(n) => Check::ok(
            NAME,
            format!(
                "{l}: on NUMA node {n}{}, local CPUs {}",
                g.package.map(|p| format!(" (package {p})")).unwrap_or_default(),
                if g.local_cpus.is_empty() { "unknown".to_string() } else { g.local_cpus.to_string() }
            ),
        ),
        None if !multi_node(t) => Check::ok(
            NAME,
            format!("{l}: the machine has one NUMA node, so every GPU is local to it"),
        ),
        None => Check::warn(
            NAME,
            format!(
                "{l}: NUMA node unknown on a machine with {} nodes: the firmware gives none (sysfs numa_node = -1{}); numapin will not guess one, so its buffers and threads cannot be placed near it",
                t.numa_nodes.len(),
                if g.local_cpus.is_empty() { String::new() } else { format!(", local CPUs {}", g.local_cpus) }
            ),
            "on bare metal, enable the NUMA/proximity (ACPI SRAT, _PXM) settings in the firmware and update it; on a VM, choose an instance type or hypervisor setting that gives PCI devices their NUMA node (QEMU: pxb-pcie numa_node=N); until then bind by hand (`numapin exec --node N`)",
        ),
    }
    })
}

/// `NIC 3 (mlx5_3, 0000:5e:00.0)`.
fn nic_label(t: &Topology, i: usize) -> String {
    let n = &t.nics[i];
    match (n.names.first(), &n.pci_bus_id) {
        (Some(name), Some(bus)) => format!("NIC {i} ({name}, {bus})"),
        _ => format!("NIC {i} ({})", n.label()),
    }
}

fn no_nics(name: &'static str, t: &Topology) -> Check {
    Check::ok(
        name,
        format!(
            "no NICs found in {}: nothing to check",
            if live(t) {
                "this machine"
            } else {
                t.source.as_str()
            }
        ),
    )
}

/// Each GPU's nearest NIC (`nic_locality`): `warn` when the NIC it is
/// paired with ([`Topology::nic_pairing`]) is `SYS`, across the socket link
/// or of unknown locality, so that its network traffic crosses the link
/// between sockets (or cannot be shown not to); `ok` otherwise, and when
/// the machine has no NIC.
pub(super) fn nic_locality(t: &Topology) -> Vec<Check> {
    const NAME: &str = "nic_locality";
    if t.nics.is_empty() {
        return vec![no_nics(NAME, t)];
    }
    let pairing = t.nic_pairing();
    per_gpu(t, NAME, "no GPU to pair with a NIC", false, |g, l| {
        let chosen = &pairing[g.index.as_usize()];
        let names: Vec<String> = chosen.iter().map(|c| nic_label(t, c.nic)).collect();
        let Some(first) = chosen.first() else {
            return Check::ok(NAME, format!("{l}: no NIC to pair with"));
        };
        let ev = format!(
            "{l}: its nearest NIC{}: {}, {}",
            if names.len() > 1 { "s" } else { "" },
            names.join(", "),
            first.relation
        );
        if first.relation != Relation::Sys {
            return Check::ok(NAME, ev);
        }
        let nic = &t.nics[first.nic];
        if g.numa_node.is_none() || nic.numa_node.is_none() {
            Check::warn(
                NAME,
                format!("{ev}: the locality of the GPU or of the NIC is unknown (sysfs numa_node = -1, common on cloud VMs), so numapin cannot show that they share a socket"),
                "on a cloud VM, give NCCL the provider's topology file (NCCL_TOPO_FILE; `numapin topo --input FILE` shows its pairing) and pair ranks with NICs by it; on bare metal enable the NUMA/proximity (ACPI SRAT, _PXM) settings in the firmware",
            )
        } else {
            Check::warn(
                NAME,
                format!("{ev}: every byte it sends or receives crosses the link between sockets, which can halve its network bandwidth"),
                format!(
                    "put a NIC on the GPU's socket (package {}), in a slot of its PCIe root or switch; until then expect this GPU's ranks to be slower across machines, and keep the job's traffic on NICs of the GPU's socket where there are any (`numapin affinity` lists each rank's NICs)",
                    g.package.map_or("?".to_string(), |p| p.to_string())
                ),
            )
        }
    })
}

/// Each NIC's PCIe link against its maximum (`nic_pcie_link`): `warn` when
/// it runs narrower or at a lower generation than the card can (NICs do not
/// lower their link to save power as GPUs do, so either caps the network
/// bandwidth); `ok` at its maximum, when the link is not reported, and when
/// the machine has no NIC.
pub(super) fn nic_pcie_links(t: &Topology) -> Vec<Check> {
    const NAME: &str = "nic_pcie_link";
    if t.nics.is_empty() {
        return vec![no_nics(NAME, t)];
    }
    t.nics
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let l = nic_label(t, i);
            let link = n
                .pcie
                .as_ref()
                .filter(|p| p.current_gen.is_some() || p.current_width.is_some());
            let c = match link {
                None => Check::ok(
                    NAME,
                    format!(
                        "{l}: link generation and width not reported by {} (nothing to compare)",
                        if live(t) { "sysfs" } else { t.source.as_str() }
                    ),
                ),
                Some(p) => {
                    let now = link_part(p.current_gen, p.current_width);
                    let max = link_part(p.max_gen, p.max_width);
                    let narrow = matches!((p.current_width, p.max_width), (Some(c), Some(m)) if c < m);
                    let slow = matches!((p.current_gen, p.max_gen), (Some(c), Some(m)) if c < m);
                    if narrow || slow {
                        Check::warn(
                            NAME,
                            format!("{l}: link running at {now}, below its maximum {max}: the NIC's bandwidth is capped by the link"),
                            format!(
                                "check that the card sits in a slot wired for x{} at Gen{} (a slot of a lower generation or width caps it), reseat it, check its riser and the firmware's PCIe bifurcation and speed settings; `lspci -vv -s {}` shows LnkCap (maximum) and LnkSta (now)",
                                p.max_width.map_or("?".into(), |w| w.to_string()),
                                p.max_gen.map_or("?".into(), |g| g.to_string()),
                                n.pci_bus_id.as_deref().unwrap_or("?")
                            ),
                        )
                    } else if p.max_gen.is_none() && p.max_width.is_none() {
                        Check::ok(NAME, format!("{l}: link running at {now} (maximum not reported)"))
                    } else {
                        Check::ok(NAME, format!("{l}: link running at {now}, maximum {max}: at its maximum"))
                    }
                }
            };
            c.for_nic(i)
        })
        .collect()
}

/// Each visible GPU's local CPUs against the allowed CPU set
/// (`gpu_cpus_allowed`): `fail` when none is allowed (every thread feeding
/// it runs across the socket link), `warn` when some are excluded, `ok`
/// when all are (or when there is nothing to compare).
pub(super) fn gpu_cpus_allowed(t: &Topology) -> Vec<Check> {
    const NAME: &str = "gpu_cpus_allowed";
    let fix = "let the job use its GPUs' local CPUs (`numapin topo` lists them): Slurm `--cpu-bind` / `--gres-flags=enforce-binding`, docker `--cpuset-cpus`, the Kubernetes CPU and topology managers (`single-numa-node`), or drop the `taskset` / `numactl --physcpubind` around the command";
    let allowed = &t.allowed.cpus;
    per_gpu(t, NAME, "no GPU-local CPUs to check", true, |g, l| {
        if g.local_cpus.is_empty() || (g.numa_node.is_none() && multi_node(t)) {
            return Check::ok(NAME, format!("{l}: local CPUs unknown, not checked"));
        }
        let excluded = g.local_cpus.difference(allowed);
        let ev = format!(
            "{l}: local CPUs {}; {} may use CPUs {}",
            g.local_cpus,
            whose(t),
            if allowed.is_empty() {
                "none".to_string()
            } else {
                allowed.to_string()
            }
        );
        if excluded == g.local_cpus {
            Check::fail(
                NAME,
                format!(
                    "{ev}: none of them, so every thread feeding this GPU crosses the socket link"
                ),
                fix,
            )
        } else if !excluded.is_empty() {
            Check::warn(
                NAME,
                format!(
                    "{ev}: {} of its {} local CPUs are excluded ({excluded})",
                    excluded.len(),
                    g.local_cpus.len()
                ),
                fix,
            )
        } else {
            Check::ok(NAME, format!("{ev}: all of them"))
        }
    })
}

/// Each visible GPU's node against the memory nodes the process may
/// allocate on (cpuset.mems) (`gpu_memory_allowed`): `fail` when its node
/// is excluded (mbind to it is refused, so its pinned buffers cannot be
/// local), `ok` otherwise.
pub(super) fn gpu_memory_allowed(t: &Topology) -> Vec<Check> {
    const NAME: &str = "gpu_memory_allowed";
    let allowed = &t.allowed.numa_nodes;
    per_gpu(t, NAME, "no GPU node to check", true, |g, l| {
        match g.numa_node {
        None => Check::ok(NAME, format!("{l}: NUMA node unknown, not checked")),
        Some(_) if allowed.is_empty() => Check::ok(
            NAME,
            format!("{l}: the allowed memory nodes are not recorded, not checked"),
        ),
        Some(n) if allowed.contains(&n) => Check::ok(
            NAME,
            format!("{l}: its node {n} is among the memory nodes {} may use ({})", whose(t), list(allowed)),
        ),
        Some(n) => Check::fail(
            NAME,
            format!(
                "{l}: its node {n} is not among the memory nodes {} may use ({}): memory for it cannot be on its node",
                whose(t),
                list(allowed)
            ),
            format!("let the job allocate on node {n}: the cgroup's cpuset.mems (Slurm `--mem-bind`, docker `--cpuset-mems`)"),
        ),
    }
    })
}

/// The process's memory policy against its GPUs' nodes (`memory_policy`).
///
/// `ok` for the default and local policies, and for a policy whose nodes
/// include every visible GPU's node. A `bind` policy with none of the GPUs'
/// nodes is a `fail`: every ordinary allocation (pageable tensors, staging
/// copies, the loader's buffers) is forced across the socket link. Other
/// policies with none of them, or any policy that leaves out some GPU's
/// node, are a `warn`. (Arena regions set their own `mbind`, so numapin's
/// pinned memory is placed right either way.)
pub(super) fn memory_policy(t: &Topology, policy: &Result<(i32, Vec<u32>), String>) -> Check {
    const NAME: &str = "memory_policy";
    let (mode, nodes) = match policy {
        Ok(p) => p,
        Err(e) => return Check::warn(
            NAME,
            format!("cannot read the memory policy (get_mempolicy): {e}"),
            "run where NUMA system calls are allowed (a seccomp profile may block get_mempolicy)",
        ),
    };
    let name = mempolicy_name(*mode);
    if matches!(name, "default" | "local") {
        return Check::ok(
            NAME,
            format!(
                "memory policy {name}: memory comes from the node of the CPU that first touches it"
            ),
        );
    }
    let mut gpu_nodes: Vec<u32> = visible_gpus(t).filter_map(|g| g.numa_node).collect();
    gpu_nodes.sort_unstable();
    gpu_nodes.dedup();
    let ev = format!(
        "memory policy {name} over {}; the GPUs this process sees are on {}",
        nodes_text(nodes),
        nodes_text(&gpu_nodes)
    );
    if gpu_nodes.is_empty() {
        return Check::ok(NAME, format!("{ev} (no GPU node to compare with)"));
    }
    let outside: Vec<u32> = gpu_nodes
        .iter()
        .copied()
        .filter(|n| !nodes.contains(n))
        .collect();
    let fix = "start the job without the memory binding (`numactl --membind` / `--preferred` / `--interleave` around it, or a launcher's set_mempolicy), or bind each rank near its own GPU with `numapin exec -- CMD` (see `numapin affinity`)";
    if outside.is_empty() {
        Check::ok(NAME, format!("{ev}: every GPU node is included"))
    } else if outside.len() == gpu_nodes.len() && name == "bind" {
        Check::fail(
            NAME,
            format!("{ev}: bound away from every GPU's node, so this process's ordinary memory (pageable buffers, staging copies) is all remote to its GPUs"),
            fix,
        )
    } else {
        Check::warn(
            NAME,
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
pub(super) fn transparent_hugepages(enabled: Option<&str>, defrag: Option<&str>) -> Check {
    const NAME: &str = "transparent_hugepages";
    const ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
    const DEFRAG: &str = "/sys/kernel/mm/transparent_hugepage/defrag";
    let Some(enabled) = enabled else {
        return Check::warn(
            NAME,
            format!("{ENABLED} is not readable: the kernel has no transparent huge pages, so arena regions use 4 KiB pages"),
            "use a kernel built with CONFIG_TRANSPARENT_HUGEPAGE (every distribution kernel is)",
        );
    };
    let mode = selected(enabled);
    let defrag_mode = defrag.and_then(selected);
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
pub(super) fn numa_balancing(t: &Topology, value: Option<&str>) -> Check {
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
pub(super) fn iommu(t: &Topology, v: &IommuView) -> Check {
    const NAME: &str = "iommu";
    let params = v.cmdline.as_deref().map(iommu_params).unwrap_or_default();
    let pt = params.iter().any(|(k, val)| {
        (*k == "iommu" && *val == "pt") || (*k == "iommu.passthrough" && *val == "1")
    });
    let units = v.units.clone().unwrap_or_default();
    let active = !units.is_empty() || v.groups.unwrap_or(0) > 0;
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
    let known: Vec<(numapin::GpuIndex, &str)> = v
        .gpu_domains
        .iter()
        .filter_map(|(g, d)| d.as_deref().map(|d| (*g, d)))
        .collect();
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
    let ev = ev.join("; ");
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

#[cfg(test)]
pub(crate) mod tests;
