//! [`AffinityError`]: what can go wrong planning or applying a binding.

use crate::report::ErrorKind;

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
    #[error("{variable}={}: {problem}", crate::report::quote(value))]
    Env {
        /// The variable's name.
        variable: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        problem: String,
        /// What to do.
        fix: String,
    },
    /// A system call refused the binding (`sched_setaffinity`,
    /// `set_mempolicy`, `execvp`).
    #[error("{what}")]
    System {
        /// What was attempted.
        what: String,
        /// What to do.
        fix: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
}

impl AffinityError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            AffinityError::Request { .. }
            | AffinityError::Input { .. }
            | AffinityError::Env { .. } => ErrorKind::Input,
            AffinityError::System { source, .. }
                if matches!(
                    source.raw_os_error(),
                    Some(libc::EPERM) | Some(libc::ENOSYS)
                ) =>
            {
                ErrorKind::Permission
            }
            AffinityError::System { .. } => ErrorKind::System,
        }
    }

    /// What to do about it.
    pub fn fix(&self) -> Option<String> {
        match self {
            AffinityError::Request { fix, .. }
            | AffinityError::Input { fix, .. }
            | AffinityError::Env { fix, .. }
            | AffinityError::System { fix, .. } => Some(fix.clone()),
        }
    }

    pub(crate) fn request(problem: impl Into<String>, fix: impl Into<String>) -> Self {
        AffinityError::Request {
            problem: problem.into(),
            fix: fix.into(),
        }
    }
}
