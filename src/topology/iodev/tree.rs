//! The PCI tree between the CPUs and the devices, and the `nvidia-smi topo
//! -m` relation between two devices in it. Pure: no hwloc, no I/O.
//!
//! Nodes are host bridges (hwloc's bridge objects whose upstream side is the
//! host, one per PCI root bus; an NCCL `<cpu>`), PCI-PCI bridges as hwloc
//! and sysfs show them (root ports, and the upstream and downstream ports of
//! a switch), whole switches (an NCCL `<pci class="0x0604..">`, already one
//! element per switch) and devices. Each root carries the locality of its
//! subtree.
//!
//! A bridge's role comes from where it sits: below a host bridge (or at the
//! top) it is a root port; below a root port or a downstream port it is a
//! switch's upstream port; below an upstream port it is a downstream port.
//! The bridges between two devices are counted as physical switches
//! ("units"): a downstream port belongs to its upstream port's switch, and
//! the Broadcom PEX88000/PEX89000 chips that show up as a switch below a
//! switch of the same chip count once, as NCCL counts them
//! (`ncclTopoFlattenBcmSwitches`).

use serde::{Deserialize, Serialize};

use super::Relation;

/// What a node of the tree is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Role {
    /// A PCI root bus (hwloc host bridge) or an NCCL `<cpu>`.
    HostBridge,
    /// A bridge right below a host bridge (or at the top of a subtree).
    RootPort,
    /// A switch's upstream port.
    Upstream,
    /// A switch's downstream port.
    Downstream,
    /// A whole switch as one node (NCCL files).
    Switch,
    /// An endpoint: GPU, NIC, drive, ...
    Device,
}

/// Where a subtree hangs: NUMA node and package, each possibly unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(crate) struct Locality {
    /// NUMA node (OS index), when known.
    pub numa: Option<u32>,
    /// Package (logical index), when known.
    pub package: Option<u32>,
}

/// One node of the tree.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PciNode {
    parent: Option<usize>,
    role: Role,
    /// `vendor << 16 | device` of a bridge (0 when unknown).
    chip: u32,
    /// The node standing for the physical switch this bridge belongs to.
    unit: usize,
    /// Set on roots: the locality of the subtree.
    locality: Option<Locality>,
}

/// What kind of node to add: the tree works out a bridge's role itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Add {
    /// A host bridge (PCI root bus, NCCL `<cpu>`).
    HostBridge,
    /// A PCI-PCI bridge (root port or switch port), with its chip id.
    Bridge(u32),
    /// A whole switch (NCCL), with its chip id.
    Switch(u32),
    /// A device.
    Device,
}

/// The PCI tree of a machine (what crosses the reader's process boundary).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct PciTree {
    nodes: Vec<PciNode>,
}

/// Broadcom PEX88000 (Gen4) and PEX89000 (Gen5) switches in base mode show
/// up as two levels of switch; NCCL flattens them, and so does numapin, so
/// that two devices on one chip are `PIX`.
fn multilevel_chip(chip: u32) -> bool {
    chip == 0x1000_c010 || chip == 0x1000_c030
}

impl PciTree {
    /// Adds a node below `parent` (a root when `None`, with `locality`) and
    /// returns its number. A parent number that is not in the tree makes
    /// the node a root.
    pub(crate) fn add(
        &mut self,
        parent: Option<usize>,
        what: Add,
        locality: Option<Locality>,
    ) -> usize {
        let i = self.nodes.len();
        let parent = parent.filter(|&p| p < i);
        let prole = parent.map(|p| self.nodes[p].role);
        let (role, chip) = match what {
            Add::HostBridge => (Role::HostBridge, 0),
            Add::Device => (Role::Device, 0),
            Add::Switch(c) => (Role::Switch, c),
            Add::Bridge(c) => (
                match prole {
                    None | Some(Role::HostBridge) => Role::RootPort,
                    Some(Role::Upstream) => Role::Downstream,
                    Some(_) => Role::Upstream,
                },
                c,
            ),
        };
        let same_chip = |other: usize| multilevel_chip(chip) && self.nodes[other].chip == chip;
        let unit = match (role, parent) {
            (Role::Downstream, Some(p)) => self.nodes[p].unit,
            // An upstream port below a downstream port of the same chip is
            // the same switch.
            (Role::Upstream, Some(p)) if prole == Some(Role::Downstream) => {
                let up = self.nodes[p].unit;
                if same_chip(up) {
                    up
                } else {
                    i
                }
            }
            (Role::Switch, Some(p)) if prole == Some(Role::Switch) && same_chip(p) => {
                self.nodes[p].unit
            }
            _ => i,
        };
        self.nodes.push(PciNode {
            parent,
            role,
            chip,
            unit,
            locality: if parent.is_none() {
                Some(locality.unwrap_or_default())
            } else {
                locality
            },
        });
        i
    }

    /// How many nodes the tree has.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The role of node `i`.
    #[cfg(test)]
    pub(crate) fn role(&self, i: usize) -> Role {
        self.nodes[i].role
    }

    /// Node `i` and its ancestors, nearest first.
    fn path(&self, i: usize) -> Vec<usize> {
        let mut v = vec![i];
        let mut cur = self.nodes[i].parent;
        while let Some(p) = cur {
            v.push(p);
            cur = self.nodes[p].parent;
        }
        v
    }

    /// The locality of node `i`: that of its nearest ancestor which has one.
    pub(crate) fn locality(&self, i: usize) -> Locality {
        self.path(i)
            .into_iter()
            .find_map(|n| self.nodes[n].locality)
            .unwrap_or_default()
    }

    /// The relation between two nodes (devices); `SYS` when either is not
    /// in the tree.
    pub(crate) fn relation(&self, a: usize, b: usize) -> Relation {
        if a >= self.nodes.len() || b >= self.nodes.len() {
            return Relation::Sys;
        }
        if a == b {
            return Relation::Pix;
        }
        let pa = self.path(a);
        let pb = self.path(b);
        // The lowest common ancestor, and its place on each path: both paths
        // end at their root, so the common ancestors are their common tail
        // (one walk, whatever the depth).
        let shared = pa[1..]
            .iter()
            .rev()
            .zip(pb[1..].iter().rev())
            .take_while(|(x, y)| x == y)
            .count();
        let common = (shared > 0).then(|| (pa.len() - shared, pb.len() - shared));
        if let Some((ia, ib)) = common {
            if self.nodes[pa[ia]].role == Role::HostBridge {
                return Relation::Phb;
            }
            let mut units: Vec<usize> = pa[1..=ia]
                .iter()
                .chain(&pb[1..=ib])
                .filter(|&&n| !matches!(self.nodes[n].role, Role::Device | Role::HostBridge))
                .map(|&n| self.nodes[n].unit)
                .collect();
            units.sort_unstable();
            units.dedup();
            return if units.len() <= 1 {
                Relation::Pix
            } else {
                Relation::Pxb
            };
        }
        let (la, lb) = (self.locality(a), self.locality(b));
        match (la.numa, lb.numa, la.package, lb.package) {
            (Some(x), Some(y), _, _) if x == y => Relation::Node,
            (_, _, Some(p), Some(q)) if p == q => Relation::Sock,
            _ => Relation::Sys,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use Relation::*;

    /// Broadcom PEX89000 (Gen5), as in DGX H100.
    pub(crate) const PEX89000: u32 = 0x1000_c030;
    /// Broadcom PEX88000 (Gen4), as in DGX A100.
    pub(crate) const PEX88000: u32 = 0x1000_c010;
    /// PLX PEX 8747 (Gen3), a plain one-level switch.
    pub(crate) const PEX8747: u32 = 0x10b5_8747;
    /// An Intel root port.
    const ROOT_PORT: u32 = 0x8086_0000;

    fn loc(numa: u32, package: u32) -> Option<Locality> {
        Some(Locality {
            numa: Some(numa),
            package: Some(package),
        })
    }

    /// A root bus with a root port and a switch (upstream port, one
    /// downstream port per device) holding `devices` devices; their numbers.
    fn switch_on_root(
        t: &mut PciTree,
        l: Option<Locality>,
        chip: u32,
        devices: usize,
    ) -> Vec<usize> {
        let hb = t.add(None, Add::HostBridge, l);
        let rp = t.add(Some(hb), Add::Bridge(ROOT_PORT), None);
        let usp = t.add(Some(rp), Add::Bridge(chip), None);
        (0..devices)
            .map(|_| {
                let dsp = t.add(Some(usp), Add::Bridge(chip), None);
                t.add(Some(dsp), Add::Device, None)
            })
            .collect()
    }

    #[test]
    fn bridges_take_their_role_from_where_they_sit() {
        let mut t = PciTree::default();
        let hb = t.add(None, Add::HostBridge, loc(0, 0));
        let rp = t.add(Some(hb), Add::Bridge(ROOT_PORT), None);
        let usp = t.add(Some(rp), Add::Bridge(PEX8747), None);
        let dsp = t.add(Some(usp), Add::Bridge(PEX8747), None);
        let usp2 = t.add(Some(dsp), Add::Bridge(PEX8747), None);
        let top = t.add(None, Add::Bridge(0), None);
        assert_eq!(
            [hb, rp, usp, dsp, usp2, top].map(|i| t.role(i)),
            [
                Role::HostBridge,
                Role::RootPort,
                Role::Upstream,
                Role::Downstream,
                Role::Upstream,
                Role::RootPort
            ]
        );
    }

    #[test]
    fn devices_on_one_switch_are_pix_and_other_root_buses_follow_locality() {
        // DGX H100-like: per socket, switches on their own root buses.
        let mut t = PciTree::default();
        let mut dev = Vec::new();
        for s in 0..2 {
            for _ in 0..2 {
                dev.push(switch_on_root(&mut t, loc(s, s), PEX89000, 2));
            }
        }
        assert_eq!(t.relation(dev[0][0], dev[0][1]), Pix);
        assert_eq!(t.relation(dev[0][0], dev[1][0]), Node);
        assert_eq!(t.relation(dev[0][0], dev[2][0]), Sys);
        assert_eq!(t.relation(dev[3][1], dev[2][0]), Node);
        assert_eq!(t.relation(dev[0][0], dev[0][0]), Pix);
        assert_eq!(t.relation(dev[0][0], 10_000), Sys, "not in the tree");
    }

    #[test]
    fn one_broadcom_chip_in_two_levels_is_one_switch() {
        // DGX A100: root port -> PEX88000 upstream -> downstream -> (same
        // chip) upstream -> downstream -> device.
        let mut t = PciTree::default();
        let hb = t.add(None, Add::HostBridge, loc(3, 0));
        let rp = t.add(Some(hb), Add::Bridge(ROOT_PORT), None);
        let top = t.add(Some(rp), Add::Bridge(PEX88000), None);
        let leaf = |t: &mut PciTree| {
            let d1 = t.add(Some(top), Add::Bridge(PEX88000), None);
            let u2 = t.add(Some(d1), Add::Bridge(PEX88000), None);
            let a = t.add(Some(u2), Add::Bridge(PEX88000), None);
            let b = t.add(Some(u2), Add::Bridge(PEX88000), None);
            (
                t.add(Some(a), Add::Device, None),
                t.add(Some(b), Add::Device, None),
            )
        };
        let (gpu0, nic0) = leaf(&mut t);
        let (gpu1, _) = leaf(&mut t);
        assert_eq!(t.relation(gpu0, nic0), Pix);
        assert_eq!(
            t.relation(gpu1, nic0),
            Pix,
            "the other half of the same chip"
        );
    }

    #[test]
    fn cascaded_switches_of_other_chips_are_pxb() {
        let mut t = PciTree::default();
        let d = switch_on_root(&mut t, loc(0, 0), PEX8747, 1);
        let nic = d[0];
        let dsp = t.add(Some(2), Add::Bridge(PEX8747), None);
        let usp2 = t.add(Some(dsp), Add::Bridge(PEX8747), None);
        let mut under2 = || {
            let p = t.add(Some(usp2), Add::Bridge(PEX8747), None);
            t.add(Some(p), Add::Device, None)
        };
        let (g0, g1) = (under2(), under2());
        assert_eq!(t.relation(g0, nic), Pxb);
        assert_eq!(t.relation(g0, g1), Pix);
    }

    #[test]
    fn root_ports_of_one_root_bus_are_phb_and_functions_of_one_card_pix() {
        let mut t = PciTree::default();
        let hb = t.add(None, Add::HostBridge, loc(0, 0));
        let rp1 = t.add(Some(hb), Add::Bridge(ROOT_PORT), None);
        let rp2 = t.add(Some(hb), Add::Bridge(ROOT_PORT), None);
        let f0 = t.add(Some(rp1), Add::Device, None);
        let f1 = t.add(Some(rp1), Add::Device, None);
        let other = t.add(Some(rp2), Add::Device, None);
        let on_bus = t.add(Some(hb), Add::Device, None);
        assert_eq!(t.relation(f0, f1), Pix);
        assert_eq!(t.relation(f0, other), Phb);
        assert_eq!(t.relation(f0, on_bus), Phb);
        // A switch below one root port and a NIC on that root port: the
        // path crosses the switch and the root port.
        let usp = t.add(Some(rp2), Add::Bridge(PEX8747), None);
        let dsp = t.add(Some(usp), Add::Bridge(PEX8747), None);
        let g = t.add(Some(dsp), Add::Device, None);
        assert_eq!(t.relation(g, other), Pxb);
    }

    #[test]
    fn sock_needs_both_packages_and_unknown_is_never_near() {
        let mut t = PciTree::default();
        let mut dev = |l| {
            let hb = t.add(None, Add::HostBridge, l);
            t.add(Some(hb), Add::Device, None)
        };
        let a = dev(loc(0, 0));
        let b = dev(loc(1, 0));
        let c = dev(loc(4, 1));
        let u = dev(None);
        let numa_only = dev(Some(Locality {
            numa: Some(1),
            package: None,
        }));
        let hb = t.add(None, Add::HostBridge, None);
        let u1 = t.add(Some(hb), Add::Device, None);
        let u2 = t.add(Some(hb), Add::Device, None);
        assert_eq!(t.relation(a, b), Sock);
        assert_eq!(t.relation(a, c), Sys);
        assert_eq!(t.relation(a, u), Sys, "unknown locality is never near");
        assert_eq!(t.relation(u, u1), Sys);
        assert_eq!(t.relation(u1, u2), Phb, "one root bus is known");
        assert_eq!(t.relation(b, numa_only), Node);
        assert_eq!(t.relation(a, numa_only), Sys);
    }

    #[test]
    fn nccl_switches_nest_and_flatten_like_bridges() {
        let mut t = PciTree::default();
        let cpu = t.add(None, Add::HostBridge, loc(0, 0));
        let top = t.add(Some(cpu), Add::Switch(PEX88000), None);
        let sub = t.add(Some(top), Add::Switch(PEX88000), None);
        let g = t.add(Some(sub), Add::Device, None);
        let n = t.add(Some(top), Add::Device, None);
        assert_eq!(t.relation(g, n), Pix);
        let other = t.add(Some(cpu), Add::Switch(PEX8747), None);
        let sub2 = t.add(Some(other), Add::Switch(PEX8747), None);
        let g2 = t.add(Some(sub2), Add::Device, None);
        let n2 = t.add(Some(other), Add::Device, None);
        assert_eq!(t.relation(g2, n2), Pxb);
        assert_eq!(t.relation(g, g2), Phb);
    }

    proptest::proptest! {
        /// Whatever the tree, the relation is symmetric, a device is PIX to
        /// itself, and devices on one bridge are PIX.
        #[test]
        fn relations_are_symmetric(
            shape in proptest::collection::vec((0usize..64, 0u8..4, 0u8..3, 0u32..3), 1..48)
        ) {
            let chips = [PEX88000, PEX8747, ROOT_PORT];
            let mut t = PciTree::default();
            let mut devices = Vec::new();
            for (parent, what, chip, numa) in shape {
                let parent = (parent < t.nodes.len() && t.nodes[parent].role != Role::Device)
                    .then_some(parent);
                let add = match what {
                    0 => Add::HostBridge,
                    1 => Add::Bridge(chips[chip as usize]),
                    2 => Add::Switch(chips[chip as usize]),
                    _ => Add::Device,
                };
                let l = loc(numa, numa / 2);
                let i = t.add(if add == Add::HostBridge { None } else { parent }, add, l);
                if add == Add::Device {
                    devices.push(i);
                }
            }
            for &a in &devices {
                proptest::prop_assert_eq!(t.relation(a, a), Pix);
                for &b in &devices {
                    proptest::prop_assert_eq!(t.relation(a, b), t.relation(b, a));
                    let (pa, pb) = (t.nodes[a].parent, t.nodes[b].parent);
                    if pa.is_some() && pa == pb && t.nodes[pa.unwrap_or(0)].role != Role::HostBridge {
                        proptest::prop_assert_eq!(t.relation(a, b), Pix);
                    }
                }
            }
        }
    }
}
