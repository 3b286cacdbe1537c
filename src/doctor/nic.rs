//! The checks of each NIC: on the GPU's side of the socket link
//! (`nic_locality`) and its PCIe link (`nic_pcie_link`).

use super::check::Check;
use super::words::{link, live, per_gpu, Link};
use crate::topology::{Relation, Topology};

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
pub(crate) fn nic_locality(t: &Topology) -> Vec<Check> {
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
pub(crate) fn nic_pcie_links(t: &Topology) -> Vec<Check> {
    if t.nics.is_empty() {
        return vec![no_nics(LINK, t)];
    }
    (0..t.nics.len())
        .map(|i| nic_link(t, i).for_nic(i))
        .collect()
}

const LINK: &str = "nic_pcie_link";

/// `nic_pcie_link` for NIC `i` (see [`nic_pcie_links`]).
fn nic_link(t: &Topology, i: usize) -> Check {
    let n = &t.nics[i];
    let l = nic_label(t, i);
    let Link {
        pcie: p,
        now,
        max,
        narrow,
        slow,
    } = match link(t, LINK, &l, n.pcie.as_ref()) {
        Ok(k) => k,
        Err(c) => return c,
    };
    if narrow || slow {
        Check::warn(
            LINK,
            format!("{l}: link running at {now}, below its maximum {max}: the NIC's bandwidth is capped by the link"),
            format!(
                "check that the card sits in a slot wired for x{} at Gen{} (a slot of a lower generation or width caps it), reseat it, check its riser and the firmware's PCIe bifurcation and speed settings; `lspci -vv -s {}` shows LnkCap (maximum) and LnkSta (now)",
                p.max_width.map_or("?".into(), |w| w.to_string()),
                p.max_gen.map_or("?".into(), |g| g.to_string()),
                n.pci_bus_id.as_deref().unwrap_or("?")
            ),
        )
    } else if p.max_gen.is_none() && p.max_width.is_none() {
        Check::ok(
            LINK,
            format!("{l}: link running at {now} (maximum not reported)"),
        )
    } else {
        Check::ok(
            LINK,
            format!("{l}: link running at {now}, maximum {max}: at its maximum"),
        )
    }
}
