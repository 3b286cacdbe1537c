//! This machine's and this process's state, as typed snapshots: the facts
//! that decide whether pinned memory and NUMA placement work here, and
//! that `numapin doctor` ([`crate::doctor`]) judges.
//!
//! ```no_run
//! use numapin::system::{SnapshotOptions, SystemSnapshot};
//! use numapin::topology::{ProbeOptions, Topology};
//!
//! let topo = Topology::probe(&ProbeOptions::from_process())?;
//! let s = SystemSnapshot::read(&topo, &SnapshotOptions::default());
//! match &s.memlock {
//!     Ok(l) => println!("RLIMIT_MEMLOCK soft {} bytes", l.soft),
//!     Err(e) => println!("{e}"),
//! }
//! println!("seccomp mode {:?}, CAP_SYS_NICE {:?}", s.security.seccomp, s.cap_sys_nice());
//! if let Some(limit) = s.cgroup.tightest() {
//!     println!("memory cgroup limit {} bytes", limit.bytes);
//! }
//! # Ok::<(), numapin::Error>(())
//! ```
//!
//! What is read, and from where:
//!
//! | field | source |
//! | --- | --- |
//! | [`memlock`](SystemSnapshot::memlock) | `getrlimit(RLIMIT_MEMLOCK)` |
//! | [`security`](SystemSnapshot::security) | `Seccomp:`, `Seccomp_filters:`, `NoNewPrivs:`, `CapEff:` of `proc/self/status` |
//! | [`cuda_driver`](SystemSnapshot::cuda_driver) | `cuInit`, `cuDriverGetVersion`, `cuDeviceGetCount` |
//! | [`mempolicy`](SystemSnapshot::mempolicy) | `get_mempolicy(2)`, else `proc/self/numa_maps` when the call is refused |
//! | [`numa_calls`](SystemSnapshot::numa_calls) | each NUMA system call made once, harmlessly ([`NUMA_CALLS`]) |
//! | [`container`](SystemSnapshot::container) | `.dockerenv`, `run/.containerenv`, `KUBERNETES_SERVICE_HOST`, `container=`, `proc/self/cgroup` |
//! | [`cgroup`](SystemSnapshot::cgroup) | `proc/self/cgroup`, `proc/self/mountinfo`, `memory.max`, `memory.high`, `memory.limit_in_bytes` |
//! | [`thp`](SystemSnapshot::thp) | `sys/kernel/mm/transparent_hugepage/{enabled,defrag}` |
//! | [`huge_pages`](SystemSnapshot::huge_pages) | `sys/devices/system/node/node*/hugepages/*` |
//! | [`numa_balancing`](SystemSnapshot::numa_balancing) | `proc/sys/kernel/numa_balancing` |
//! | [`iommu`](SystemSnapshot::iommu) | `proc/cmdline`, `sys/class/iommu`, `sys/kernel/iommu_groups`, each GPU's `iommu_group/type` |
//!
//! Files are read under [`SnapshotOptions::root`] (`/` for this machine),
//! so tests and tools can point the readers at a fake tree; system calls
//! always describe the calling process. Reading never fails as a whole:
//! each part holds what it found or, where reading can fail, a typed error
//! that keeps its cause.

mod driver;
mod huge_pages;
mod kernel;
mod this_process;

use std::path::PathBuf;

pub use crate::platform::cgroup::{Limit, LimitKind, MemoryLimits};
pub use crate::platform::container::ContainerEvidence;
pub use crate::platform::hugetlb::{PoolCounts, PoolError, SIZE_1G, SIZE_2M};
pub use crate::platform::probe::{CallState, CALLS as NUMA_CALLS};
pub use crate::platform::sys::{SecurityStatus, CAP_IPC_LOCK, CAP_SYS_NICE};
pub use driver::CudaDriver;
pub use huge_pages::{HugePages, HugePagesError, PoolRow};
pub use kernel::{Iommu, Thp};
pub use this_process::{
    MemlockError, MemlockLimit, MempolicyError, PolicyMode, PolicySource, ThreadPolicy,
};

use crate::topology::Topology;

/// What [`SystemSnapshot::read`] reads, and where. Start from
/// `SnapshotOptions::default()` (this machine, with the CUDA driver).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SnapshotOptions {
    /// Whether the CUDA driver may be loaded (false:
    /// [`CudaDriver::NotLoaded`]).
    pub cuda: bool,
    /// The filesystem root the files are read under: `/` for this machine,
    /// or a folder holding a fake `proc/` and `sys/` tree (tests).
    pub root: PathBuf,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        Self {
            cuda: true,
            root: PathBuf::from("/"),
        }
    }
}

with_setters!(SnapshotOptions {
    with_cuda => cuda: bool,
    with_root => root: PathBuf,
});

/// This machine's and this process's state, read once (see the module
/// docs for where each part comes from).
#[derive(Debug)]
#[non_exhaustive]
pub struct SystemSnapshot {
    /// RLIMIT_MEMLOCK, or why it could not be read.
    pub memlock: Result<MemlockLimit, MemlockError>,
    /// Seccomp mode and effective capabilities (`None` fields: unreadable).
    pub security: SecurityStatus,
    /// The CUDA driver: its version and device count, or why it is absent.
    pub cuda_driver: CudaDriver,
    /// The calling thread's memory policy, or why it could not be read.
    pub mempolicy: Result<ThreadPolicy, MempolicyError>,
    /// Which NUMA system calls this process may make, in [`NUMA_CALLS`]
    /// order.
    pub numa_calls: Vec<(&'static str, CallState)>,
    /// What suggests a container.
    pub container: ContainerEvidence,
    /// The memory cgroup limits over this process.
    pub cgroup: MemoryLimits,
    /// The transparent huge page settings.
    pub thp: Thp,
    /// Each node's hugetlb pools and the THP mode.
    pub huge_pages: HugePages,
    /// `proc/sys/kernel/numa_balancing` as the file holds it, `None` when
    /// unreadable (a kernel without automatic NUMA balancing).
    pub numa_balancing: Option<String>,
    /// The IOMMU, as far as it can be read.
    pub iommu: Iommu,
    /// The mounted local filesystems and the drives behind each, placed in
    /// the topology (always read under `/`).
    pub mounts: Vec<crate::storage::FileLocation>,
}

/// The memory cgroup limits over this process (v2 `memory.max` and
/// `memory.high`, v1 `memory.limit_in_bytes`), as
/// [`SystemSnapshot::cgroup`] holds them.
pub fn memory_limits() -> MemoryLimits {
    crate::platform::cgroup::read_self()
}

/// Which NUMA system calls this process may make, each made once
/// harmlessly, in [`NUMA_CALLS`] order (what
/// [`SystemSnapshot::numa_calls`] holds, without reading the rest).
pub fn numa_calls() -> Vec<(&'static str, CallState)> {
    crate::platform::probe::probe_calls()
}

impl SystemSnapshot {
    /// Reads everything (see the module docs); `topo` names the GPUs whose
    /// IOMMU domains are read. Never fails: each part holds its own result.
    pub fn read(topo: &Topology, opts: &SnapshotOptions) -> Self {
        let root = opts.root.as_path();
        let thp = Thp::read_under(root);
        SystemSnapshot {
            memlock: MemlockLimit::read(),
            security: this_process::security_under(root),
            cuda_driver: if opts.cuda {
                CudaDriver::load()
            } else {
                CudaDriver::NotLoaded
            },
            mempolicy: ThreadPolicy::read_under(root),
            numa_calls: crate::platform::probe::probe_calls(),
            container: crate::platform::container::detect(root, |k| std::env::var(k).ok()),
            cgroup: crate::platform::cgroup::read_limits(root),
            huge_pages: HugePages::read_under(
                root,
                &thp,
                crate::platform::numa::populate_write_supported(),
            ),
            thp,
            numa_balancing: kernel::read_text(&root.join("proc/sys/kernel/numa_balancing")),
            iommu: Iommu::read_under(root, topo),
            mounts: crate::storage::mounted(topo),
        }
    }

    /// Whether CAP_IPC_LOCK is effective (locking is then not limited by
    /// RLIMIT_MEMLOCK); false when unknown.
    pub fn cap_ipc_lock(&self) -> bool {
        self.security.has_cap(CAP_IPC_LOCK) == Some(true)
    }

    /// Whether CAP_SYS_NICE is effective (`None`: unknown). Docker's
    /// default seccomp profile allows `mbind` and `set_mempolicy` to
    /// holders.
    pub fn cap_sys_nice(&self) -> Option<bool> {
        self.security.has_cap(CAP_SYS_NICE)
    }

    /// The state of one of the [`NUMA_CALLS`] (`None` for another name).
    pub fn numa_call(&self, name: &str) -> Option<&CallState> {
        self.numa_calls
            .iter()
            .find(|(c, _)| *c == name)
            .map(|(_, s)| s)
    }
}

#[cfg(test)]
mod tests;
