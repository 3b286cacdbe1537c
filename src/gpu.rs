//! How GPUs are named, and the raw CUDA handles the API takes.
//!
//! A GPU has two numbers, and mixing them up binds work to the wrong socket
//! under `CUDA_VISIBLE_DEVICES`, so each has its own type:
//!
//! * [`CudaOrdinal`]: the number CUDA gives the device in this process
//!   (`cuDeviceGet`, `torch.device("cuda", n)`), after
//!   `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`;
//! * [`GpuIndex`]: the GPU's position in [`Topology::gpus`], in PCI bus id
//!   order, as `numapin topo` numbers them.
//!
//! [`Topology::gpu_by_ordinal`] and [`Topology::ordinal_of`] convert between
//! them; a function that takes one does not take the other.
//!
//! The CUDA driver API numapin itself uses is here too, in cudarc's three
//! layers (raw handles, checked calls returning [`CudaError`], owning
//! types): device memory ([`DeviceBuffer`]; a free that fails on drop is
//! counted in [`failed_frees`]), streams and events ([`Stream`], [`Event`]) and the asynchronous copies
//! ([`memcpy_htod_async`], [`memcpy_dtoh_async`]), for programs and tests
//! that move numapin's pinned buffers themselves. The driver is loaded at
//! run time: without it every call returns [`CudaError`] (check with
//! [`available`]), and `NUMAPIN_NO_CUDA=1` makes numapin behave as if it
//! were not installed.
//!
//! [`Topology::gpus`]: crate::Topology::gpus
//! [`Topology::gpu_by_ordinal`]: crate::Topology::gpu_by_ordinal
//! [`Topology::ordinal_of`]: crate::Topology::ordinal_of

use serde::{Deserialize, Serialize};

pub use crate::platform::cuda::{
    available, device_count, driver_version, ensure_context, failed_frees, host_device_pointer,
    host_get_flags, memcpy_dtoh, memcpy_dtoh_async, memcpy_htod, memcpy_htod_async, set_device,
    ContextGuard, CudaError, CudaResult, DeviceBuffer, Event, FailedFrees, Stream,
    HOST_REGISTER_DEVICEMAP, HOST_REGISTER_PORTABLE,
};
pub use cudarc::driver::sys::{CUdeviceptr, CUevent, CUstream};

/// A CUDA device ordinal as this process sees it (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CudaOrdinal(pub u32);

/// A GPU's position in [`Topology::gpus`](crate::Topology::gpus), PCI bus
/// id order (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GpuIndex(pub u32);

impl std::fmt::Display for CudaOrdinal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Display for GpuIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl CudaOrdinal {
    /// The number.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl GpuIndex {
    /// The number.
    pub fn get(self) -> u32 {
        self.0
    }

    /// The position as a `usize`, for indexing [`Topology::gpus`](crate::Topology::gpus).
    pub fn as_usize(self) -> usize {
        self.0 as usize
    }
}
