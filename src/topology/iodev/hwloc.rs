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
use crate::topology::hwloc::{bus_id_of, io_locality, pcie_of};
use crate::topology::{is_accelerator, ProbeOptions, RawTopology};

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
/// machines).
pub(crate) fn scan(
    topo: &Hw,
    raw: &RawTopology,
    opts: &ProbeOptions,
    sysfs_root: Option<&Path>,
) -> RawIo {
    let mut io = RawIo::default();
    // The tops of the I/O subtrees: PCI objects below a CPU-side object.
    let mut stack: Vec<(&TopologyObject, Option<usize>)> = topo
        .objects()
        .filter(|o| is_pci(o) && o.parent().is_some_and(|p| !is_pci(p)))
        .map(|o| (o, None))
        .collect();
    stack.reverse();
    while let Some((obj, parent)) = stack.pop() {
        let locality = parent.is_none().then(|| {
            let (numa, package, _) = io_locality(obj, raw);
            Locality { numa, package }
        });
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
                        let (names, rdma_device, rdma_port) = kind::names(&osdevs);
                        let (numa_node, package, _) = io_locality(obj, raw);
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
        stack.extend(children.into_iter().rev().map(|c| (c, Some(node))));
    }
    io
}
