//! An hwloc XML export read once, quickly, before hwloc builds anything
//! from it: every object counted against the limits ([`Census`], and the
//! hwloc XML bounds [`MAX_XML_OBJECTS`], [`MAX_XML_SIBLING_PAIRS`],
//! [`MAX_XML_DEPTH`]). Refusing a file therefore takes about as long as
//! reading it, and hwloc, which reads nested objects recursively, never
//! sees a file nested deeper than the bound.

use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;

use crate::topology::census::{Census, Function, PciIds};
use crate::topology::limits::{self, MAX_XML_DEPTH, MAX_XML_OBJECTS, MAX_XML_SIBLING_PAIRS};
use crate::topology::{PciId, TopologyError as Error};

type Result<T, E = Error> = std::result::Result<T, E>;

/// An element still open.
struct Open {
    /// Objects directly inside it so far.
    children: usize,
    /// For a PCI function, what it counts as so far.
    function: Option<Function>,
}

/// The attributes of an `<object>` that the counts need.
#[derive(Default)]
struct Attrs {
    kind: Vec<u8>,
    os_index: Option<u64>,
    pci_type: Option<PciIds>,
    osdev_type: Option<u32>,
}

/// Reads `xml` (named `source`) and counts its objects; the first count
/// over a limit is the error. `accelerators` are the PCI ids that count as
/// GPUs besides NVIDIA's.
pub(super) fn check(xml: &str, source: &str, accelerators: &[PciId]) -> Result<()> {
    let mut reader = Reader::from_str(xml);
    // hwloc judges the syntax; the counts need only the nesting.
    reader.config_mut().check_end_names = false;
    let mut count = Counts {
        census: Census::new(source, accelerators),
        open: Vec::new(),
        objects: 0,
        pairs: 0,
        source,
    };
    loop {
        let event = reader.read_event().map_err(|e| {
            Error::input(
                source,
                format!(
                    "not well-formed XML at byte {}: {e}",
                    reader.error_position()
                ),
                "give an hwloc XML export as `lstopo --of xml FILE` writes it",
            )
        })?;
        match event {
            Event::Start(e) => {
                let open = count.element(&e)?;
                count.open.push(open);
            }
            Event::Empty(e) => {
                count.element(&e)?;
            }
            Event::End(_) => {
                count.open.pop();
            }
            Event::Eof => return Ok(()),
            _ => {}
        }
    }
}

/// The counts of one file so far.
struct Counts<'a> {
    census: Census<'a>,
    open: Vec<Open>,
    objects: usize,
    /// Pairs of objects side by side so far.
    pairs: u64,
    source: &'a str,
}

impl Counts<'_> {
    /// An element starts: counted when it is an object.
    fn element(&mut self, e: &BytesStart<'_>) -> Result<Open> {
        if self.open.len() >= MAX_XML_DEPTH {
            return Err(limits::over(
                self.source,
                format!("its elements nest more than {MAX_XML_DEPTH} deep, the limit"),
            ));
        }
        let mut open = Open {
            children: 0,
            function: None,
        };
        if e.name().as_ref() != b"object" {
            return Ok(open);
        }
        self.objects += 1;
        if self.objects > MAX_XML_OBJECTS {
            return Err(limits::over(
                self.source,
                format!("it holds more than {MAX_XML_OBJECTS} objects, the limit"),
            ));
        }
        if let Some(parent) = self.open.last_mut() {
            self.pairs += parent.children as u64;
            parent.children += 1;
            if self.pairs > MAX_XML_SIBLING_PAIRS {
                return Err(limits::over(
                    self.source,
                    format!(
                        "more than {MAX_XML_SIBLING_PAIRS} pairs of its objects sit side by side (8,192 CPUs in one object make 33,550,336), the limit"
                    ),
                ));
            }
        }
        let a = attrs(e);
        match a.kind.as_slice() {
            b"PU" => self.census.cpu(a.os_index)?,
            b"NUMANode" => self.census.node(a.os_index)?,
            b"Bridge" => self.census.bridge()?,
            b"PCIDev" => open.function = Some(self.census.function(a.pci_type)?),
            b"OSDev" => self.os_device(a.osdev_type)?,
            _ => {}
        }
        Ok(open)
    }

    /// An OS device: a block device, network interface or verbs device
    /// makes the PCI function it is in a NIC or storage device.
    fn os_device(&mut self, osdev_type: Option<u32>) -> Result<()> {
        // hwloc's types: 0 block (storage), 2 network, 3 OpenFabrics.
        if !matches!(osdev_type, Some(0 | 2 | 3)) {
            return Ok(());
        }
        let Some(parent) = self.open.last_mut() else {
            return Ok(());
        };
        if parent.function == Some(Function::Other) {
            parent.function = Some(Function::Io);
            self.census.io_device()?;
        }
        Ok(())
    }
}

/// The attributes of `e` the counts need (others, and attributes that
/// cannot be read, are hwloc's to judge).
fn attrs(e: &BytesStart<'_>) -> Attrs {
    let mut out = Attrs::default();
    for a in e.attributes().with_checks(false).flatten() {
        let text = String::from_utf8_lossy(&a.value);
        match a.key.as_ref() {
            b"type" => out.kind = a.value.to_vec(),
            b"os_index" => out.os_index = text.trim().parse().ok(),
            b"pci_type" => out.pci_type = pci_type(&text),
            b"osdev_type" => out.osdev_type = text.trim().parse().ok(),
            _ => {}
        }
    }
    out
}

/// hwloc's `pci_type`: `0302 [10de:2330] [10de:16c1] a1` (class, vendor
/// and device, subsystem vendor and device, revision).
fn pci_type(text: &str) -> Option<PciIds> {
    let mut words = text.split_whitespace();
    let hex = |s: &str| u16::from_str_radix(s, 16).ok();
    let class = hex(words.next()?)?;
    let (vendor, device) = words
        .next()?
        .strip_prefix('[')?
        .strip_suffix(']')?
        .split_once(':')?;
    Some(PciIds {
        vendor: hex(vendor)?,
        device: hex(device)?,
        class,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_types_read_as_hwloc_writes_them() {
        assert_eq!(
            pci_type("0302 [10de:2330] [10de:16c1] a1"),
            Some(PciIds {
                vendor: 0x10de,
                device: 0x2330,
                class: 0x0302
            })
        );
        assert_eq!(pci_type("0302 10de:2330"), None);
        assert_eq!(pci_type(""), None);
    }

    #[test]
    fn nesting_and_objects_side_by_side_are_bounded() {
        let deep = format!(
            "<topology>{}{}</topology>",
            "<object type=\"Misc\">".repeat(MAX_XML_DEPTH),
            "</object>".repeat(MAX_XML_DEPTH)
        );
        let e = check(&deep, "t.xml", &[]).unwrap_err().to_string();
        assert!(e.contains("nest more than 128 deep"), "{e}");
        let side_by_side = |n: usize| {
            format!(
                "<topology><object type=\"Machine\">{}</object></topology>",
                "<object type=\"Misc\"/>".repeat(n)
            )
        };
        check(&side_by_side(8192), "t.xml", &[]).unwrap();
        let e = check(&side_by_side(11_586), "t.xml", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("pairs of its objects sit side by side"), "{e}");
        let nic = "<object type=\"PCIDev\" pci_type=\"0c03 [8086:0001] [0000:0000] 00\"><object type=\"OSDev\" osdev_type=\"2\"/><object type=\"OSDev\" osdev_type=\"3\"/></object>";
        let ok = format!(
            "<topology><object type=\"Machine\">{}</object></topology>",
            nic.repeat(4096)
        );
        check(&ok, "t.xml", &[]).unwrap();
        let over = ok.replace(
            "</object></topology>",
            &format!("{nic}</object></topology>"),
        );
        let e = check(&over, "t.xml", &[]).unwrap_err().to_string();
        assert!(e.contains("4097 NICs and storage devices"), "{e}");
    }
}
