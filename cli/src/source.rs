//! What the commands that read a machine share: where the description
//! comes from ([`TopoSource`]: this machine, or a saved one with
//! `--input`) and how CPUs are chosen ([`ModeArg`]).

use crate::error::Result;
use numapin::topology::{CudaMode, PciId, ProbeOptions, Topology};

/// How CPUs are chosen (`--mode`): the library's
/// [`numapin::affinity::Mode`], with its help text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ModeArg {
    /// Every allowed CPU of the GPU's NUMA node; memory on that node.
    Node,
    /// Every allowed CPU of the GPU's package (all of its nodes under
    /// SNC/NPS); memory on the package's nodes.
    Socket,
    /// The node's allowed physical cores divided into disjoint, contiguous
    /// shares among the ranks whose GPUs share the node.
    Exclusive,
    /// One last-level cache (core complex, L3 domain) of the node per rank.
    #[value(alias = "core-complex")]
    Cache,
    /// One physical core of the node per rank.
    Core,
}

impl From<ModeArg> for numapin::affinity::Mode {
    fn from(m: ModeArg) -> Self {
        use numapin::affinity::Mode;
        match m {
            ModeArg::Node => Mode::Node,
            ModeArg::Socket => Mode::Socket,
            ModeArg::Exclusive => Mode::Exclusive,
            ModeArg::Cache => Mode::Cache,
            ModeArg::Core => Mode::Core,
        }
    }
}

/// Options shared by every command that reads a topology.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct TopoSource {
    /// Describe a saved machine instead of this one: an hwloc XML export,
    /// a `numapin topo --json` file, an NCCL topology XML, or a captured
    /// filesystem root (folder, .tar.gz or .tar.bz2); `-` reads standard
    /// input. At most 64 MiB, 8192 CPUs, 1024 NUMA nodes, 1024 GPUs, 4096
    /// NICs and storage devices.
    #[arg(long, value_name = "PATH")]
    pub(crate) input: Option<std::path::PathBuf>,
    /// Treat PCI devices with this id as accelerators too (VENDOR or
    /// VENDOR:DEVICE in hex, as `lspci -n` prints; repeatable). A VENDOR
    /// alone matches all its devices but bridges.
    #[arg(long = "accelerator-pci-id", value_name = "VENDOR[:DEVICE]", value_parser = parse_pci_id)]
    pub(crate) accelerator_pci_id: Vec<PciId>,
    /// Do not load the CUDA driver (ordinals are then assumed from PCI order).
    #[arg(long)]
    pub(crate) no_cuda: bool,
}

fn parse_pci_id(s: &str) -> Result<PciId, String> {
    PciId::parse(s)
}

impl TopoSource {
    /// The probe options these flags ask for, with this process's environment.
    pub(crate) fn options(&self) -> ProbeOptions {
        let mut o = ProbeOptions::from_process();
        o.accelerator_ids = self.accelerator_pci_id.clone();
        if self.no_cuda {
            o.cuda = CudaMode::Off;
        }
        o
    }

    /// Probes this machine or reads `--input`.
    pub(crate) fn topology(&self) -> Result<Topology> {
        self.topology_with(&self.options())
    }

    /// Probes this machine or reads `--input`, with options `o`.
    pub(crate) fn topology_with(&self, o: &ProbeOptions) -> Result<Topology> {
        Ok(match &self.input {
            Some(p) => Topology::load(p, o)?,
            None => Topology::probe(o)?,
        })
    }
}
