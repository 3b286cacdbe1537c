//! Running processes and whether they sit near their GPU: what
//! `numapin ps` shows.
//!
//! * [`ProcReader`] reads a process's `/proc/<pid>` files into a
//!   [`ProcessSnapshot`]: its command, launcher rank variables,
//!   `CUDA_VISIBLE_DEVICES` and NIC variables, the GPUs it has open or
//!   mapped, the CPUs it may run on and the CPU each thread last ran on,
//!   its memory per node and memory policy (`numa_maps`), what it has
//!   locked or pinned, and numapin's own arenas in it ([`Publication`]).
//!   [`ProcReader::scan`] finds every process with a GPU open;
//!   [`ProcReader::read_pids`] reads the ones named. Everything is read
//!   under a root (`/` live, a folder in tests), within [`ReadLimits`]
//!   checked before anything is allocated; a process that ends while read,
//!   or a file this user may not read, gives a line, never a crash.
//!   Each [`scan`](ProcReader::scan) and [`read_pids`](ProcReader::read_pids)
//!   also asks the driver's per-GPU process lists (NVML, [`DriverQuery`])
//!   while it reads, and gives each process its [`Attribution`]: the GPUs
//!   it has a context on and its memory on each, or (NVML missing, slow,
//!   unable to see it) its device files, approximate.
//! * [`judge`] compares a snapshot with the [`Topology`](crate::Topology):
//!   its GPU (the one the launcher's local rank or `CUDA_VISIBLE_DEVICES`
//!   gives, as [`rank_plan`](crate::affinity::rank_plan) chooses it for
//!   `numapin exec`, else the one it works on), that GPU's node, and its
//!   nearest NIC ([`Topology::nic_pairing`](crate::Topology::nic_pairing)).
//!   Each check is a [`doctor::Check`](crate::doctor::Check) about the
//!   process ([`Subject::Process`](crate::doctor::Subject::Process)): a
//!   verdict with the evidence and the fix, in `numapin doctor`'s words;
//!   [`node_use`] sums memory per node.
//!
//! # Which open files are a GPU
//!
//! `/dev/nvidia<N>` (the GPU whose `Device Minor` is `N` in
//! `/proc/driver/nvidia/gpus/<bus id>/information`), and a PCI device's own
//! sysfs files (`/sys/devices/.../<bus id>/config` or `resource<N>`) when
//! the topology lists that device as a GPU or accelerator: a test names the
//! stand-in accelerator a process uses by opening its `config` file.
//! `/dev/nvidiactl` and `/dev/nvidia-uvm` mark a CUDA process without
//! naming a GPU. The minor number `N` is the driver's, not a CUDA ordinal.
//!
//! # Which GPUs a process works on
//!
//! Device files cannot tell: the CUDA driver opens, and maps, every GPU's
//! device file it can see, whichever GPU the process uses. The driver's
//! own per-GPU process lists can (`nvmlDeviceGetComputeRunningProcesses`
//! and the graphics and MPS lists, with the memory of each process on each
//! GPU); NVML's GPUs are matched with the topology's by PCI bus id, and its
//! pids, the host's, with the processes read through their `NSpid` where
//! the `/proc` read shows the host's PID namespace. A process NVML lists is
//! judged by its lists ([`GpuSource::Nvml`]); any other by its device
//! files ([`GpuSource::DeviceFiles`], mapped ones first), approximate: then
//! the `gpu` check only says what they show (`ok`, or `skip` where they
//! disagree with the rank), never warns nor fails.
//!
//! ```no_run
//! use numapin::procs::{judge, ProcReader};
//! use numapin::topology::{ProbeOptions, Topology};
//!
//! let topo = Topology::probe(&ProbeOptions::default())?;
//! let scan = ProcReader::new(&topo).scan()?;
//! for s in scan.processes {
//!     let report = judge(&topo, s);
//!     for c in &report.checks {
//!         println!("{} {} pid {}: {}", c.verdict, c.name, report.snapshot.pid, c.evidence);
//!     }
//! }
//! # Ok::<(), numapin::Error>(())
//! ```

mod attribution;
mod devices;
mod driver;
mod error;
mod expect;
mod facts;
mod identity;
mod locality;
mod nic;
mod nodes;
mod publish;
mod read;
mod scan;
mod snapshot;
mod verdict;
mod words;

pub use attribution::{Attribution, ContextKind, GpuContext, GpuSource};
pub use devices::STATS_MEMFD_NAME;
pub use driver::{DriverGpu, DriverLists, DriverProcess, DriverQuery, DriverReport};
pub use error::ProcessError;
pub use expect::Expected;
pub use locality::MIN_OFF_NODE_BYTES;
pub use nodes::{node_use, NodeUse};
pub use publish::{
    ArenaBytes, Publication, Published, PublishedRuntime, STATS_FILE_BYTES, STATS_MAGIC,
    STATS_VERSION,
};
pub use read::{ProcReader, ReadLimits};
pub use scan::{Scan, Unlisted};
pub use snapshot::{
    Environment, MemoryUse, OpenGpu, ProcessSnapshot, Threads, Unread, NIC_VARS, RANK_VARS,
};
pub use verdict::{judge, ProcessReport};

#[cfg(test)]
mod driver_tests;
#[cfg(test)]
mod tests;
