//! [`LoaderError`]: what can go wrong in a loader.

use crate::affinity::AffinityError;
use crate::arena::RuntimeError;
use crate::gpu::{CudaError, CudaOrdinal};
use crate::report::{ErrorKind, SystemError};

use super::MAX_CONSUMER_STREAMS;

/// A producer's error, boxed.
pub use crate::report::BoxError;

/// A loader failure, at a batch's position or at set-up;
/// `fix()` says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoaderError {
    /// The producer returned an error for this batch.
    #[error("batch {index}: the producer failed")]
    Producer {
        /// The batch.
        index: u64,
        /// The producer's error.
        #[source]
        source: BoxError,
    },
    /// The producer panicked on this batch.
    #[error("batch {index}: the producer panicked: {message}")]
    Panicked {
        /// The batch.
        index: u64,
        /// The panic message.
        message: String,
    },
    /// The producer claimed more bytes than the slot holds.
    #[error(
        "batch {index}: the producer returned {returned} bytes, more than the {capacity}-byte slot"
    )]
    TooLong {
        /// The batch.
        index: u64,
        /// The length returned.
        returned: usize,
        /// The slot's length.
        capacity: usize,
    },
    /// A CUDA call for this batch failed.
    #[error("batch {index}: {what} on GPU {gpu} failed")]
    Cuda {
        /// The batch.
        index: u64,
        /// The CUDA device.
        gpu: CudaOrdinal,
        /// What was attempted.
        what: &'static str,
        /// The CUDA error.
        #[source]
        source: CudaError,
    },
    /// The consumer holds every batch the loader can have out at once, so
    /// asking for another would wait forever.
    #[error("the consumer holds all {held} {what}, so no further batch can be delivered")]
    ConsumerHoldsAll {
        /// Batches held.
        held: usize,
        /// `pinned slots` or `device buffers`.
        what: &'static str,
        /// The setting that bounds them (`depth` or `ring`).
        setting: &'static str,
    },
    /// A batch was made to wait on more streams than a loader supports.
    #[error("batch {index}: made to wait on more than {MAX_CONSUMER_STREAMS} streams")]
    TooManyStreams {
        /// The batch.
        index: u64,
    },
    /// A configuration value that cannot be used.
    #[error("loader configuration {setting} = {value}: {problem}")]
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
    /// Setting up (threads, the GPU's stream and ring) failed in the
    /// system or the driver.
    #[error(transparent)]
    Setup(SystemError),
    /// The pinned slots could not be had.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The threads could not be placed, or the GPU is not in the topology.
    #[error(transparent)]
    Affinity(#[from] AffinityError),
}

impl LoaderError {
    /// The batch the error is about, if it is about one.
    pub fn index(&self) -> Option<u64> {
        match self {
            LoaderError::Producer { index, .. }
            | LoaderError::Panicked { index, .. }
            | LoaderError::TooLong { index, .. }
            | LoaderError::Cuda { index, .. }
            | LoaderError::TooManyStreams { index } => Some(*index),
            _ => None,
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            LoaderError::Config { .. } => ErrorKind::Input,
            LoaderError::Runtime(e) => e.kind(),
            LoaderError::Affinity(e) => e.kind(),
            _ => ErrorKind::System,
        }
    }

    /// What to do about it.
    pub fn fix(&self) -> Option<String> {
        match self {
            LoaderError::Producer { .. } | LoaderError::Panicked { .. } => None,
            LoaderError::TooLong { .. } => Some("return at most the slot's length (raise LoaderConfig::batch_bytes for larger batches)".into()),
            LoaderError::Cuda { .. } => Some("check the GPU (`nvidia-smi`); after a sticky error (CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_FAILED) the context is lost and the process must restart".into()),
            LoaderError::ConsumerHoldsAll { setting, .. } => Some(format!("drop batches before asking for more, or raise LoaderConfig::{setting}")),
            LoaderError::TooManyStreams { .. } => Some("make one stream wait on the batch and order the others after it with events".into()),
            LoaderError::Config { fix, .. }
            | LoaderError::Setup(SystemError { fix, .. }) => Some(fix.clone()),
            LoaderError::Runtime(e) => e.fix(),
            LoaderError::Affinity(e) => e.fix(),
        }
    }

    pub(crate) fn config(
        setting: &'static str,
        value: impl ToString,
        problem: &str,
        fix: &str,
    ) -> Self {
        LoaderError::Config {
            setting,
            value: value.to_string(),
            problem: problem.into(),
            fix: fix.into(),
        }
    }

    pub(crate) fn setup(
        what: impl Into<String>,
        fix: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        LoaderError::Setup(SystemError::new(what, fix, source))
    }

    /// A CUDA failure while setting up work on GPU `gpu`.
    pub(crate) fn cuda_setup(gpu: CudaOrdinal, what: &str, e: CudaError) -> Self {
        let fix = if e.is_no_driver() {
            "run on a machine with the NVIDIA driver, or use a host-mode target (Target::HostForGpu, HostNode, Host)"
        } else {
            "check the GPU (`nvidia-smi`) and its free memory; lower LoaderConfig::ring or batch_bytes"
        };
        Self::setup(format!("setting up a loader for GPU {gpu}: {what}"), fix, e)
    }
}
