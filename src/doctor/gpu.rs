//! The checks of each GPU: the CUDA driver (`cuda_driver`), visibility to
//! CUDA (`gpu_visible`, `cuda_visible_devices`), the PCIe link
//! (`pcie_link`), the NUMA node (`gpu_locality`) and whether the process
//! may use the GPU's CPUs and node (`gpu_cpus_allowed`,
//! `gpu_memory_allowed`).

use super::check::Check;
use super::words::{is_nvidia, label, link, list, live, multi_node, no_gpus, per_gpu, whose, Link};
use crate::gpu::CudaOrdinal;
use crate::system::CudaDriver;
use crate::topology::{Gpu, Topology, WarningKind};

/// `12.8 (12080)`.
fn driver_version_text(v: u32) -> String {
    format!("{}.{} ({v})", v / 1000, v % 1000 / 10)
}

/// The CUDA driver. `ok` when loaded; when it is not: `fail` if the machine
/// has NVIDIA GPUs, `warn` if they exist but the driver was deliberately
/// not loaded (`--no-cuda`, `NUMAPIN_NO_CUDA`), `ok` (saying so) with no
/// NVIDIA GPU.
pub(crate) fn cuda_driver(t: &Topology, state: &CudaDriver) -> Check {
    const NAME: &str = "cuda_driver";
    let nvidia = t.gpus.iter().filter(|g| is_nvidia(g)).count();
    let gpus = format!("{nvidia} NVIDIA GPU(s) on the PCI bus");
    if let Some(v) = state.version() {
        return Check::ok(
            NAME,
            format!("CUDA driver {} loaded; {gpus}", driver_version_text(v)),
        );
    }
    let Some(why) = state.unavailable_reason() else {
        return if nvidia == 0 {
            Check::ok(
                NAME,
                "no CUDA driver loaded (--no-cuda) and no NVIDIA GPU found: none is needed",
            )
        } else {
            Check::warn(
                NAME,
                format!("CUDA driver not loaded (--no-cuda), not checked; {gpus}"),
                "run `numapin doctor` without --no-cuda to check the driver",
            )
        };
    };
    if nvidia == 0 {
        Check::ok(
            NAME,
            format!("no CUDA driver ({why}); no NVIDIA GPU found, so none is needed"),
        )
    } else if state.disabled_by_env() {
        Check::warn(
            NAME,
            format!("no CUDA driver ({why}), not checked; {gpus}"),
            "unset NUMAPIN_NO_CUDA to check the driver",
        )
    } else {
        Check::fail(
            NAME,
            format!("no CUDA driver ({why}); {gpus}"),
            "install the NVIDIA driver for these GPUs (`nvidia-smi` must list them); if it is installed, make libcuda.so findable (ldconfig, LD_LIBRARY_PATH); in a container, start it with the NVIDIA container toolkit (`--gpus all`)",
        )
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
pub(crate) fn gpu_visibility(t: &Topology) -> Vec<Check> {
    let mut out = Vec::new();
    if t.gpus.is_empty() {
        out.push(no_gpus(
            VISIBLE,
            "no NVIDIA device (vendor 0x10de) or device named with --accelerator-pci-id on the PCI bus",
        ));
    }
    for g in &t.gpus {
        out.push(visible(t, g).for_gpu(g.index));
    }
    for w in &t.warnings {
        let fix = match w.kind {
            WarningKind::CudaVisibleDevices => "check CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER against `numapin topo` (ordinals, UUIDs, MIG instances)",
            WarningKind::UnmatchedCudaDevice => "make the PCI devices visible to this process (a container that masks /sys/bus/pci hides them) so each GPU's locality can be read",
            _ => continue,
        };
        let c = Check::warn("cuda_visible_devices", w.message.clone(), fix);
        out.push(match w.gpu {
            Some(g) => c.for_gpu(g),
            None => c,
        });
    }
    out
}

const VISIBLE: &str = "gpu_visible";

/// `gpu_visible` for one GPU (see [`gpu_visibility`]).
fn visible(t: &Topology, g: &Gpu) -> Check {
    let l = label(g);
    let name = g
        .name
        .as_deref()
        .map(|n| format!(", {n}"))
        .unwrap_or_default();
    match (g.cuda_ordinal, t.cuda.ordinal_source == "driver") {
        (Some(o), true) => Check::ok(VISIBLE, format!("{l}{name}: CUDA ordinal {o}")),
        (None, _) if t.cuda.visible_devices.is_some() => Check::ok(
            VISIBLE,
            format!(
                "{l}: hidden from this process by CUDA_VISIBLE_DEVICES={:?}",
                t.cuda.visible_devices.as_deref().unwrap_or_default()
            ),
        ),
        (None, true) if is_nvidia(g) => Check::fail(
            VISIBLE,
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
            VISIBLE,
            format!(
                "{l}: not an NVIDIA device (vendor {}), so not a CUDA device",
                g.vendor_id
            ),
        ),
        (o, false) => visible_without_driver(t, g, &l, o),
    }
}

/// `gpu_visible` for a GPU whose ordinal was not given by the driver.
fn visible_without_driver(t: &Topology, g: &Gpu, l: &str, o: Option<CudaOrdinal>) -> Check {
    let assumed = o
        .map(|o| format!("CUDA ordinal {o} assumed from PCI order"))
        .unwrap_or_else(|| "no CUDA ordinal".into());
    if !is_nvidia(g) {
        Check::ok(
            VISIBLE,
            format!(
                "{l}: not an NVIDIA device (vendor {}); {assumed}",
                g.vendor_id
            ),
        )
    } else if live(t) {
        Check::warn(
            VISIBLE,
            format!("{l}: not checked, the CUDA driver was not loaded; {assumed}"),
            "make the CUDA driver loadable (see the cuda_driver check) to check that CUDA sees every GPU",
        )
    } else {
        Check::ok(
            VISIBLE,
            format!(
                "{l}: {} records no CUDA driver enumeration; {assumed}",
                t.source
            ),
        )
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
pub(crate) fn pcie_links(t: &Topology) -> Vec<Check> {
    const NAME: &str = "pcie_link";
    per_gpu(t, NAME, "no PCIe link to check", false, |g, l| {
        let Link {
            pcie: p,
            now,
            max,
            narrow,
            slow,
        } = match link(t, NAME, &l, g.pcie.as_ref()) {
            Ok(k) => k,
            Err(c) => return c,
        };
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
pub(crate) fn locality(t: &Topology) -> Vec<Check> {
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

/// Each visible GPU's local CPUs against the allowed CPU set
/// (`gpu_cpus_allowed`): `fail` when none is allowed (every thread feeding
/// it runs across the socket link), `warn` when some are excluded, `ok`
/// when all are (or when there is nothing to compare).
pub(crate) fn gpu_cpus_allowed(t: &Topology) -> Vec<Check> {
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
pub(crate) fn gpu_memory_allowed(t: &Topology) -> Vec<Check> {
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
