//! [`StagedError`]: what can go wrong in a staged copy or a pinned copy.

use crate::affinity::AffinityError;
use crate::arena::RuntimeError;
use crate::report::{BoxError, ErrorKind, SystemError};

/// A staged copy ([`copy_to_device`](super::copy_to_device) and the
/// others) or a [`pinned_copy`](super::pinned_copy) failed; `fix()` says
/// what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StagedError {
    /// A copy that cannot be done: options out of range
    /// ([`StagedOptions`](super::StagedOptions)), a pointer that is not
    /// device memory of that GPU, a range past its end.
    #[error("{problem}")]
    Request {
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: String,
    },
    /// The system or the driver failed (a thread, a stream, a copy).
    #[error(transparent)]
    Setup(SystemError),
    /// The GPU is not in the topology, or the staging slots (or the
    /// pinned copy's buffer) could not be had.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The copy's threads could not be bound to the GPU's CPUs.
    #[error(transparent)]
    Affinity(#[from] AffinityError),
}

impl StagedError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            StagedError::Request { .. } => ErrorKind::Input,
            StagedError::Setup(_) => ErrorKind::System,
            StagedError::Runtime(e) => e.kind(),
            StagedError::Affinity(e) => e.kind(),
        }
    }

    /// What to do about it.
    pub fn fix(&self) -> Option<String> {
        match self {
            StagedError::Request { fix, .. } | StagedError::Setup(SystemError { fix, .. }) => {
                Some(fix.clone())
            }
            StagedError::Runtime(e) => e.fix(),
            StagedError::Affinity(e) => e.fix(),
        }
    }

    pub(crate) fn setup(
        what: impl Into<String>,
        fix: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        StagedError::Setup(SystemError::new(what, fix, source))
    }
}
