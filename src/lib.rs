//! numapin keeps GPU data movement on the right side of the socket.
//!
//! On a multi-socket, multi-GPU server every GPU hangs off one socket's PCIe
//! root. numapin finds out which ([`topology`]), keeps pinned host memory on
//! the GPU's own NUMA node ([`Runtime`], [`PinnedBuf`]), feeds each GPU from
//! threads on that node ([`Loader`], [`staged`] copies), and binds the
//! threads and processes that feed each GPU to that node's CPUs
//! ([`affinity`]), and reads checkpoints and datasets from drives to the
//! GPU through the same node ([`storage`]).
//!
//! ```
//! use numapin::topology::{CudaMode, ProbeOptions};
//! use numapin::{Runtime, RuntimeConfig, Target, Topology};
//!
//! // This machine (CudaMode::Off: GPUs from PCI, without loading the driver).
//! let topo = Topology::probe(&ProbeOptions::from_process().with_cuda(CudaMode::Off))?;
//! let rt = Runtime::new(topo, RuntimeConfig::default())?;
//! // The first GPU (Target::Gpu(CudaOrdinal(0)) with CUDA), or no GPU here.
//! let target = match rt.topology().gpus.first() {
//!     Some(gpu) => Target::HostForGpu(gpu.index),
//!     None => Target::Host,
//! };
//! let site = rt.place(target)?;               // its CPUs and node, with any fallback
//! rt.bind_current_thread(target)?;            // this thread onto those CPUs
//! let mut buf = rt.alloc(target, 1 << 20)?;   // pinned, on that node
//! assert_eq!(buf.node(), site.node);
//! buf.fill(1);
//! # Ok::<(), numapin::Error>(())
//! ```
//!
//! GPUs are named two ways, as two types: a [`CudaOrdinal`] is the number
//! CUDA gives a device in this process (after `CUDA_VISIBLE_DEVICES`), a
//! [`GpuIndex`] its position in [`Topology::gpus`] (PCI bus order). The
//! [`Topology`] converts between them.
//!
//! Every error type says what it read, what is wrong, and (through its
//! `fix()` method) what to do; [`Error`] holds any of them. What is wrong
//! with the machine itself (memlock limit, cgroup, refused NUMA calls,
//! hugetlb pools, PCIe links, locality, ...) the [`doctor`] checks say, as
//! data, from the [`system`] snapshot and the topology.

/// `with_*` setters for a configuration struct's public fields, so that a
/// `#[non_exhaustive]` config can be built in one expression:
/// `RuntimeConfig::default().with_budget_bytes(Some(8 << 30))`.
macro_rules! with_setters {
    ($t:ty { $($with:ident => $field:ident: $ty:ty),* $(,)? }) => {
        impl $t {
            $(
                #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
                #[must_use]
                pub fn $with(mut self, value: $ty) -> Self {
                    self.$field = value;
                    self
                }
            )*
        }
    };
}

pub mod affinity;
mod arena;
pub mod cpulist;
pub mod doctor;
pub mod error;
pub mod gpu;
pub mod loader;
pub mod procs;
pub mod region;
pub mod runtime;
pub mod shared;
pub mod signals;
pub mod staged;
pub mod storage;
pub mod system;
pub mod text;
pub mod topology;

#[cfg(feature = "measure")]
pub mod measure;
mod num;
mod platform;
mod report;

#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals;

pub use cpulist::CpuList;
pub use error::{Error, ErrorKind, Result};
pub use gpu::{CudaOrdinal, GpuIndex};
pub use loader::{Batch, Loader, LoaderConfig, LoaderError};
pub use runtime::{AllocOptions, PinnedBuf, Runtime, RuntimeConfig, Target};
pub use topology::Topology;
