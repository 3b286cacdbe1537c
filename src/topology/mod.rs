//! The topology probe: which GPU hangs off which socket, NUMA node and CPUs,
//! within what this process may use.
//!
//! A [`Topology`] is built live ([`Topology::probe`]) or from a saved file
//! ([`Topology::load`]: hwloc XML, numapin JSON, NCCL topology XML, or a
//! captured filesystem root). Discovery goes through hwloc (I/O objects
//! enabled); GPUs come from the CUDA driver when it is present, matched to
//! hwloc's PCI objects by bus id, and otherwise are the NVIDIA display and 3D
//! controllers (vendor `0x10de`, class `0x0300`/`0x0302`) in PCI bus order.
//!
//! A GPU's locality is the CPU set and node set of its first non-I/O
//! ancestor. When the firmware gives none (sysfs `numa_node` = -1, as on
//! cloud VMs), that ancestor is the whole machine: on a multi-node machine the
//! GPU's `numa_node` is then `None` and a [`WarningKind::GpuLocalityUnknown`]
//! warning says so, never a silent node 0.
//!
//! The JSON form of a `Topology` (`numapin topo --json`) is documented in
//! `docs/topology-json.md`; its field names are stable.
// Functions short enough to read at once: the readers, the finishing and
// the checks are written as named steps.
#![warn(clippy::too_many_lines)]

mod capture;
mod census;
mod error;
mod finish;
pub(crate) mod hwloc;
mod input;
mod iodev;
pub mod limits;
mod nccl;
mod pcie;
mod text;
mod validate;
pub mod visible;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cpulist::CpuList;
use crate::gpu::{CudaOrdinal, GpuIndex};

pub use crate::platform::numa::MAX_NODES;
pub use crate::platform::pci::normalize_bus_id;
pub use error::{Cause, TopologyError};
pub use hwloc::export_live_xml;
pub use iodev::{DeviceKind, IoDevice, NicChoice, Relation};
pub use visible::{DeviceOrder, VisibleDevices, VisibleEntry};

use TopologyError as Error;

type Result<T, E = TopologyError> = std::result::Result<T, E>;

/// The version of the JSON schema written by [`Topology::to_json`].
pub const SCHEMA_VERSION: u32 = 1;

/// One machine's sockets, NUMA nodes, cores, caches and GPUs, and what this
/// process may use of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    /// Version of this JSON schema ([`SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// `"live"` for this machine, otherwise the path of the file read.
    pub source: String,
    /// Processor packages (sockets), in logical order.
    #[serde(deserialize_with = "limits::listed::packages")]
    pub packages: Vec<Package>,
    /// NUMA nodes, by ascending OS index.
    #[serde(deserialize_with = "limits::listed::nodes")]
    pub numa_nodes: Vec<NumaNode>,
    /// GPUs (and chosen accelerators), in PCI bus id order.
    #[serde(deserialize_with = "limits::listed::gpus")]
    pub gpus: Vec<Gpu>,
    /// The CPUs and nodes this process may use.
    pub allowed: Allowed,
    /// Things a person should read: unknown locality, restricted CPUs, ...
    pub warnings: Vec<Warning>,
    /// Physical cores with their hardware threads, when known (empty for
    /// sources that carry no core information, such as NCCL XML).
    #[serde(default, deserialize_with = "limits::listed::cores")]
    pub cores: Vec<Core>,
    /// Last-level caches, when known.
    #[serde(default, deserialize_with = "limits::listed::caches")]
    pub caches: Vec<Cache>,
    /// How CUDA ordinals were worked out.
    #[serde(default)]
    pub cuda: CudaInfo,
    /// Network devices (InfiniBand, RoCE, EFA, Ethernet, ...) in PCI bus id
    /// order, each with its relation to every GPU (empty when the source
    /// has none, or was written before numapin read them).
    #[serde(default, deserialize_with = "limits::listed::io_devices")]
    pub nics: Vec<IoDevice>,
    /// Storage devices (NVMe drives, SATA/SAS/RAID controllers, ...) in PCI
    /// bus id order, each with its relation to every GPU.
    #[serde(default, deserialize_with = "limits::listed::io_devices")]
    pub storage: Vec<IoDevice>,
}

/// A processor package (socket).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Package {
    /// Logical index (0, 1, ...).
    pub index: u32,
    /// All CPUs of the package (including ones this process may not use).
    pub cpus: CpuList,
    /// OS indexes of the NUMA nodes in the package.
    #[serde(deserialize_with = "limits::listed::nodes")]
    pub numa_nodes: Vec<u32>,
}

/// What a NUMA node holds, beyond ordinary CPUs-and-memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    /// CPUs and ordinary memory.
    #[default]
    Normal,
    /// Memory but no CPUs (CXL, HBM, persistent memory, ...).
    Cpuless,
    /// No memory (with or without CPUs).
    Memoryless,
    /// Memory that belongs to a GPU (Grace Hopper / Grace Blackwell HBM).
    GpuMemory,
}

/// A NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    /// The node number the kernel uses (`/sys/devices/system/node/nodeN`).
    pub os_index: u32,
    /// Logical index of the package holding the node, when known.
    pub package: Option<u32>,
    /// The node's own CPUs (empty for a node without CPUs).
    pub cpus: CpuList,
    /// Memory on the node, in bytes (0 when memoryless or unknown), huge
    /// page pools left out as hwloc counts it. A live probe that finds one
    /// node with memory gives it the machine's (`/proc/meminfo`) when the
    /// node's own figure is short by more than an eighth, with a warning
    /// (VMs whose memory was added after boot).
    pub memory_bytes: u64,
    /// Distances from this node to each node of [`Topology::numa_nodes`], in
    /// the same order (empty when unknown).
    #[serde(deserialize_with = "limits::listed::distances")]
    pub distances: Vec<u32>,
    /// What the node holds.
    #[serde(default)]
    pub kind: NodeKind,
}

/// A PCIe link's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct PcieLink {
    /// Generation the link runs at now (1-6), when known.
    pub current_gen: Option<u8>,
    /// Lanes the link runs with now, when known.
    pub current_width: Option<u8>,
    /// Highest generation the device supports, when known.
    pub max_gen: Option<u8>,
    /// Most lanes the device supports, when known.
    pub max_width: Option<u8>,
    /// Link bandwidth in GB/s as hwloc reports it, when known.
    pub speed_gbps: Option<f32>,
}

/// A GPU (or a PCI device chosen as an accelerator).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// Position in [`Topology::gpus`] (PCI bus id order).
    pub index: GpuIndex,
    /// The CUDA ordinal this process sees the GPU as (first one, for MIG),
    /// `None` when it is hidden by `CUDA_VISIBLE_DEVICES` or unknown.
    pub cuda_ordinal: Option<CudaOrdinal>,
    /// PCI bus id, `0000:07:00.0` form.
    pub pci_bus_id: String,
    /// Product name, when the driver (or the file) gives it.
    pub name: Option<String>,
    /// `GPU-...` UUID, when the driver (or the file) gives it.
    pub uuid: Option<String>,
    /// The NUMA node the GPU hangs off, `None` when unknown.
    pub numa_node: Option<u32>,
    /// Logical index of the package the GPU hangs off, `None` when unknown.
    pub package: Option<u32>,
    /// The CPUs near the GPU (the whole machine when locality is unknown).
    pub local_cpus: CpuList,
    /// PCIe link, when known.
    pub pcie: Option<PcieLink>,
    /// PCI vendor id (`0x10de` for NVIDIA).
    #[serde(default)]
    pub vendor_id: String,
    /// PCI device id.
    #[serde(default)]
    pub device_id: String,
    /// PCI class (`0x0302` 3D controller, `0x0300` VGA).
    #[serde(default)]
    pub class_id: String,
}

/// What this process may use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Allowed {
    /// CPUs this process may run on (`sched_getaffinity`, which reflects
    /// cgroups and taskset; for files, what the capture recorded).
    pub cpus: CpuList,
    /// NUMA nodes this process may allocate on.
    #[serde(deserialize_with = "limits::listed::nodes")]
    pub numa_nodes: Vec<u32>,
}

/// A physical core and its hardware threads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Core {
    /// The core's hardware threads (PUs).
    pub cpus: CpuList,
    /// The NUMA node holding the core, when known.
    pub numa_node: Option<u32>,
}

/// A last-level cache (an AMD core complex, an Intel L3 domain).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cache {
    /// Cache level (3 for an L3).
    pub level: u8,
    /// Size in bytes, when known.
    pub size_bytes: Option<u64>,
    /// CPUs sharing the cache.
    pub cpus: CpuList,
}

/// How the CUDA ordinals in [`Gpu::cuda_ordinal`] were worked out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CudaInfo {
    /// The CUDA driver's version (`12080` for 12.8), when it was loaded.
    pub driver_version: Option<u32>,
    /// `"driver"` when the CUDA driver enumerated the devices; `"pci_order"`
    /// when numapin assumed CUDA's order from PCI bus order; `"none"` when
    /// there are no GPUs.
    pub ordinal_source: String,
    /// The value of `CUDA_VISIBLE_DEVICES`, if set.
    pub visible_devices: Option<String>,
    /// `FASTEST_FIRST` (CUDA's default) or `PCI_BUS_ID`.
    pub device_order: String,
    /// Each ordinal the process sees and the GPU it maps to.
    #[serde(deserialize_with = "limits::listed::ordinals")]
    pub ordinals: Vec<VisibleEntry>,
}

/// What a warning is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WarningKind {
    /// A GPU's NUMA node is unknown on a multi-node machine.
    GpuLocalityUnknown,
    /// The allowed CPU set excludes some of a GPU's local CPUs.
    GpuCpusPartlyExcluded,
    /// The allowed CPU set excludes all of a GPU's local CPUs.
    GpuCpusExcluded,
    /// The allowed node set excludes a GPU's node.
    GpuNodeExcluded,
    /// The CUDA driver was not found or failed: ordinals are assumed.
    CudaUnavailable,
    /// Something about `CUDA_VISIBLE_DEVICES` / `CUDA_DEVICE_ORDER`.
    CudaVisibleDevices,
    /// A CUDA device could not be matched to a PCI device.
    UnmatchedCudaDevice,
    /// The source lacks some information (cores, caches, packages, ...).
    MissingInformation,
}

/// A warning a person should read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Warning {
    /// What it is about.
    pub kind: WarningKind,
    /// The GPU it concerns, if any ([`Gpu::index`]).
    pub gpu: Option<GpuIndex>,
    /// The sentence a person reads.
    pub message: String,
}

/// Which CUDA driver use the live probe makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CudaMode {
    /// Use the driver when it can be loaded, otherwise fall back to PCI.
    #[default]
    Auto,
    /// Never load the CUDA driver.
    Off,
}

/// A PCI id (vendor, and optionally device) to treat as an accelerator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciId {
    /// PCI vendor id.
    pub vendor: u16,
    /// PCI device id; `None` matches every device of the vendor but its
    /// bridges.
    pub device: Option<u16>,
}

impl PciId {
    /// Parses `VENDOR` or `VENDOR:DEVICE` (hexadecimal, `0x` optional), as
    /// `lspci -n` prints them.
    ///
    /// # Errors
    ///
    /// A sentence naming `text` when it is not a hexadecimal vendor id,
    /// optionally with a device id.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let hex = |s: &str| {
            let s = s.trim();
            let s = s.strip_prefix("0x").unwrap_or(s);
            if s.is_empty() || s.len() > 4 {
                return Err(format!(
                    "`{text}`: expected VENDOR[:DEVICE] in hexadecimal, like 10de or 1b36:0005"
                ));
            }
            u16::from_str_radix(s, 16).map_err(|_| {
                format!("`{text}`: expected VENDOR[:DEVICE] in hexadecimal, like 10de or 1b36:0005")
            })
        };
        match text.split_once(':') {
            Some((v, d)) => Ok(Self {
                vendor: hex(v)?,
                device: Some(hex(d)?),
            }),
            None => Ok(Self {
                vendor: hex(text)?,
                device: None,
            }),
        }
    }

    /// Whether a device matches.
    pub fn matches(&self, vendor: u16, device: u16) -> bool {
        self.vendor == vendor && self.device.is_none_or(|d| d == device)
    }
}

/// The environment variables the probe reads, captured so tests can set them
/// without touching the process environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeEnv {
    /// `CUDA_VISIBLE_DEVICES`.
    pub cuda_visible_devices: Option<String>,
    /// `CUDA_DEVICE_ORDER`.
    pub cuda_device_order: Option<String>,
}

impl ProbeEnv {
    /// Reads the variables from this process's environment. A value that is
    /// not valid UTF-8 is kept lossily, so the parser can name it.
    pub fn from_process() -> Self {
        let get = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
        Self {
            cuda_visible_devices: get("CUDA_VISIBLE_DEVICES"),
            cuda_device_order: get("CUDA_DEVICE_ORDER"),
        }
    }
}

/// Options of the probe (start from [`ProbeOptions::from_process`] or
/// `ProbeOptions::default()`).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ProbeOptions {
    /// Whether to load the CUDA driver (live probe only).
    pub cuda: CudaMode,
    /// PCI ids treated as accelerators in addition to NVIDIA GPUs.
    pub accelerator_ids: Vec<PciId>,
    /// The CUDA variables to honour.
    pub env: ProbeEnv,
}

with_setters!(ProbeOptions {
    with_cuda => cuda: CudaMode,
    with_accelerator_ids => accelerator_ids: Vec<PciId>,
    with_env => env: ProbeEnv,
});

impl ProbeOptions {
    /// Options for this process: CUDA auto, its own environment.
    pub fn from_process() -> Self {
        Self {
            env: ProbeEnv::from_process(),
            ..Self::default()
        }
    }
}

/// What a file given to [`Topology::load`] turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputFormat {
    /// An hwloc XML export (`lstopo --of xml`).
    HwlocXml,
    /// A numapin JSON file (`numapin topo --json`).
    NumapinJson,
    /// An NCCL topology XML (`NCCL_TOPO_FILE`).
    NcclXml,
    /// A captured filesystem root (folder or tarball holding `sys/` and `proc/`).
    FsRoot,
}

impl Topology {
    /// Bytes of last-level cache shared by `cpus`: the sum of the
    /// last-level caches that hold at least one of them (0 when the source
    /// records no cache sizes). The staged copy and the storage reader size
    /// their slots by it.
    pub fn last_level_cache_bytes(&self, cpus: &CpuList) -> u64 {
        self.caches
            .iter()
            .filter(|c| !c.cpus.intersection(cpus).is_empty())
            .filter_map(|c| c.size_bytes)
            .fold(0u64, u64::saturating_add)
    }

    /// Probes this machine.
    ///
    /// # Errors
    ///
    /// [`TopologyError::Env`] for a `HWLOC_*` variable that would describe
    /// something else than this machine, or a
    /// `CUDA_VISIBLE_DEVICES`/`CUDA_DEVICE_ORDER` numapin cannot read;
    /// [`TopologyError::System`] when hwloc cannot discover the machine;
    /// [`TopologyError::Input`] when what it finds is over the [`limits`].
    ///
    /// # Examples
    ///
    /// ```
    /// use numapin::topology::{CudaMode, ProbeOptions, Topology};
    ///
    /// // ProbeOptions::from_process() alone also asks the CUDA driver for
    /// // the GPUs this process sees; CudaMode::Off reads the PCI bus only.
    /// let t = Topology::probe(&ProbeOptions::from_process().with_cuda(CudaMode::Off))?;
    /// assert_eq!(t.source, "live");
    /// assert!(!t.numa_nodes.is_empty() && !t.allowed.cpus.is_empty());
    /// for gpu in &t.gpus {
    ///     println!("GPU {} {} on node {:?}", gpu.index, gpu.pci_bus_id, gpu.numa_node);
    /// }
    /// for w in &t.warnings {
    ///     println!("{}", w.message);
    /// }
    /// # Ok::<(), numapin::topology::TopologyError>(())
    /// ```
    pub fn probe(opts: &ProbeOptions) -> Result<Self> {
        let mut raw = hwloc::discover_live(opts)?;
        let total = crate::platform::sys::mem_total();
        if let Some(w) = finish::only_node_memory(&mut raw.numa_nodes, total) {
            raw.warnings.push(w);
        }
        let cuda = if opts.cuda == CudaMode::Auto {
            Some(crate::platform::cuda::enumerate())
        } else {
            None
        };
        finish::finish(raw, "live".into(), opts, cuda, true)
    }

    /// Describes a saved machine: the format is detected by content. `path`
    /// is a regular file, a folder (a captured root) or `-` for standard
    /// input (read once); every input is held to the bounds of [`limits`].
    ///
    /// # Errors
    ///
    /// [`TopologyError::Input`] naming the file for one that cannot be read, is
    /// of no known format, does not parse, is over the [`limits`] or
    /// contradicts itself; [`TopologyError::System`] when this process or
    /// machine fails reading it (too many open files, no memory, an I/O error
    /// of the device, hwloc's reader process).
    ///
    /// # Examples
    ///
    /// A DGX H100 as `lstopo --of xml` saved it (in numapin's repository):
    ///
    /// ```
    /// use std::path::Path;
    /// use numapin::topology::{ProbeOptions, Topology};
    ///
    /// let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("topology/dgx-h100.xml");
    /// let t = Topology::load(&path, &ProbeOptions::default())?;
    /// assert_eq!((t.numa_nodes.len(), t.gpus.len()), (2, 8));
    /// // Four GPUs per socket; GPU 7 hangs off node 1.
    /// assert_eq!(t.gpus[7].numa_node, Some(1));
    /// assert_eq!(t.gpus[7].local_cpus.to_cpulist(), "56-111,168-223");
    /// # Ok::<(), numapin::topology::TopologyError>(())
    /// ```
    pub fn load(path: &Path, opts: &ProbeOptions) -> Result<Self> {
        let source = input::shown(path);
        let data = match input::read(path)? {
            input::Input::Folder(dir) => {
                let cap = capture::folder(&dir, &source)?;
                let raw = hwloc::discover_fsroot(&cap.root, &source, opts)?;
                drop(cap);
                return finish_file(raw, source, opts);
            }
            input::Input::Bytes(b) => b,
        };
        match detect_bytes(&data, &source)? {
            InputFormat::NumapinJson => {
                let text = utf8(&data, &source)?;
                Self::from_json_str(text, &source)
            }
            InputFormat::HwlocXml => {
                // hwloc's XML is UTF-8; a stray byte is kept as U+FFFD.
                let text = String::from_utf8_lossy(&data);
                let raw = hwloc::discover_xml(&text, &source, opts)?;
                finish_file(raw, source, opts)
            }
            InputFormat::FsRoot => {
                let cap = capture::archive(&data, &source)?;
                drop(data);
                let raw = hwloc::discover_fsroot(&cap.root, &source, opts)?;
                drop(cap);
                finish_file(raw, source, opts)
            }
            InputFormat::NcclXml => {
                let text = utf8(&data, &source)?;
                let raw = nccl::parse(text, &source, opts)?;
                finish_file(raw, source, opts)
            }
        }
    }

    /// A numapin JSON description, checked as [`Topology::load`] checks a
    /// file (`source` names it in errors and becomes [`Topology::source`]).
    ///
    /// # Errors
    ///
    /// [`TopologyError::Input`] naming `source` for JSON that does not parse as
    /// a numapin description, goes over the [`limits`] or contradicts itself.
    pub fn from_json_str(text: &str, source: &str) -> Result<Self> {
        let parsed = crate::cpulist::with_budget(limits::MAX_LISTED_CPUS, || {
            serde_json::from_str::<Topology>(text)
        });
        let mut t = parsed.map_err(|e| Error::Input {
            input: source.to_string(),
            problem: "not a valid numapin topology JSON file".into(),
            fix: "give a file written by `numapin topo --json`".into(),
            source: Some(e.into()),
        })?;
        if t.schema_version != SCHEMA_VERSION {
            return Err(Error::input(
                source,
                format!(
                    "schema_version {} is not supported (this numapin reads {SCHEMA_VERSION})",
                    t.schema_version
                ),
                "write the file again with this version of `numapin topo --json`",
            ));
        }
        validate::check(&t, source)?;
        t.source = source.to_string();
        Ok(t)
    }

    /// The JSON text of `numapin topo --json`.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a Topology always serializes")
    }

    /// The node with this OS index.
    pub fn node(&self, os_index: u32) -> Option<&NumaNode> {
        self.numa_nodes.iter().find(|n| n.os_index == os_index)
    }

    /// The package with this logical index.
    pub fn package(&self, index: u32) -> Option<&Package> {
        self.packages.iter().find(|p| p.index == index)
    }

    /// The GPU with this index ([`Gpu::index`]).
    pub fn gpu(&self, index: GpuIndex) -> Option<&Gpu> {
        self.gpus.get(index.as_usize())
    }

    /// What this process sees as CUDA ordinal `ordinal`: the
    /// `CUDA_VISIBLE_DEVICES` entry and the GPU it is
    /// ([`VisibleEntry::gpu`], `None` when it cannot be matched to a PCI
    /// device without the driver); `None` when this process sees no such
    /// device. The one lookup from a CUDA ordinal to a GPU: everything
    /// else ([`Topology::gpu_by_ordinal`], `Runtime::place`, the launcher
    /// helpers) asks it.
    pub fn visible_entry(&self, ordinal: CudaOrdinal) -> Option<&VisibleEntry> {
        self.cuda.ordinals.iter().find(|e| e.ordinal == ordinal)
    }

    /// The GPU this process sees as CUDA ordinal `ordinal` (see
    /// [`Topology::visible_entry`]).
    pub fn gpu_by_ordinal(&self, ordinal: CudaOrdinal) -> Option<&Gpu> {
        self.gpu(self.visible_entry(ordinal)?.gpu?)
    }

    /// The CUDA ordinal this process sees GPU `index` as, `None` when it is
    /// hidden (`CUDA_VISIBLE_DEVICES`) or not known.
    pub fn ordinal_of(&self, index: GpuIndex) -> Option<CudaOrdinal> {
        self.gpu(index)?.cuda_ordinal
    }

    /// Each GPU's nearest NICs (one list per entry of [`Topology::gpus`],
    /// preferred first; empty lists when there is no NIC).
    ///
    /// RDMA NICs (InfiniBand, RoCE, EFA, Omni-Path, Slingshot) are paired
    /// when there are any, otherwise every NIC. Each GPU's candidates are
    /// the NICs at its best [`Relation`]; GPUs with the same best relation
    /// and the same candidates share them evenly, in order: 8 GPUs and 8
    /// NICs pair one to one, 8 GPUs and 4 NICs two to one (neighbouring
    /// GPUs share), 4 GPUs and 8 NICs two NICs each. The pairing covers
    /// every GPU whatever `CUDA_VISIBLE_DEVICES` hides, so every rank on a
    /// machine computes the same one.
    pub fn nic_pairing(&self) -> Vec<Vec<NicChoice>> {
        iodev::pair(&self.nics, self.gpus.len())
    }

    /// The text report `numapin topo` prints: the GPU table, the GPU-by-GPU
    /// locality matrix (with a column per NIC), the NICs and storage
    /// devices, the nodes, the packages and the CUDA ordinals.
    pub fn to_text(&self) -> String {
        text::render(self)
    }

    /// All CPUs of the machine.
    pub fn all_cpus(&self) -> CpuList {
        cpus_of_all(&self.numa_nodes, &self.packages)
    }

    /// The NUMA node that holds `cpu`, if known.
    pub fn node_of_cpu(&self, cpu: u32) -> Option<u32> {
        self.numa_nodes
            .iter()
            .find(|n| n.cpus.contains(cpu))
            .map(|n| n.os_index)
    }
}

/// The intermediate description produced by each reader, before ordinals and
/// warnings are worked out.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct RawTopology {
    pub packages: Vec<Package>,
    pub numa_nodes: Vec<NumaNode>,
    pub gpus: Vec<RawGpu>,
    pub allowed: Allowed,
    pub cores: Vec<Core>,
    pub caches: Vec<Cache>,
    pub warnings: Vec<Warning>,
    /// The PCI tree with the NICs and drives (empty for sources without).
    #[serde(default)]
    pub io: iodev::RawIo,
}

/// A GPU as a reader found it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct RawGpu {
    pub pci_bus_id: String,
    pub vendor: u16,
    pub device: u16,
    pub class: u16,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub numa_node: Option<u32>,
    pub package: Option<u32>,
    pub local_cpus: CpuList,
    pub pcie: Option<PcieLink>,
}

/// Whether a PCI device is a GPU or a chosen accelerator. A vendor-only id
/// never matches the vendor's bridges (base class 0x06: host bridges, PCIe
/// switch and root ports), which carry accelerators rather than being ones.
pub(crate) fn is_accelerator(vendor: u16, device: u16, class: u16, extra: &[PciId]) -> bool {
    let bridge = class >> 8 == 0x06;
    (vendor == 0x10de && (class == 0x0300 || class == 0x0302))
        || extra
            .iter()
            .any(|id| id.matches(vendor, device) && (id.device.is_some() || !bridge))
}

/// Every CPU of `nodes` and `packages`.
pub(crate) fn cpus_of_all(nodes: &[NumaNode], packages: &[Package]) -> CpuList {
    let mut all = CpuList::new();
    for n in nodes {
        all = all.union(&n.cpus);
    }
    for p in packages {
        all = all.union(&p.cpus);
    }
    all
}

/// A reader's description of a file, finished and checked.
fn finish_file(raw: RawTopology, source: String, opts: &ProbeOptions) -> Result<Topology> {
    let t = finish::finish(raw, source, opts, None, false)?;
    validate::check(&t, &t.source)?;
    Ok(t)
}

fn utf8<'a>(data: &'a [u8], source: &str) -> Result<&'a str> {
    std::str::from_utf8(data).map_err(|_| {
        Error::input(
            source,
            "the file is not UTF-8 text",
            "give an hwloc XML export, a numapin JSON file, an NCCL topology XML or a captured sysfs root",
        )
    })
}

/// Works out what kind of description a path holds (reading it as
/// [`Topology::load`] does).
///
/// # Errors
///
/// As [`Topology::load`] reading the file, and [`TopologyError::Input`] when it
/// is of no known format.
pub fn detect_format(path: &Path) -> Result<InputFormat> {
    match input::read(path)? {
        input::Input::Folder(_) => Ok(InputFormat::FsRoot),
        input::Input::Bytes(b) => detect_bytes(&b, &input::shown(path)),
    }
}

/// Works out what kind of description `data` is, from its start.
fn detect_bytes(data: &[u8], source: &str) -> Result<InputFormat> {
    let head = &data[..data.len().min(4096)];
    if head.starts_with(b"BZh") || head.starts_with(&[0x1f, 0x8b]) || is_tar(head) {
        return Ok(InputFormat::FsRoot);
    }
    let text = String::from_utf8_lossy(head);
    let t = text.trim_start_matches('\u{feff}').trim_start();
    if t.starts_with('{') {
        return Ok(InputFormat::NumapinJson);
    }
    if t.contains("<topology") || t.contains("hwloc") && t.contains("<object") {
        return Ok(InputFormat::HwlocXml);
    }
    if t.contains("<system") {
        return Ok(InputFormat::NcclXml);
    }
    Err(Error::input(
        source,
        "the file is not a topology description numapin knows",
        "give an hwloc XML export (`lstopo --of xml`), a file from `numapin topo --json`, an NCCL topology XML (NCCL_TOPO_DUMP_FILE), or a filesystem root captured by hwloc-gather-topology (folder, .tar.gz or .tar.bz2)",
    ))
}

fn is_tar(head: &[u8]) -> bool {
    head.len() > 262 && &head[257..262] == b"ustar"
}

/// Entry points for the fuzz targets in `fuzz/` (not a stable API).
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// Reads NCCL topology XML from a string, as `Topology::load` would.
    pub fn load_nccl_str(text: &str) -> Result<Topology> {
        let opts = ProbeOptions::default();
        let raw = nccl::parse(text, "fuzz.xml", &opts)?;
        finish_file(raw, "fuzz.xml".into(), &opts)
    }

    /// Reads numapin JSON from a string, as `Topology::load` would.
    pub fn load_json_str(text: &str) -> Result<Topology> {
        Topology::from_json_str(text, "fuzz.json")
    }

    /// Surveys, unpacks and checks a capture archive (its bytes), as
    /// `Topology::load` would before hwloc reads it; the unpacked folder is
    /// removed again. Returns how many entries the unpacked root holds.
    pub fn unpack_capture(bytes: &[u8]) -> Result<usize> {
        let cap = capture::archive(bytes, "fuzz.tar")?;
        let n = std::fs::read_dir(&cap.root).map_or(0, |d| d.count());
        Ok(n)
    }
}

/// Where a file given with `--input` came from; kept so callers can print it.
pub fn source_path(t: &Topology) -> Option<PathBuf> {
    (t.source != "live").then(|| PathBuf::from(&t.source))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(os_index: u32, memory_bytes: u64, kind: NodeKind) -> NumaNode {
        NumaNode {
            os_index,
            package: Some(0),
            cpus: CpuList::default(),
            memory_bytes,
            distances: Vec::new(),
            kind,
        }
    }

    /// One node with memory holds all of the machine's: a VM whose node
    /// reports less (4.3 of 126 GiB, seen) gets the machine's total and a
    /// warning; several nodes, a node that reports enough, or no total
    /// leave the figures alone.
    #[test]
    fn the_only_node_with_memory_holds_the_machines() {
        const GIB: u64 = 1 << 30;
        let mut one = vec![node(0, 4 * GIB, NodeKind::Normal)];
        let w = finish::only_node_memory(&mut one, Some(126 * GIB)).expect("a warning");
        assert_eq!(one[0].memory_bytes, 126 * GIB);
        assert!(
            w.message.contains("4.0 GiB") && w.message.contains("126.0 GiB"),
            "{}",
            w.message
        );
        // A GPU's memory node beside it is no second node, and its memory
        // (counted in MemTotal where online) is not the CPUs' node's.
        let mut gpu = vec![
            node(0, 4 * GIB, NodeKind::Normal),
            node(1, 80 * GIB, NodeKind::GpuMemory),
        ];
        assert!(finish::only_node_memory(&mut gpu, Some(126 * GIB)).is_some());
        assert_eq!(
            (gpu[0].memory_bytes, gpu[1].memory_bytes),
            (46 * GIB, 80 * GIB)
        );
        let mut full = vec![
            node(0, 46 * GIB, NodeKind::Normal),
            node(1, 80 * GIB, NodeKind::GpuMemory),
        ];
        assert!(finish::only_node_memory(&mut full, Some(126 * GIB)).is_none());
        let mut two = vec![
            node(0, 4 * GIB, NodeKind::Normal),
            node(1, 4 * GIB, NodeKind::Normal),
        ];
        assert!(finish::only_node_memory(&mut two, Some(126 * GIB)).is_none());
        assert_eq!(two[0].memory_bytes, 4 * GIB);
        let mut enough = vec![node(0, 126 * GIB, NodeKind::Normal)];
        assert!(finish::only_node_memory(&mut enough, Some(125 * GIB)).is_none());
        assert_eq!(enough[0].memory_bytes, 126 * GIB);
        // A few percent short (firmware, rounding) is not worth a warning.
        let mut near = vec![node(0, 120 * GIB, NodeKind::Normal)];
        assert!(finish::only_node_memory(&mut near, Some(126 * GIB)).is_none());
        let mut unknown = vec![node(0, 4 * GIB, NodeKind::Normal)];
        assert!(finish::only_node_memory(&mut unknown, None).is_none());
        assert_eq!(unknown[0].memory_bytes, 4 * GIB);
        use crate::platform::sys::parse_mem_total;
        assert_eq!(
            parse_mem_total("MemFree: 1 kB\nMemTotal:  132 kB\n"),
            Some(132 * 1024)
        );
        assert!(parse_mem_total("MemTotal: x kB\n").is_none());
        // Huge page pools are not the node's ordinary memory (hwloc leaves
        // them out of it too): 64 GiB of them on a 126 GiB machine.
        let info = "MemTotal: 132120576 kB\nHugePages_Total: 64\nHugepagesize: 2048 kB\nHugetlb: 67108864 kB\n";
        assert_eq!(parse_mem_total(info), Some(62 * GIB));
        let old_kernel = "MemTotal: 132120576 kB\nHugePages_Total: 1024\nHugepagesize: 2048 kB\n";
        assert_eq!(parse_mem_total(old_kernel), Some(124 * GIB));
        let mut pools = vec![node(0, 62 * GIB, NodeKind::Normal)];
        assert!(finish::only_node_memory(&mut pools, parse_mem_total(info)).is_none());
    }

    #[test]
    fn bus_ids_normalize() {
        assert_eq!(
            normalize_bus_id("00000000:07:00.0").unwrap(),
            "0000:07:00.0"
        );
        assert_eq!(normalize_bus_id("0000:B1:00.0").unwrap(), "0000:b1:00.0");
        assert_eq!(normalize_bus_id("07:00.0").unwrap(), "0000:07:00.0");
        assert!(normalize_bus_id("zz").is_none());
        assert!(normalize_bus_id("0000:07:20.0").is_none());
        assert!(normalize_bus_id("0000:07:00.8").is_none());
    }

    #[test]
    fn pci_ids_parse() {
        assert_eq!(
            PciId::parse("1b36:0005").unwrap(),
            PciId {
                vendor: 0x1b36,
                device: Some(5)
            }
        );
        assert_eq!(
            PciId::parse("0x10de").unwrap(),
            PciId {
                vendor: 0x10de,
                device: None
            }
        );
        assert!(PciId::parse("nvidia").is_err());
        assert!(PciId::parse("12345").is_err());
        assert!(PciId {
            vendor: 0x10de,
            device: None
        }
        .matches(0x10de, 0x2330));
    }

    #[test]
    fn nvidia_display_and_3d_count_as_gpus() {
        assert!(is_accelerator(0x10de, 0x2330, 0x0302, &[]));
        assert!(is_accelerator(0x10de, 0x1db4, 0x0300, &[]));
        assert!(
            !is_accelerator(0x10de, 0x1ad8, 0x0604, &[]),
            "an NVIDIA bridge is not a GPU"
        );
        assert!(
            !is_accelerator(0x1002, 0x0001, 0x0300, &[]),
            "an AMD VGA is not reported by default"
        );
        assert!(is_accelerator(
            0x1b36,
            0x0005,
            0x00ff,
            &[PciId {
                vendor: 0x1b36,
                device: Some(5)
            }]
        ));
    }

    #[test]
    fn a_vendor_only_id_skips_the_vendors_bridges() {
        let vendor = [PciId {
            vendor: 0x1b36,
            device: None,
        }];
        assert!(is_accelerator(0x1b36, 0x0005, 0x00ff, &vendor));
        assert!(
            !is_accelerator(0x1b36, 0x000b, 0x0600, &vendor),
            "a PCIe expander host bridge"
        );
        assert!(
            !is_accelerator(0x1b36, 0x000c, 0x0604, &vendor),
            "a PCIe root port"
        );
        let exact = [PciId {
            vendor: 0x1b36,
            device: Some(0x000c),
        }];
        assert!(
            is_accelerator(0x1b36, 0x000c, 0x0604, &exact),
            "an exact id is taken at its word"
        );
    }
}
