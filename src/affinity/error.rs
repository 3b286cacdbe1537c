//! [`AffinityError`]: what can go wrong planning or applying a binding.

use crate::report::{EnvError, ErrorKind, SystemError};

/// Planning or applying a binding failed; `fix()` says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AffinityError {
    /// A request that this machine or description cannot meet: a GPU or
    /// node that is not there, too few cores for the ranks, a command that
    /// cannot be run.
    #[error("{problem}")]
    Request {
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: String,
    },
    /// A description that cannot be planned on (no CPUs this process may use).
    #[error("{input}: {problem}")]
    Input {
        /// The description's source (a file, or `live`).
        input: String,
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: String,
    },
    /// A launcher variable with a value that cannot be a local rank.
    #[error(transparent)]
    Env(EnvError),
    /// A system call refused the binding (`sched_setaffinity`,
    /// `set_mempolicy`, `execvp`); the cause is the system's
    /// [`std::io::Error`].
    #[error(transparent)]
    System(SystemError),
}

impl AffinityError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            AffinityError::Request { .. } | AffinityError::Input { .. } | AffinityError::Env(_) => {
                ErrorKind::Input
            }
            AffinityError::System(e)
                if matches!(
                    e.io_error().and_then(std::io::Error::raw_os_error),
                    Some(libc::EPERM) | Some(libc::ENOSYS)
                ) =>
            {
                ErrorKind::Permission
            }
            AffinityError::System(_) => ErrorKind::System,
        }
    }

    /// What to do about it.
    pub fn fix(&self) -> Option<String> {
        match self {
            AffinityError::Request { fix, .. }
            | AffinityError::Input { fix, .. }
            | AffinityError::Env(EnvError { fix, .. })
            | AffinityError::System(SystemError { fix, .. }) => Some(fix.clone()),
        }
    }

    /// A system call's failure: `what` was attempted, `fix` says what to
    /// do.
    pub(crate) fn system(
        what: impl Into<String>,
        fix: impl Into<String>,
        source: std::io::Error,
    ) -> Self {
        AffinityError::System(SystemError::new(what, fix, source))
    }

    pub(crate) fn request(problem: impl Into<String>, fix: impl Into<String>) -> Self {
        AffinityError::Request {
            problem: problem.into(),
            fix: fix.into(),
        }
    }
}
