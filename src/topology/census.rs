//! Counting what a description holds while it is read, before hwloc (or
//! anything else) builds a machine from it.
//!
//! hwloc takes time that grows faster than the file: 200,000 PUs in a 25 MB
//! XML export keep it busy for minutes before the limits of [`limits`] can
//! be checked on what it built. The readers therefore count what they meet
//! as they read: the hwloc XML reader each object (`hwloc::prescan`), the
//! capture reader the CPUs, nodes and PCI functions of the captured sysfs
//! (`capture::census`). The first count over a limit ends
//! the reading, so refusing takes about as long as reading the file.

use super::limits::{self, MAX_CPUS, MAX_GPUS, MAX_IO_DEVICES, MAX_NODES, MAX_PCI_NODES};
use super::{is_accelerator, PciId, TopologyError as Error};

type Result<T, E = Error> = std::result::Result<T, E>;

/// A PCI function's ids: vendor, device, and 16-bit class (`0x0302`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PciIds {
    pub vendor: u16,
    pub device: u16,
    pub class: u16,
}

/// What a PCI function counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Function {
    /// A GPU or chosen accelerator.
    Gpu,
    /// A NIC or storage device (its ids say so).
    Io,
    /// Anything else (it may still turn out to be a NIC or storage device
    /// by the OS devices below it: [`Census::io_device`]).
    Other,
}

/// The counts so far of one description.
#[derive(Debug)]
pub(crate) struct Census<'a> {
    source: &'a str,
    accelerators: &'a [PciId],
    cpus: usize,
    nodes: usize,
    pci: usize,
    gpus: usize,
    io: usize,
}

impl<'a> Census<'a> {
    /// Nothing counted yet of `source`; `accelerators` are the PCI ids
    /// that count as GPUs besides NVIDIA's.
    pub(crate) fn new(source: &'a str, accelerators: &'a [PciId]) -> Self {
        Self {
            source,
            accelerators,
            cpus: 0,
            nodes: 0,
            pci: 0,
            gpus: 0,
            io: 0,
        }
    }

    /// A CPU (an hwloc PU, a captured `cpuN`), with its number when known.
    pub(crate) fn cpu(&mut self, number: Option<u64>) -> Result<()> {
        if let Some(n) = number.filter(|&n| n >= u64::from(MAX_CPUS)) {
            return Err(limits::over(
                self.source,
                format!(
                    "it names CPU {n}, beyond the limit of {MAX_CPUS} CPUs (0-{})",
                    MAX_CPUS - 1
                ),
            ));
        }
        self.cpus += 1;
        limits::check_count(self.source, "CPUs", self.cpus, MAX_CPUS as usize)
    }

    /// A NUMA node, with its number when known.
    pub(crate) fn node(&mut self, number: Option<u64>) -> Result<()> {
        if let Some(n) = number {
            limits::check_node(self.source, "it", u32::try_from(n).unwrap_or(u32::MAX))?;
        }
        self.nodes += 1;
        limits::check_count(self.source, "NUMA nodes", self.nodes, MAX_NODES as usize)
    }

    /// A PCI bridge or switch.
    pub(crate) fn bridge(&mut self) -> Result<()> {
        self.pci += 1;
        limits::check_count(self.source, "PCI objects", self.pci, MAX_PCI_NODES)
    }

    /// A PCI function, with its ids when known: what it counts as.
    pub(crate) fn function(&mut self, ids: Option<PciIds>) -> Result<Function> {
        self.bridge()?;
        let Some(PciIds {
            vendor,
            device,
            class,
        }) = ids
        else {
            return Ok(Function::Other);
        };
        if is_accelerator(vendor, device, class, self.accelerators) {
            self.gpus += 1;
            limits::check_count(self.source, "GPUs", self.gpus, MAX_GPUS)?;
            return Ok(Function::Gpu);
        }
        if super::iodev::is_io_device(vendor, device, class) {
            self.io_device()?;
            return Ok(Function::Io);
        }
        Ok(Function::Other)
    }

    /// A PCI function found to be a NIC or storage device by the OS devices
    /// below it.
    pub(crate) fn io_device(&mut self) -> Result<()> {
        self.io += 1;
        limits::check_count(
            self.source,
            "NICs and storage devices",
            self.io,
            MAX_IO_DEVICES,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_count_stops_at_its_limit() {
        let mut c = Census::new("t.xml", &[]);
        for i in 0..MAX_CPUS {
            c.cpu(Some(u64::from(i))).unwrap();
        }
        let e = c.cpu(None).unwrap_err().to_string();
        assert!(e.contains("8193 CPUs, more than the limit of 8192"), "{e}");
        let e = Census::new("t.xml", &[]).cpu(Some(8192)).unwrap_err();
        assert!(e.to_string().contains("CPU 8192, beyond the limit"), "{e}");
        let e = Census::new("t.xml", &[]).node(Some(1 << 40)).unwrap_err();
        assert!(e.to_string().contains("0-1023"), "{e}");

        let gpu = PciIds {
            vendor: 0x10de,
            device: 0x2330,
            class: 0x0302,
        };
        let nic = PciIds {
            vendor: 0x15b3,
            device: 0x1021,
            class: 0x0207,
        };
        let usb = PciIds {
            vendor: 0x8086,
            device: 0x1,
            class: 0x0c03,
        };
        let mut c = Census::new("t.xml", &[]);
        assert_eq!(c.function(Some(gpu)).unwrap(), Function::Gpu);
        assert_eq!(c.function(Some(nic)).unwrap(), Function::Io);
        assert_eq!(c.function(Some(usb)).unwrap(), Function::Other);
        assert_eq!(c.function(None).unwrap(), Function::Other);
        for _ in 1..MAX_GPUS {
            c.function(Some(gpu)).unwrap();
        }
        let e = c.function(Some(gpu)).unwrap_err().to_string();
        assert!(e.contains("1025 GPUs"), "{e}");
        for _ in 2..=MAX_IO_DEVICES {
            c.io_device().unwrap();
        }
        let e = c.function(Some(nic)).unwrap_err().to_string();
        assert!(e.contains("4097 NICs and storage devices"), "{e}");
    }
}
