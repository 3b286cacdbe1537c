//! [`RuntimeError`]: what can go wrong placing work, lending pinned
//! memory or making a region. Public as `numapin::runtime::RuntimeError`
//! (the `Runtime` returns it); defined here, beside the arena that raises
//! most of its variants, because the arena sits below the runtime.

use crate::gpu::{CudaError, CudaOrdinal};

use super::fmt_bytes;
use super::region::Step;
use crate::report::ErrorKind;

fn fmt_elsewhere(v: &[(u32, u64)]) -> String {
    v.iter()
        .map(|(n, c)| format!("{c} on node {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn fmt_holders(v: &[super::machine::BudgetHolder]) -> String {
    if v.is_empty() {
        return "no live process".into();
    }
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn fmt_list<T: std::fmt::Display>(v: &[T]) -> String {
    let items: Vec<String> = v.iter().map(ToString::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// A failure of the [`Runtime`](crate::runtime::Runtime) (placing work,
/// lending pinned memory, binding) or of a region made by hand
/// ([`crate::region`]). Each message names the node, GPU or setting and
/// the size; `fix()` says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// Pinned bytes would exceed the node's budget.
    #[error("node {node}: {} requested with {} already pinned on the node would exceed its budget of {}", fmt_bytes(*requested), fmt_bytes(*in_use), fmt_bytes(*limit))]
    BudgetExceeded {
        /// The node.
        node: u32,
        /// Bytes asked for.
        requested: u64,
        /// Bytes the node's arena already holds pinned (its regions).
        in_use: u64,
        /// The budget.
        limit: u64,
    },
    /// Locking the memory failed, or would exceed RLIMIT_MEMLOCK.
    #[error("node {node}: cannot lock {} of pinned memory: RLIMIT_MEMLOCK is {} and this process already has {} locked{}", fmt_bytes(*size), fmt_bytes(*limit), fmt_bytes(*locked), if source.is_some() { " (mlock failed)" } else { "" })]
    Memlock {
        /// The node.
        node: u32,
        /// Bytes that were to be locked.
        size: u64,
        /// The soft RLIMIT_MEMLOCK (`u64::MAX` = unlimited).
        limit: u64,
        /// Bytes this process already had locked (VmLck).
        locked: u64,
        /// The mlock error, when mlock itself failed (`None` when the
        /// limit was checked beforehand).
        #[source]
        source: Option<std::io::Error>,
    },
    /// The node cannot hold memory for this process.
    #[error("node {node}: cannot place {} there: {reason}", fmt_bytes(*size))]
    NoMemory {
        /// The node.
        node: u32,
        /// Bytes asked for.
        size: u64,
        /// Why, in words (what the topology says, or the call refused).
        reason: String,
        /// The system call's error, when one refused.
        #[source]
        source: Option<std::io::Error>,
    },
    /// `cuMemHostRegister` failed.
    #[error("node {node}: registering {} with CUDA failed", fmt_bytes(*size))]
    Register {
        /// The node.
        node: u32,
        /// Bytes of the region.
        size: u64,
        /// The CUDA error.
        #[source]
        source: CudaError,
    },
    /// A driver backend's allocation failed.
    #[error("node {node}: allocating {} with the {} backend ({backend}) failed", fmt_bytes(*size), backend.as_str())]
    Backend {
        /// The node.
        node: u32,
        /// Bytes of the region.
        size: u64,
        /// The backend.
        backend: super::Backend,
        /// The CUDA error.
        #[source]
        source: CudaError,
    },
    /// Pinned bytes over every node would exceed the share of the
    /// process's memory cgroup limit that the default budget allows.
    #[error("node {node}: {} requested with {} already pinned over all nodes would exceed {}, the pinned-memory budget under the memory cgroup limit ({cgroup})", fmt_bytes(*requested), fmt_bytes(*in_use), fmt_bytes(*limit))]
    CgroupBudget {
        /// The node asked for.
        node: u32,
        /// Bytes asked for.
        requested: u64,
        /// Bytes pinned over all nodes of the runtime.
        in_use: u64,
        /// The shared budget.
        limit: u64,
        /// Where the limit comes from (the cgroup file and the fraction).
        cgroup: String,
    },
    /// Pinned bytes on the node over every numapin process of this user
    /// would exceed the machine budget.
    #[error("node {node}: {} requested with {} already pinned on the node by numapin processes of this machine would exceed the machine budget of {}; held by {}", fmt_bytes(*requested), fmt_bytes(*in_use), fmt_bytes(*limit), fmt_holders(holders))]
    MachineBudget {
        /// The node.
        node: u32,
        /// Bytes asked for.
        requested: u64,
        /// Bytes pinned on the node over every live process, this one's
        /// included.
        in_use: u64,
        /// The machine budget on the node.
        limit: u64,
        /// The processes holding them, largest first.
        holders: Vec<super::machine::BudgetHolder>,
    },
    /// The machine budget's state file cannot be used: it is refused, not
    /// trusted (another version's, corrupted, a link, another user's, open
    /// to others), or a system call on it failed.
    #[error("machine budget state file {path}: {problem}")]
    MachineState {
        /// The file (or its folder).
        path: String,
        /// What is wrong.
        problem: String,
        /// The system's error, when one was the cause.
        #[source]
        source: Option<std::io::Error>,
    },
    /// Pages of a new region are not on its node (and
    /// [`OffNode::Strict`](super::OffNode::Strict) says that is an error).
    #[error("node {node}: {} of {pages} pages of a new {} region are not on the node ({}{} not present); the region ({how}) was given back", pages - on_node, fmt_bytes(*size), fmt_elsewhere(elsewhere), if fmt_elsewhere(elsewhere).is_empty() { format!("{missing}") } else { format!(", {missing}") })]
    OffNode {
        /// The node.
        node: u32,
        /// Bytes of the region.
        size: u64,
        /// 4 KiB pages checked.
        pages: u64,
        /// Pages found on the node.
        on_node: u64,
        /// Pages found on other nodes, per node.
        elsewhere: Vec<(u32, u64)>,
        /// Pages not present.
        missing: u64,
        /// How the region was placed, pinned and verified, and why (for
        /// a region placed by first touch, the CPUs it was touched from).
        how: String,
    },
    /// A system call failed while making a region.
    #[error("node {node}: making a {} region failed at {step:?}", fmt_bytes(*size))]
    System {
        /// The node.
        node: u32,
        /// Bytes of the region.
        size: u64,
        /// The step that failed.
        step: Step,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A region could not be mapped under the process's address-space or
    /// data limit (`ulimit -v`, `ulimit -d`).
    #[error("node {node}: a {} region does not fit under the process's {limit} of {}", fmt_bytes(*size), fmt_bytes(*bytes))]
    AddressLimit {
        /// The node.
        node: u32,
        /// Bytes of the region.
        size: u64,
        /// The limit: `RLIMIT_AS` or `RLIMIT_DATA`.
        limit: &'static str,
        /// Its soft value, in bytes.
        bytes: u64,
        /// The system's error (`ENOMEM` from `mmap`).
        #[source]
        source: std::io::Error,
    },
    /// A region's hugetlb pages could not be had: the node's pool has too
    /// few free pages, the kernel offers no pages of that size there, or
    /// faulting them in failed (another process took the node's free pages
    /// after the check). Only for an explicit hugetlb choice
    /// ([`HugePages::Hugetlb2M`](super::HugePages::Hugetlb2M),
    /// [`HugePages::Hugetlb1G`](super::HugePages::Hugetlb1G)):
    /// [`HugePages::Auto`](super::HugePages::Auto) uses transparent huge
    /// pages instead. The region was given back.
    #[error("node {node}: cannot make a {} region of {} hugetlb pages: {problem}", fmt_bytes(*size), fmt_bytes(*page_bytes))]
    HugePages {
        /// The node.
        node: u32,
        /// Bytes of the region (a multiple of the page size).
        size: u64,
        /// Bytes per hugetlb page.
        page_bytes: u64,
        /// Pages the region needs.
        needed: u64,
        /// Pages the node's pool could supply when checked (`None` when
        /// the pool could not be read, or the shortage showed later).
        usable: Option<u64>,
        /// Pages in the node's pool (`nr_hugepages`) when checked, if read.
        pool: Option<u64>,
        /// What went wrong, with the pool's figures.
        problem: String,
        /// The system's error (a pool file, `mmap`, or faulting in).
        #[source]
        source: Option<std::io::Error>,
    },
    /// A node that is not in the topology.
    #[error("NUMA node {node} is not in the topology (nodes: {})", fmt_list(known))]
    UnknownNode {
        /// The node asked for.
        node: u32,
        /// The nodes the topology has.
        known: Vec<u32>,
    },
    /// A GPU (CUDA ordinal) that is not in the topology.
    #[error(
        "GPU {gpu} (CUDA ordinal) is not in the topology (ordinals: {})",
        fmt_list(known)
    )]
    UnknownGpu {
        /// The ordinal asked for.
        gpu: CudaOrdinal,
        /// The ordinals the topology has.
        known: Vec<CudaOrdinal>,
    },
    /// A GPU index (position in `Topology::gpus`, PCI order) past the
    /// topology's GPUs.
    #[error("GPU index {index} is not in the topology ({count} GPU(s))")]
    UnknownGpuIndex {
        /// The index asked for.
        index: crate::gpu::GpuIndex,
        /// How many GPUs the topology has.
        count: usize,
    },
    /// A configuration value that cannot be used.
    #[error("arena configuration {setting} = {value}: {problem}")]
    Config {
        /// The setting.
        setting: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: String,
    },
    /// A request that cannot be served (zero bytes, larger than the
    /// address space).
    #[error("node {node}: cannot allocate {bytes} bytes: {problem}")]
    BadRequest {
        /// The node.
        node: u32,
        /// Bytes asked for.
        bytes: u64,
        /// What is wrong.
        problem: String,
    },
    /// Binding the calling thread or process to a placement's CPUs and
    /// node failed (`Runtime::bind_current_thread`,
    /// `Runtime::bind_current_process`).
    #[error(transparent)]
    Affinity(#[from] crate::affinity::AffinityError),
    /// A CUDA call for a copy failed.
    #[error("node {node}: {what} failed")]
    Copy {
        /// The node of the buffer.
        node: u32,
        /// What was attempted.
        what: &'static str,
        /// The CUDA error.
        #[source]
        source: CudaError,
    },
}

impl RuntimeError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            RuntimeError::BudgetExceeded { .. }
            | RuntimeError::CgroupBudget { .. }
            | RuntimeError::MachineBudget { .. }
            | RuntimeError::HugePages {
                usable: Some(_), ..
            } => ErrorKind::Budget,
            RuntimeError::Memlock { .. } | RuntimeError::AddressLimit { .. } => {
                ErrorKind::Permission
            }
            RuntimeError::Affinity(e) => e.kind(),
            RuntimeError::NoMemory {
                source: Some(e), ..
            } if e.raw_os_error() == Some(libc::EPERM) => ErrorKind::Permission,
            RuntimeError::UnknownNode { .. }
            | RuntimeError::UnknownGpu { .. }
            | RuntimeError::UnknownGpuIndex { .. }
            | RuntimeError::Config { .. }
            | RuntimeError::BadRequest { .. }
            | RuntimeError::MachineState { source: None, .. } => ErrorKind::Input,
            _ => ErrorKind::System,
        }
    }

    /// What to do about it.
    pub fn fix(&self) -> Option<String> {
        Some(match self {
            RuntimeError::Affinity(e) => return e.fix(),
            RuntimeError::BudgetExceeded { .. } => "free buffers first, ask for less, or raise the budget (RuntimeConfig::budget_bytes / budget_fraction; default half the node's memory)".into(),
            RuntimeError::Memlock { .. } => "raise the memlock limit of the process: `ulimit -l unlimited` in the shell that starts it (or `memlock` in /etc/security/limits.conf), `LimitMEMLOCK=infinity` in its systemd unit, `docker run --ulimit memlock=-1` for a container; or run with CAP_IPC_LOCK".into(),
            RuntimeError::NoMemory { .. } => "use a node that has memory and is in this process's allowed memory nodes (`numapin topo`; cpuset.mems of the cgroup, `numactl --membind`)".into(),
            RuntimeError::Register { .. } => "check the driver with `nvidia-smi`; CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED means other code registered this memory; CUDA_ERROR_OUT_OF_MEMORY or CUDA_ERROR_NOT_PERMITTED, lower the arena budget or run with RuntimeConfig::register off".into(),
            RuntimeError::Backend { source, .. } if source.is_no_driver() => "this backend needs the CUDA driver and a GPU: use the default backend (RuntimeConfig::backend = Backend::Mapped), which works without one".into(),
            RuntimeError::Backend { .. } => "driver backends need a recent driver (cuMemCreate on a host NUMA node: CUDA 12.2 or later) and memory free on the node (`numastat -m`); the default backend (Backend::Mapped) needs neither".into(),
            RuntimeError::CgroupBudget { .. } => "raise the memory limit of the container or cgroup (`docker run --memory`, Kubernetes resources.limits.memory): by default numapin pins at most budget_fraction of it over all nodes, since pinned pages count against it and the OOM killer ends the process above it; or free buffers (Runtime::trim), or set RuntimeConfig::budget_bytes (the cgroup cap is then not applied)".into(),
            RuntimeError::MachineBudget { .. } => "free pinned buffers in the processes named (or give their empty regions back: Runtime::trim, numapin.trim()), ask for less, wait for them (RuntimeConfig::budget_wait), or raise the machine budget (NUMAPIN_MACHINE_BUDGET=0.8 or =64GiB, RuntimeConfig::machine_budget, numapin.configure(machine_budget=...)); NUMAPIN_MACHINE_BUDGET=off turns it off".into(),
            RuntimeError::MachineState { problem, .. } if problem.contains("exiting") => "allocate before the process's exit handlers run: numapin gives its record of the machine budget up in its own at-exit handler, and a process past it pins nothing more; or turn the machine budget off (NUMAPIN_MACHINE_BUDGET=off)".into(),
            RuntimeError::MachineState { path, .. } if path.contains("numapin-budget-") => format!("when no numapin process of this user runs, remove it (`rm {path}`: numapin makes a new one); or point NUMAPIN_MACHINE_BUDGET_DIR at a folder of your own, or turn the machine budget off (NUMAPIN_MACHINE_BUDGET=off)"),
            RuntimeError::MachineState { .. } => "point NUMAPIN_MACHINE_BUDGET_DIR at a folder of this user's own that exists (mode 0700), or turn the machine budget off (NUMAPIN_MACHINE_BUDGET=off)".into(),
            RuntimeError::OffNode { how, .. } if how.contains("first touch") => "first touch put the pages elsewhere: the node's CPUs this process may use (cpuset) must exist and the memory policy must be the default (no `numactl --membind` around the container), and the node needs free memory (`numastat -m`); to bind with mbind instead, allow it (`docker run --cap-add SYS_NICE`, Kubernetes securityContext.capabilities.add [\"SYS_NICE\"]); RuntimeConfig::off_node = OffNode::Warn (`placement=\"warn\"` in Python) keeps such regions".into(),
            RuntimeError::OffNode { .. } => "the node is short of free memory or the kernel moved pages (check `numastat -m`, free memory on the node, or lower the budget); RuntimeConfig::off_node = OffNode::Warn (`placement=\"warn\"` in Python) keeps such regions".into(),
            RuntimeError::AddressLimit { limit, .. } => format!("raise the limit in the shell that starts the process (`ulimit {}`, or `unlimited`), or, for allocations smaller than a region, make smaller regions (RuntimeConfig::region_bytes, `region_bytes=` of numapin.configure in Python)", if *limit == "RLIMIT_AS" { "-v" } else { "-d" }),
            RuntimeError::System { .. } => "check free memory on the node (`numastat -m`) and the process's limits (`ulimit -a`)".into(),
            RuntimeError::HugePages {
                node,
                page_bytes,
                needed,
                usable,
                pool,
                ..
            } => {
                let file = format!(
                    "/sys/devices/system/node/node{node}/hugepages/hugepages-{}kB/nr_hugepages",
                    page_bytes >> 10
                );
                let reserve = match (pool, usable) {
                    (Some(pool), Some(usable)) => format!(
                        "`echo {} > {file}` (the pool's new size: {pool} now, {} more)",
                        pool + needed.saturating_sub(*usable),
                        needed.saturating_sub(*usable)
                    ),
                    _ => format!("raise {file} by {needed}"),
                };
                format!(
                    "reserve hugetlb pages on node {node} as root: {reserve}, then read the file back (the kernel may find fewer free contiguous blocks than asked); or at boot: `hugepagesz={} hugepages={node}:N` on the kernel command line (1 GiB pages are best reserved at boot); a container usually cannot change the pool, the host must; or use RuntimeConfig::huge_pages = HugePages::Auto (transparent huge pages when the pool is short) or Transparent",
                    if *page_bytes >= 1 << 30 { "1G" } else { "2M" },
                )
            }
            RuntimeError::UnknownNode { .. } => "pick one of the listed nodes (`numapin topo`)".into(),
            RuntimeError::UnknownGpu { .. } => "pick one of the listed ordinals (`numapin topo`; CUDA_VISIBLE_DEVICES changes them)".into(),
            RuntimeError::UnknownGpuIndex { .. } => "pick an index listed by `numapin topo` (indexes follow PCI order, not CUDA ordinals)".into(),
            RuntimeError::Config { fix, .. } => fix.clone(),
            RuntimeError::BadRequest { .. } => "ask for at least one byte and at most the node's budget".into(),
            RuntimeError::Copy { .. } => "make the stream's context current on this thread and check the device pointer and length".into(),
        })
    }

    /// A Memlock error for `size` bytes on `node`, with the limit and the
    /// locked bytes read now.
    pub(crate) fn lock_failed(node: u32, size: u64, source: Option<std::io::Error>) -> Self {
        RuntimeError::Memlock {
            node,
            size,
            limit: crate::platform::sys::memlock_limit().map_or(0, |(soft, _)| soft),
            locked: crate::platform::sys::locked_bytes(),
            source,
        }
    }
}
