//! NCCL topology XML (`NCCL_TOPO_FILE`, `NCCL_TOPO_DUMP_FILE`).
//!
//! `<system><cpu numaid="N" affinity="MASK"> ... <pci busid class link_speed
//! link_width/> ...</cpu></system>`: each `<cpu>` is a NUMA node with its CPU
//! mask; GPUs are class `0x0302` PCI devices anywhere below it (behind
//! switches too), and take the enclosing `<cpu>`'s locality. These files
//! carry no packages, cores, caches or memory sizes.

use std::collections::HashMap;

use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;

use super::limits::{self, MAX_GPUS, MAX_NODES, MAX_PCI_NODES};
use super::{
    is_accelerator, NodeKind, NumaNode, ProbeOptions, RawGpu, RawTopology, Warning, WarningKind,
};
use super::{Result, TopologyError as Error};
use crate::cpulist::CpuList;

/// Deepest element nesting accepted (real files nest a few switches deep).
const MAX_DEPTH: usize = 64;
/// Most elements accepted.
const MAX_ELEMENTS: usize = 100_000;

/// Reads an NCCL topology file (`text`, named `source`), element by
/// element, each count checked against its limit as it grows.
pub(crate) fn parse(text: &str, source: &str, opts: &ProbeOptions) -> Result<RawTopology> {
    let mut reader = Reader::from_str(text);
    reader.config_mut().trim_text(true);
    let mut r = Nccl {
        source,
        opts,
        raw: RawTopology::default(),
        stack: Vec::new(),
        seen_system: false,
        elements: 0,
        io: super::iodev::nccl::NcclIo::default(),
    };
    loop {
        let ev = reader.read_event().map_err(|e| {
            r.bad(format!(
                "malformed XML at byte {}: {e}",
                reader.error_position()
            ))
        })?;
        match &ev {
            Event::Start(s) => r.element(s, false)?,
            Event::Empty(s) => r.element(s, true)?,
            Event::End(_) => {
                r.stack.pop();
                r.io.close();
            }
            Event::Eof => break,
            _ => {}
        }
    }
    r.finish()
}

/// An open element, with the node (numaid, CPUs) it sits in.
type Open = (Vec<u8>, Option<(u32, CpuList)>);

/// A file being read.
struct Nccl<'a> {
    source: &'a str,
    opts: &'a ProbeOptions,
    raw: RawTopology,
    /// The open elements.
    stack: Vec<Open>,
    seen_system: bool,
    elements: usize,
    /// The PCI tree with the NICs, built alongside.
    io: super::iodev::nccl::NcclIo,
}

impl Nccl<'_> {
    /// An error naming the file, with the fix.
    fn bad(&self, problem: String) -> Error {
        Error::input(
            self.source,
            problem,
            "give an NCCL topology file as NCCL_TOPO_DUMP_FILE writes it (<system><cpu numaid affinity><pci busid class .../></cpu></system>)",
        )
    }

    /// An element starts (`empty`: and ends).
    fn element(&mut self, el: &BytesStart<'_>, empty: bool) -> Result<()> {
        self.elements += 1;
        if self.elements > MAX_ELEMENTS || self.stack.len() > MAX_DEPTH {
            return Err(self.bad("too many or too deeply nested elements".into()));
        }
        let name = el.name().as_ref().to_vec();
        let attrs = self.attributes(el)?;
        self.io.open(&name, &attrs);
        limits::check_count(
            self.source,
            "PCI tree nodes",
            self.io.tree_nodes(),
            MAX_PCI_NODES,
        )?;
        if empty {
            self.io.close();
        }
        let parent_node = self.stack.last().and_then(|(_, n)| n.clone());
        let mut this_node = parent_node.clone();
        match name.as_slice() {
            b"system" => self.seen_system = true,
            b"cpu" => this_node = Some(self.cpu(&attrs)?),
            b"pci" => self.pci(&attrs, parent_node)?,
            _ => {}
        }
        if !empty {
            self.stack.push((name, this_node));
        }
        Ok(())
    }

    /// An element's attributes, unescaped.
    fn attributes(&self, el: &BytesStart<'_>) -> Result<HashMap<String, String>> {
        let mut attrs = HashMap::new();
        for a in el.attributes() {
            let a = a.map_err(|e| self.bad(format!("malformed attribute: {e}")))?;
            let v = a
                .unescape_value()
                .map_err(|e| self.bad(format!("malformed attribute value: {e}")))?
                .into_owned();
            attrs.insert(String::from_utf8_lossy(a.key.as_ref()).into_owned(), v);
        }
        Ok(attrs)
    }

    /// A `<cpu numaid affinity>`: a NUMA node (met again, its CPUs grow).
    fn cpu(&mut self, attrs: &HashMap<String, String>) -> Result<(u32, CpuList)> {
        let numaid = attrs
            .get("numaid")
            .ok_or_else(|| self.bad("a <cpu> element has no numaid".into()))?;
        let id: u32 = numaid.trim().parse().ok().ok_or_else(|| {
            self.bad(format!(
                "<cpu numaid={}> is not a node number",
                crate::report::quote(numaid)
            ))
        })?;
        limits::check_node(self.source, "a <cpu> element", id)?;
        let cpus = match attrs.get("affinity") {
            Some(mask) => CpuList::parse_mask(mask)
                .map_err(|e| self.bad(format!("<cpu numaid=\"{id}\"> affinity: {e}")))?,
            None => return Err(self.bad(format!("<cpu numaid=\"{id}\"> has no affinity mask"))),
        };
        if let Some(existing) = self.raw.numa_nodes.iter_mut().find(|n| n.os_index == id) {
            existing.cpus = existing.cpus.union(&cpus);
        } else {
            limits::check_count(
                self.source,
                "NUMA nodes",
                self.raw.numa_nodes.len() + 1,
                MAX_NODES as usize,
            )?;
            self.raw.numa_nodes.push(NumaNode {
                os_index: id,
                package: None,
                cpus: cpus.clone(),
                memory_bytes: 0,
                distances: Vec::new(),
                kind: NodeKind::Normal,
            });
        }
        Ok((id, cpus))
    }

    /// A `<pci busid class>`: a GPU when its class (or a chosen id) says
    /// so, in the node of the `<cpu>` around it.
    fn pci(&mut self, attrs: &HashMap<String, String>, node: Option<(u32, CpuList)>) -> Result<()> {
        let (Some(busid), Some(class)) = (attrs.get("busid"), attrs.get("class")) else {
            return Ok(());
        };
        let class16 = super::iodev::nccl::class16(class).ok_or_else(|| {
            self.bad(format!(
                "<pci busid=\"{busid}\"> has class \"{class}\", not hexadecimal"
            ))
        })?;
        let hex = |k: &str| {
            attrs
                .get(k)
                .and_then(|v| u16::from_str_radix(v.trim_start_matches("0x"), 16).ok())
        };
        let vendor = hex("vendor").unwrap_or(0x10de);
        let device = hex("device").unwrap_or(0);
        // NCCL files list NVIDIA GPUs only as class 0x0302.
        let is_gpu = class16 == 0x0302
            || (is_accelerator(vendor, device, class16, &self.opts.accelerator_ids)
                && class16 != 0x0300);
        if !is_gpu || busid.starts_with("ffff") {
            return Ok(());
        }
        let bus = super::normalize_bus_id(busid)
            .ok_or_else(|| self.bad(format!("<pci busid=\"{busid}\"> is not a PCI bus id")))?;
        limits::check_count(self.source, "GPUs", self.raw.gpus.len() + 1, MAX_GPUS)?;
        let (numa_node, local_cpus) = match node {
            Some((n, c)) => (Some(n), c),
            None => (None, CpuList::new()),
        };
        self.raw.gpus.push(RawGpu {
            pci_bus_id: bus,
            vendor,
            device,
            class: class16,
            name: None,
            uuid: None,
            numa_node,
            package: None,
            local_cpus,
            pcie: super::iodev::nccl::link(attrs),
        });
        Ok(())
    }

    /// The file read: nodes and GPUs in order, the PCI tree, what this
    /// process may use (all of it) and what the file cannot say.
    fn finish(self) -> Result<RawTopology> {
        if !self.seen_system {
            return Err(self.bad("no <system> element".into()));
        }
        if self.raw.numa_nodes.is_empty() {
            return Err(self.bad("no <cpu numaid affinity> element".into()));
        }
        let mut raw = self.raw;
        raw.numa_nodes.sort_by_key(|n| n.os_index);
        raw.gpus.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
        raw.gpus.dedup_by(|a, b| a.pci_bus_id == b.pci_bus_id);
        raw.io = self.io.finish(&raw.gpus, self.source)?;
        raw.allowed.cpus = super::cpus_of_all(&raw.numa_nodes, &[]);
        raw.allowed.numa_nodes = raw.numa_nodes.iter().map(|n| n.os_index).collect();
        raw.warnings.push(Warning {
            kind: WarningKind::MissingInformation,
            gpu: None,
            message: "NCCL topology files carry no sockets, cores, caches or memory sizes: each CPU counts as a core and each node as one cache".into(),
        });
        Ok(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"<system version="1">
  <cpu numaid="0" affinity="0000ffff" arch="x86_64">
    <pci busid="ffff:ff:01.0" class="0x060400">
      <pci busid="0000:07:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16"/>
    </pci>
  </cpu>
  <cpu numaid="1" affinity="ffff0000">
    <pci busid="0000:87:00.0" class="0x030200"><gpu dev="1" sm="80"/></pci>
    <pci busid="0000:88:00.0" class="0x020700"/>
  </cpu>
</system>"#;

    #[test]
    fn reads_nodes_and_gpus() {
        let raw = parse(SMALL, "t.xml", &ProbeOptions::default()).unwrap();
        assert_eq!(raw.numa_nodes.len(), 2);
        assert_eq!(raw.numa_nodes[1].cpus.to_cpulist(), "16-31");
        assert_eq!(raw.gpus.len(), 2);
        assert_eq!(raw.gpus[0].pci_bus_id, "0000:07:00.0");
        assert_eq!(raw.gpus[0].numa_node, Some(0));
        assert_eq!(raw.gpus[0].pcie.as_ref().unwrap().current_gen, Some(4));
        assert_eq!(raw.gpus[1].numa_node, Some(1));
        assert_eq!(raw.gpus[1].local_cpus.to_cpulist(), "16-31");
    }

    #[test]
    fn accelerator_ids_are_gpus_not_nics() {
        let xml = r#"<system><cpu numaid="0" affinity="ff">
          <pci busid="0000:01:00.0" class="0x030200"/>
          <pci busid="0000:02:00.0" class="0x020000" vendor="0x1b36" device="0x0005"/>
        </cpu></system>"#;
        let opts = ProbeOptions::default().with_accelerator_ids(vec![crate::topology::PciId {
            vendor: 0x1b36,
            device: Some(5),
        }]);
        let raw = parse(xml, "t.xml", &opts).unwrap();
        assert!(raw.io.devices.is_empty(), "an accelerator is not a NIC");
        assert_eq!((raw.gpus.len(), raw.io.gpus.len()), (2, 2));
        let raw = parse(xml, "t.xml", &ProbeOptions::default()).unwrap();
        assert_eq!((raw.gpus.len(), raw.io.devices.len()), (1, 1));
    }

    #[test]
    fn rejects_bad_files() {
        for bad in [
            "<system>",
            "<notsystem/>",
            "<system><cpu affinity=\"ff\"/></system>",
            "<system><cpu numaid=\"x\" affinity=\"ff\"/></system>",
            "<system><cpu numaid=\"0\" affinity=\"zz\"/></system>",
            "<system><cpu numaid=\"0\" affinity=\"ff\"><pci busid=\"nope\" class=\"0x030200\"/></cpu></system>",
            "<system><cpu numaid=\"99999999999\" affinity=\"ff\"/></system>",
        ] {
            let e = parse(bad, "t.xml", &ProbeOptions::default());
            assert!(e.is_err(), "{bad} should fail");
            assert!(e.unwrap_err().to_string().contains("t.xml"));
        }
    }
}
