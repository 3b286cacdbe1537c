//! [`ProcessSnapshot`]: what one process looked like when it was read.

use std::collections::BTreeMap;

use serde::Serialize;

use super::attribution::Attribution;
use super::publish::Publication;
use crate::cpulist::CpuList;
use crate::gpu::GpuIndex;

/// The launcher variables a snapshot keeps: the local rank's
/// ([`crate::affinity::launcher::LOCAL_RANK_VARS`]) and the global rank's.
pub const RANK_VARS: [&str; 9] = [
    "LOCAL_RANK",
    "SLURM_LOCALID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "PMI_LOCAL_RANK",
    "RANK",
    "SLURM_PROCID",
    "OMPI_COMM_WORLD_RANK",
    "LOCAL_WORLD_SIZE",
];

/// The variables that point a communication library at NICs.
pub const NIC_VARS: [&str; 4] = [
    "UCX_NET_DEVICES",
    "NCCL_IB_HCA",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
];

/// One process, as read from `/proc/<pid>` at one moment. Parts this user
/// may not read (another user's descriptors, environment and memory map)
/// are `None` (or empty) and listed in [`unread`](Self::unread).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessSnapshot {
    /// The process id (in the PID namespace of the `/proc` read).
    pub pid: u32,
    /// Its pid in each PID namespace from the one of the `/proc` read
    /// (first: `pid`) down to its own (last: the pid it sees itself as, in
    /// a container); `NSpid` of `status`, empty when the kernel does not
    /// give it.
    pub nspid: Vec<u32>,
    /// Its command name (`/proc/<pid>/comm`: at most 15 bytes).
    pub command: String,
    /// Its command line, arguments joined by spaces (shortened past 4 KiB).
    pub cmdline: String,
    /// Its real user id.
    pub uid: Option<u32>,
    /// The launcher, CUDA and NIC variables of its environment (`None`
    /// when unreadable).
    pub environment: Option<Environment>,
    /// The GPUs it has open or mapped.
    pub gpus: Vec<OpenGpu>,
    /// Which GPUs it works on, and how that was learnt: the driver's
    /// per-GPU process lists (NVML), or its device files (approximate).
    pub attribution: Attribution,
    /// Whether it has the NVIDIA driver's own files open (`/dev/nvidiactl`,
    /// `/dev/nvidia-uvm`): a CUDA process.
    pub nvidia_driver: bool,
    /// The CPUs it may run on (`Cpus_allowed_list`).
    pub allowed_cpus: Option<CpuList>,
    /// The NUMA nodes it may allocate on (`Mems_allowed_list`: its cpuset's,
    /// not its memory policy).
    pub allowed_nodes: Option<Vec<u32>>,
    /// Its threads: how many were read, and the CPU each last ran on.
    pub threads: Threads,
    /// Its memory per node and its memory policy (`None` when unreadable).
    pub memory: Option<MemoryUse>,
    /// Resident bytes (`VmRSS`).
    pub rss_bytes: Option<u64>,
    /// Bytes locked with `mlock` (`VmLck`).
    pub locked_bytes: Option<u64>,
    /// Bytes pinned long-term by the kernel for a device (`VmPin`: RDMA
    /// registrations, io_uring; not memory the CUDA driver pins).
    pub pinned_bytes: Option<u64>,
    /// numapin's arenas in the process.
    pub numapin: Publication,
    /// The parts that could not be read, and why.
    pub unread: Vec<Unread>,
}

/// The environment variables `numapin ps` reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Environment {
    /// The launcher's rank variables that are set ([`RANK_VARS`]), in that order.
    pub launcher: Vec<(String, String)>,
    /// `CUDA_VISIBLE_DEVICES`, if set.
    pub cuda_visible_devices: Option<String>,
    /// `CUDA_DEVICE_ORDER`, if set.
    pub cuda_device_order: Option<String>,
    /// The NIC variables that are set ([`NIC_VARS`]), in that order.
    pub nic: Vec<(String, String)>,
}

impl Environment {
    /// The value of `name`, if set and kept.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.launcher
            .iter()
            .chain(&self.nic)
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .or(match name {
                "CUDA_VISIBLE_DEVICES" => self.cuda_visible_devices.as_deref(),
                "CUDA_DEVICE_ORDER" => self.cuda_device_order.as_deref(),
                _ => None,
            })
    }
}

/// A GPU a process has open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OpenGpu {
    /// The GPU in the topology, when its bus id is one of the topology's.
    pub gpu: Option<GpuIndex>,
    /// Its PCI bus id, when known (an NVIDIA device file whose minor the
    /// driver does not list has none).
    pub bus_id: Option<String>,
    /// The file, as the process sees it (`/dev/nvidia3`).
    pub path: String,
    /// Whether a descriptor is open on it.
    pub descriptor: bool,
    /// Whether it is mapped (CUDA maps a GPU's device file for each context
    /// on it: a mapping means the process works on that GPU, a descriptor
    /// alone only that it opened it).
    pub mapped: bool,
}

/// A process's threads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Threads {
    /// Threads read.
    pub count: u32,
    /// Threads per CPU they last ran on.
    pub last_cpu: BTreeMap<u32, u32>,
}

/// A process's memory per NUMA node (from `/proc/<pid>/numa_maps`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MemoryUse {
    /// Bytes of its own data per node: anonymous memory, heap, stacks,
    /// shared memory and hugetlb pages.
    pub data: BTreeMap<u32, u64>,
    /// Bytes of files on disk it maps (libraries, mapped files), per node:
    /// page cache, placed by whoever read it first.
    pub file: BTreeMap<u32, u64>,
    /// Its memory policy (`default`, `bind:1`, `prefer:0`, `interleave:0-3`).
    pub policy: Option<String>,
    /// Mappings counted.
    pub vmas: u64,
}

impl MemoryUse {
    /// Data bytes over all nodes.
    pub fn data_total(&self) -> u64 {
        self.data.values().fold(0, |a, &b| a.saturating_add(b))
    }
}

/// A part of a process that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unread {
    /// What it is (`environment`, `descriptors`, `mappings`, `memory`,
    /// `threads`, `numapin`; `process` for one that kept changing its
    /// program or user while read).
    pub part: String,
    /// Why, as a sentence naming the file.
    pub why: String,
    /// Whether it was refused for want of permission (another user's
    /// process: run as that user or as root).
    pub permission: bool,
}
