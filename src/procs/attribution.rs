//! [`Attribution`]: which GPUs a process works on, and how that was
//! learnt: from the driver's own per-GPU process lists (NVML: exact, with
//! the memory on each), or from its device files (approximate: the CUDA
//! driver opens, and maps, every GPU's device file it can see).

use serde::Serialize;

use crate::gpu::GpuIndex;

/// Where a process's GPUs were learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum GpuSource {
    /// The driver's per-GPU process lists (NVML): the GPUs it has a
    /// context on, and its memory on each.
    #[serde(rename = "nvml")]
    Nvml,
    /// Its device files (descriptors and mappings): approximate, never
    /// the ground of a warning.
    #[serde(rename = "device files")]
    DeviceFiles,
}

impl GpuSource {
    /// `nvml` or `device files`.
    pub fn as_str(&self) -> &'static str {
        match self {
            GpuSource::Nvml => "nvml",
            GpuSource::DeviceFiles => "device files",
        }
    }
}

impl std::fmt::Display for GpuSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which process list of a GPU holds a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ContextKind {
    /// A compute (CUDA) context.
    Compute,
    /// A graphics context.
    Graphics,
    /// A client of the MPS server.
    Mps,
}

/// A GPU the driver lists a process on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuContext {
    /// The GPU in the topology (matched by PCI bus id), when it is one.
    pub gpu: Option<GpuIndex>,
    /// Its PCI bus id (`0000:1b:00.0`).
    pub bus_id: String,
    /// The process's memory on it (`None`: the driver could not say).
    pub used_bytes: Option<u64>,
    /// The lists it is in there.
    pub kinds: Vec<ContextKind>,
}

/// How a process's GPUs were found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attribution {
    /// NVML, or its device files.
    pub source: GpuSource,
    /// With NVML: each GPU it has a context on, with its memory there.
    pub contexts: Vec<GpuContext>,
    /// With device files: why NVML could not say (it is missing, failed,
    /// timed out, was not asked, cannot see the process, or lists no
    /// context of it).
    pub approximate: Option<String>,
}

impl Attribution {
    /// By device files, for the reason given.
    pub fn device_files(why: impl Into<String>) -> Self {
        Self {
            source: GpuSource::DeviceFiles,
            contexts: Vec::new(),
            approximate: Some(why.into()),
        }
    }
}

impl Default for Attribution {
    /// By device files: the driver not asked ([`ProcReader::read`]
    /// reads one process; [`ProcReader::scan`] and
    /// [`ProcReader::read_pids`] ask it).
    ///
    /// [`ProcReader::read`]: super::ProcReader::read
    /// [`ProcReader::scan`]: super::ProcReader::scan
    /// [`ProcReader::read_pids`]: super::ProcReader::read_pids
    fn default() -> Self {
        Self::device_files("the driver's process lists were not asked")
    }
}
