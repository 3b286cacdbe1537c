//! The PCI tree of an NCCL topology file, built element by element while
//! `topology::nccl` reads it.
//!
//! `<cpu numaid>` is a root (its NUMA node known, its package not);
//! `<pci class="0x0604..">` is a whole switch (NCCL folds a switch's ports
//! into one element and lists no root ports); other `<pci>` elements are
//! devices: NICs when their class is a network class (`0x02....`) or when
//! they hold a `<nic>`. A `<nic>` directly below a `<cpu>` is a network
//! device without a PCI function. `<net name port>` below a `<nic>` names
//! it: a verbs device (`mlx5_0`) for NCCL's InfiniBand transport, an
//! interface (`eth0`) for its socket transport. Files written for a VM
//! (Azure's) often carry no `<nic>` at all: such NICs have no names.

use std::collections::HashMap;

use super::tree::{Add, Locality};
use super::{DeviceKind, RawIo, RawIoDevice};
use crate::topology::limits::{self, MAX_IO_DEVICES};
use crate::topology::{normalize_bus_id, PcieLink, RawGpu, TopologyError};

/// A `<pci>` device or a bare `<nic>` met in the file.
#[derive(Debug)]
struct Found {
    node: usize,
    bus: Option<String>,
    class: Option<u16>,
    vendor: Option<u16>,
    device: Option<u16>,
    numa: Option<u32>,
    pcie: Option<PcieLink>,
    has_nic: bool,
    /// `<net>` names with their ports.
    nets: Vec<(String, Option<u32>)>,
}

/// What an open element is to the tree.
#[derive(Debug, Clone, Copy)]
enum Open {
    /// A `<cpu>`: a tree node, with a NUMA node pushed on [`NcclIo::numa`].
    Cpu(usize),
    /// A switch: a tree node.
    Node(usize),
    /// A `<pci>` device or a bare `<nic>`: a tree node and its [`Found`].
    Device(usize, usize),
    /// A `<nic>` inside the [`Found`] it names.
    Nic(usize),
    /// Anything else.
    Other,
}

/// Builds the tree while the reader walks the file.
#[derive(Debug, Default)]
pub(crate) struct NcclIo {
    io: RawIo,
    open: Vec<Open>,
    found: Vec<Found>,
    /// The NUMA node of each open `<cpu>`, innermost last.
    numa: Vec<Option<u32>>,
}

fn hex16(attrs: &HashMap<String, String>, key: &str) -> Option<u16> {
    attrs
        .get(key)
        .and_then(|v| u16::from_str_radix(v.trim().trim_start_matches("0x"), 16).ok())
}

/// A `<pci>` element's class as 16 bits (`0x0207`), from NCCL's 24-bit form.
pub(crate) fn class16(text: &str) -> Option<u16> {
    let raw = u32::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()?;
    // 24 bits: class, subclass, programming interface; the first two kept
    // (of a longer value too, as before).
    let class = if raw > 0xffff {
        (raw >> 8) & 0xffff
    } else {
        raw
    };
    u16::try_from(class).ok()
}

/// An element's PCIe link (`link_speed="16.0 GT/s PCIe" link_width="16"`).
pub(crate) fn link(attrs: &HashMap<String, String>) -> Option<PcieLink> {
    let link = PcieLink {
        current_gen: attrs
            .get("link_speed")
            .and_then(|s| crate::topology::pcie::gen_of_speed(s)),
        current_width: attrs.get("link_width").and_then(|s| s.trim().parse().ok()),
        ..Default::default()
    };
    (link.current_gen.is_some() || link.current_width.is_some()).then_some(link)
}

/// Whether a `<net name>` is a verbs device rather than a network interface.
fn is_verbs_name(name: &str) -> bool {
    name.contains('_')
        || [
            "rdmap", "rocep", "roceo", "irdma", "qedr", "bnxt_re", "hfi1",
        ]
        .iter()
        .any(|p| name.starts_with(p))
}

impl NcclIo {
    fn parent(&self) -> Option<usize> {
        self.open.iter().rev().find_map(|o| match *o {
            Open::Cpu(n) | Open::Node(n) | Open::Device(n, _) => Some(n),
            _ => None,
        })
    }

    /// An element starts (call [`close`](Self::close) at its end, at once
    /// for an empty element).
    pub(crate) fn open(&mut self, name: &[u8], attrs: &HashMap<String, String>) {
        let parent = self.parent();
        let numa = self.numa.last().copied().flatten();
        let me = match name {
            b"cpu" => {
                let numa = attrs.get("numaid").and_then(|v| v.trim().parse().ok());
                self.numa.push(numa);
                Open::Cpu(self.io.tree.add(
                    None,
                    Add::HostBridge,
                    Some(Locality {
                        numa,
                        package: None,
                    }),
                ))
            }
            b"pci" => {
                let class = attrs.get("class").and_then(|c| class16(c));
                let (vendor, device) = (hex16(attrs, "vendor"), hex16(attrs, "device"));
                if class == Some(0x0604) {
                    let chip =
                        u32::from(vendor.unwrap_or(0)) << 16 | u32::from(device.unwrap_or(0));
                    Open::Node(self.io.tree.add(parent, Add::Switch(chip), None))
                } else {
                    let node = self.io.tree.add(parent, Add::Device, None);
                    self.found.push(Found {
                        node,
                        bus: attrs.get("busid").and_then(|b| normalize_bus_id(b)),
                        class,
                        vendor,
                        device,
                        numa,
                        pcie: link(attrs),
                        has_nic: false,
                        nets: Vec::new(),
                    });
                    Open::Device(node, self.found.len() - 1)
                }
            }
            b"nic" => match self.open.last() {
                Some(&Open::Device(_, f)) => {
                    self.found[f].has_nic = true;
                    Open::Nic(f)
                }
                _ => {
                    let node = self.io.tree.add(parent, Add::Device, None);
                    self.found.push(Found {
                        node,
                        bus: None,
                        class: None,
                        vendor: None,
                        device: None,
                        numa,
                        pcie: None,
                        has_nic: true,
                        nets: Vec::new(),
                    });
                    Open::Device(node, self.found.len() - 1)
                }
            },
            b"net" => {
                let f = match self.open.last() {
                    Some(&Open::Nic(f)) => Some(f),
                    Some(&Open::Device(_, f)) if self.found[f].has_nic => Some(f),
                    _ => None,
                };
                if let (Some(f), Some(n)) = (f, attrs.get("name")) {
                    let port = attrs.get("port").and_then(|p| p.trim().parse().ok());
                    self.found[f].nets.push((n.clone(), port));
                }
                Open::Other
            }
            _ => Open::Other,
        };
        self.open.push(me);
    }

    /// How many nodes the tree has so far.
    pub(crate) fn tree_nodes(&self) -> usize {
        self.io.tree.len()
    }

    /// The innermost open element ends.
    pub(crate) fn close(&mut self) {
        if let Some(Open::Cpu(_)) = self.open.pop() {
            self.numa.pop();
        }
    }

    /// The tree, with the GPUs the reader kept (by bus id) and the NICs;
    /// more NICs than [`MAX_IO_DEVICES`] are refused (`source` names the
    /// file).
    pub(crate) fn finish(self, gpus: &[RawGpu], source: &str) -> Result<RawIo, TopologyError> {
        let mut io = self.io;
        // The first device of each bus id.
        let mut by_bus: HashMap<&str, usize> = HashMap::new();
        for (i, f) in self.found.iter().enumerate() {
            if let Some(b) = f.bus.as_deref() {
                by_bus.entry(b).or_insert(i);
            }
        }
        let mut is_gpu = vec![false; self.found.len()];
        for g in gpus {
            if let Some(&i) = by_bus.get(g.pci_bus_id.as_str()) {
                is_gpu[i] = true;
                io.gpus.push((g.pci_bus_id.clone(), self.found[i].node));
            }
        }
        for (f, gpu) in self.found.into_iter().zip(is_gpu) {
            let network_class = f.class.is_some_and(|c| c >> 8 == 0x02);
            if gpu || !(network_class || f.has_nic) {
                continue;
            }
            limits::check_count(source, "NICs", io.devices.len() + 1, MAX_IO_DEVICES)?;
            let verbs = f.nets.iter().find(|(n, _)| is_verbs_name(n)).cloned();
            let kind = match (f.vendor, f.class) {
                (Some(0x1d0f), _) => DeviceKind::Efa,
                (_, Some(0x0207 | 0x0c06)) => DeviceKind::Infiniband,
                (_, Some(0x0200)) if verbs.is_some() => DeviceKind::Roce,
                (_, Some(0x0200)) => DeviceKind::Ethernet,
                _ if verbs.as_ref().is_some_and(|(n, _)| n.starts_with("efa")) => DeviceKind::Efa,
                _ => DeviceKind::Network,
            };
            let mut names: Vec<String> = Vec::new();
            for (n, _) in &f.nets {
                if !n.is_empty() && !names.contains(n) {
                    names.push(n.clone());
                }
            }
            io.devices.push(RawIoDevice {
                node: f.node,
                pci_bus_id: f.bus,
                kind,
                names,
                rdma_port: verbs.as_ref().and_then(|v| v.1),
                rdma_device: verbs.map(|v| v.0),
                numa_node: f.numa,
                package: None,
                pcie: f.pcie,
                vendor: f.vendor,
                device: f.device,
                class: f.class,
            });
        }
        Ok(io)
    }
}

#[cfg(test)]
mod tests {
    use crate::topology::{DeviceKind, Relation, Topology};

    fn load(xml: &str) -> Topology {
        crate::topology::fuzzing::load_nccl_str(xml).unwrap()
    }

    /// An `NCCL_TOPO_DUMP_FILE` as NCCL writes it on a DGX-like machine: a
    /// two-level Broadcom switch holding a GPU and an InfiniBand NIC, a
    /// RoCE NIC and a socket interface directly below the CPU.
    const DUMP: &str = r#"<system version="1">
  <cpu numaid="0" affinity="0000ffff" arch="x86_64">
    <pci busid="0000:17:00.0" class="0x060400" vendor="0x1000" device="0xc030" link_speed="32.0 GT/s PCIe" link_width="16">
      <pci busid="0000:18:00.0" class="0x060400" vendor="0x1000" device="0xc030">
        <pci busid="0000:19:00.0" class="0x030200" vendor="0x10de" device="0x2330" link_speed="32.0 GT/s PCIe" link_width="16"><gpu dev="0" sm="90" rank="0" gdr="1"/></pci>
      </pci>
      <pci busid="0000:1a:00.0" class="0x020700" vendor="0x15b3" device="0x1021" link_speed="32.0 GT/s PCIe" link_width="16">
        <nic><net name="mlx5_0" dev="0" speed="400000" port="1" guid="0x1" maxconn="131072" gdr="1"/></nic>
      </pci>
    </pci>
    <pci busid="0000:2a:00.0" class="0x020000" vendor="0x15b3" device="0x101d">
      <nic><net name="mlx5_bond_0" dev="1" speed="200000" port="2" guid="0x2"/></nic>
    </pci>
    <nic><net name="eth0" dev="2" speed="10000" port="0" guid="0x3"/></nic>
  </cpu>
  <cpu numaid="1" affinity="ffff0000" arch="x86_64">
    <pci busid="0000:99:00.0" class="0x030200"/>
  </cpu>
</system>"#;

    #[test]
    fn nic_elements_name_the_nics_and_switches_give_the_relations() {
        let t = load(DUMP);
        assert_eq!(t.gpus.len(), 2);
        let summary: Vec<_> = t
            .nics
            .iter()
            .map(|n| {
                (
                    n.pci_bus_id.as_deref(),
                    n.kind,
                    n.names.join(","),
                    n.rdma_device.as_deref(),
                    n.rdma_port,
                    n.numa_node,
                    n.gpu_relations.clone(),
                )
            })
            .collect();
        use Relation::*;
        assert_eq!(
            summary,
            [
                (
                    Some("0000:1a:00.0"),
                    DeviceKind::Infiniband,
                    "mlx5_0".into(),
                    Some("mlx5_0"),
                    Some(1),
                    Some(0),
                    vec![Pix, Sys]
                ),
                (
                    Some("0000:2a:00.0"),
                    DeviceKind::Roce,
                    "mlx5_bond_0".into(),
                    Some("mlx5_bond_0"),
                    Some(2),
                    Some(0),
                    vec![Phb, Sys]
                ),
                (
                    None,
                    DeviceKind::Network,
                    "eth0".into(),
                    None,
                    None,
                    Some(0),
                    vec![Phb, Sys]
                ),
            ]
        );
        assert_eq!(t.nics[0].pcie.as_ref().unwrap().current_gen, Some(5));
        assert!(t.storage.is_empty());
        // The RDMA NICs are paired; the socket interface is not.
        let p = t.nic_pairing();
        assert_eq!(p[0].iter().map(|c| c.nic).collect::<Vec<_>>(), [0]);
        // GPU 1 is as far from both: the one GPU 0 does not use comes first.
        assert_eq!(
            p[1].iter().map(|c| (c.nic, c.relation)).collect::<Vec<_>>(),
            [(1, Sys), (0, Sys)]
        );
    }

    #[test]
    fn a_gpu_listed_twice_is_one_gpu() {
        let xml = r#"<system><cpu numaid="0" affinity="ff">
          <pci busid="0000:01:00.0" class="0x030200"/>
          <pci busid="0000:01:00.0" class="0x030200"/>
          <pci busid="0000:02:00.0" class="0x020000" vendor="0x1b36" device="0x0005"/>
          <pci busid="0000:03:00.0" class="0x010802"/>
        </cpu></system>"#;
        let t = load(xml);
        assert_eq!(t.gpus.len(), 1);
        assert_eq!(t.nics.len(), 1, "{:?}", t.nics);
        assert_eq!(t.nics[0].gpu_relations, [Relation::Phb]);
    }
}
