//! The command line's errors and exit codes: 2 for bad usage or input, 1
//! for a system failure. Only this crate decides exit codes.

use numapin::error::SystemError;
use numapin::ErrorKind;

/// A failure of a command.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// A library error.
    #[error(transparent)]
    Lib(#[from] numapin::Error),
    /// Flags that cannot be used together or values out of range.
    #[error("{problem}")]
    Usage {
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: String,
    },
    /// The system failed for the command itself (writing output, timing).
    #[error(transparent)]
    System(SystemError),
}

macro_rules! from_domain {
    ($($t:ty),*) => {$(
        impl From<$t> for CliError {
            fn from(e: $t) -> Self {
                CliError::Lib(e.into())
            }
        }
    )*};
}
from_domain!(
    numapin::topology::TopologyError,
    numapin::affinity::AffinityError,
    numapin::runtime::RuntimeError,
    numapin::LoaderError,
    numapin::staged::StagedError,
    numapin::procs::ProcessError
);

/// `Result` with [`CliError`].
pub(crate) type Result<T, E = CliError> = std::result::Result<T, E>;

impl CliError {
    pub(crate) fn system(
        what: impl Into<String>,
        fix: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        CliError::System(SystemError::new(what, fix, source))
    }

    /// The process exit code: 2 for usage and input errors, 1 otherwise.
    pub(crate) fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage { .. } => 2,
            CliError::Lib(e) if e.kind() == ErrorKind::Input => 2,
            _ => 1,
        }
    }

    /// What to do about it.
    pub(crate) fn fix(&self) -> Option<String> {
        match self {
            CliError::Lib(e) => e.fix(),
            CliError::Usage { fix, .. } => Some(fix.clone()),
            CliError::System(e) => Some(e.fix.clone()),
        }
    }
}
