//! hwloc's I/O objects (live, XML, captured roots) as a [`PciTree`] with the
//! GPUs, NICs and drives in it.
//!
//! numapin builds hwloc topologies with PCI devices kept, bridges and OS
//! devices kept when important: verbs devices (`mlx5_0`), network
//! interfaces and block devices are then below their PCI function. A PCI
//! bus id is not a key (an export can hold two devices with one id, from
//! PCI domains hwloc merged): the walk follows hwloc's objects.

use std::path::Path;

use hwlocality::object::attributes::{ObjectAttributes, UpstreamAttributes};
use hwlocality::object::types::{BridgeType, OSDeviceType, ObjectType};
use hwlocality::object::TopologyObject;
use hwlocality::Topology as Hw;

use super::kind::{self, OsDev, OsType};
use super::tree::{Add, Locality};
use super::{RawIo, RawIoDevice};
use crate::topology::hwloc::locality::{bus_id_of, io_locality};
use crate::topology::limits::{self, MAX_IO_DEVICES, MAX_PCI_DEPTH, MAX_PCI_NODES};
use crate::topology::pcie::pcie_of;
use crate::topology::{is_accelerator, ProbeOptions, RawTopology, TopologyError};

fn is_pci(o: &TopologyObject) -> bool {
    matches!(o.object_type(), ObjectType::Bridge | ObjectType::PCIDevice)
}

fn text(s: &std::ffi::CStr) -> String {
    s.to_string_lossy().into_owned()
}

fn osdev(o: &TopologyObject) -> OsDev {
    let ty = match o.attributes() {
        Some(ObjectAttributes::OSDevice(a)) => match a.device_type() {
            OSDeviceType::Storage => OsType::Block,
            OSDeviceType::Network => OsType::Network,
            OSDeviceType::OpenFabrics => OsType::OpenFabrics,
            _ => OsType::Other,
        },
        _ => OsType::Other,
    };
    OsDev {
        name: o.name().map(text).unwrap_or_default(),
        ty,
        subtype: o.subtype().map(text),
        infos: o
            .infos()
            .iter()
            .map(|i| (text(i.name()), text(i.value())))
            .collect(),
    }
}

/// The PCI tree of an hwloc topology whose CPUs and nodes `raw` already
/// holds; `sysfs_root` is where to read PCIe link states (live and captured
/// machines). A tree beyond the limits ([`MAX_PCI_NODES`],
/// [`MAX_PCI_DEPTH`], [`MAX_IO_DEVICES`]) is refused before it is built.
pub(crate) fn scan(
    topo: &Hw,
    raw: &RawTopology,
    opts: &ProbeOptions,
    sysfs_root: Option<&Path>,
    source: &str,
) -> Result<RawIo, TopologyError> {
    let pci = topo.objects_with_type(ObjectType::PCIDevice).len()
        + topo.objects_with_type(ObjectType::Bridge).len();
    limits::check_count(source, "PCI objects", pci, MAX_PCI_NODES)?;
    let mut io = RawIo::default();
    // The tops of the I/O subtrees: PCI objects below a CPU-side object,
    // each with its parent in the tree and its depth.
    let mut stack: Vec<(&TopologyObject, Option<usize>, usize)> = topo
        .objects()
        .filter(|o| is_pci(o) && o.parent().is_some_and(|p| !is_pci(p)))
        .map(|o| (o, None, 0))
        .collect();
    stack.reverse();
    while let Some((obj, parent, depth)) = stack.pop() {
        if depth > MAX_PCI_DEPTH {
            return Err(limits::over(
                source,
                format!("its PCI tree is more than {MAX_PCI_DEPTH} bridges deep, the limit"),
            ));
        }
        let locality = match parent {
            None => {
                let (numa, package, _) = io_locality(obj, raw, source)?;
                Some(Locality { numa, package })
            }
            Some(_) => None,
        };
        let node = match obj.attributes() {
            Some(ObjectAttributes::Bridge(b)) if b.upstream_type() == BridgeType::Host => {
                io.tree.add(parent, Add::HostBridge, locality)
            }
            Some(ObjectAttributes::Bridge(b)) => {
                let chip = match b.upstream_attributes() {
                    Some(UpstreamAttributes::PCI(p)) => {
                        u32::from(p.vendor_id()) << 16 | u32::from(p.device_id())
                    }
                    _ => 0,
                };
                io.tree.add(parent, Add::Bridge(chip), locality)
            }
            Some(ObjectAttributes::PCIDevice(p)) => {
                let node = io.tree.add(parent, Add::Device, locality);
                let bus_id = bus_id_of(p);
                let (vendor, device, class) = (p.vendor_id(), p.device_id(), p.class_id());
                if is_accelerator(vendor, device, class, &opts.accelerator_ids) {
                    io.gpus.push((bus_id, node));
                } else {
                    let osdevs: Vec<OsDev> = obj
                        .io_children()
                        .filter(|c| c.object_type() == ObjectType::OSDevice)
                        .map(osdev)
                        .collect();
                    if let Some(kind) = kind::classify(vendor, device, class, &osdevs) {
                        limits::check_count(
                            source,
                            "NICs and storage devices",
                            io.devices.len() + 1,
                            MAX_IO_DEVICES,
                        )?;
                        let (names, rdma_device, rdma_port) = kind::names(&osdevs);
                        let (numa_node, package, _) = io_locality(obj, raw, source)?;
                        io.devices.push(RawIoDevice {
                            node,
                            pcie: pcie_of(sysfs_root, &bus_id, p.link_speed()),
                            pci_bus_id: Some(bus_id),
                            kind,
                            names,
                            rdma_device,
                            rdma_port,
                            numa_node,
                            package,
                            vendor: Some(vendor),
                            device: Some(device),
                            class: Some(class),
                        });
                    }
                }
                node
            }
            _ => continue,
        };
        let children: Vec<&TopologyObject> = obj.io_children().filter(|c| is_pci(c)).collect();
        stack.extend(
            children
                .into_iter()
                .rev()
                .map(|c| (c, Some(node), depth + 1)),
        );
    }
    Ok(io)
}
