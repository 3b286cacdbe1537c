//! numapin keeps GPU data movement on the right side of the socket.
//!
//! On a multi-socket, multi-GPU server every GPU hangs off one socket's PCIe
//! root. numapin finds out which ([`topology`]), keeps pinned host memory on
//! the GPU's own NUMA node ([`arena`]), and binds the threads and processes
//! that feed each GPU to that node's CPUs.
#![warn(missing_docs)]

pub mod affinity;
pub mod arena;
pub mod bench;
pub mod cli;
pub mod cpulist;
pub mod cuda;
pub mod doctor;
pub mod error;
pub mod isolate;
pub mod loader;
pub mod panic_guard;
pub mod runtime;
pub mod sys;
pub mod topology;

pub use cpulist::CpuList;
pub use error::{Error, Result};
pub use loader::{Batch, Loader, LoaderConfig, LoaderError, Target};
pub use runtime::{PinnedBuf, Runtime};
pub use topology::Topology;
