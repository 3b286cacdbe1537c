//! The CUDA driver: loaded or not, its version and how many devices it
//! shows this process.

use crate::gpu::CudaError;
use crate::platform::cuda::{self, NoDriver};

/// Whether the CUDA driver could be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaDriver {
    /// Loaded and initialised.
    Loaded {
        /// The driver's version (`12080` for 12.8).
        version: u32,
        /// How many devices it shows this process (`cuDeviceGetCount`,
        /// after `CUDA_VISIBLE_DEVICES`), or why it could not say.
        devices: Result<u32, CudaError>,
    },
    /// Not available, and why (not installed, failed to initialise,
    /// turned off by `NUMAPIN_NO_CUDA`).
    Unavailable(CudaError),
    /// Not loaded because the caller asked for that
    /// ([`SnapshotOptions::cuda`](super::SnapshotOptions::cuda) false).
    NotLoaded,
}

impl CudaDriver {
    /// Loads and initialises the driver (once per process) and counts its
    /// devices.
    pub fn load() -> Self {
        match cuda::driver_version() {
            Ok(version) => CudaDriver::Loaded {
                version,
                devices: cuda::device_count(),
            },
            Err(e) => CudaDriver::Unavailable(e),
        }
    }

    /// The version when loaded (`12080` for 12.8).
    pub fn version(&self) -> Option<u32> {
        match self {
            CudaDriver::Loaded { version, .. } => Some(*version),
            _ => None,
        }
    }

    /// Why the driver is unavailable, in a phrase (`libcuda.so was not
    /// found ...`, `disabled by NUMAPIN_NO_CUDA`); `None` when loaded or
    /// not asked for.
    pub fn unavailable_reason(&self) -> Option<String> {
        match self {
            CudaDriver::Unavailable(CudaError::NoDriver(why)) => Some(why.to_string()),
            CudaDriver::Unavailable(e) => Some(e.to_string()),
            _ => None,
        }
    }

    /// Whether the driver was turned off with `NUMAPIN_NO_CUDA`.
    pub fn disabled_by_env(&self) -> bool {
        matches!(
            self,
            CudaDriver::Unavailable(CudaError::NoDriver(NoDriver::Disabled))
        )
    }
}
