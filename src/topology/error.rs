//! [`TopologyError`]: what can go wrong reading a machine's topology.

use crate::report::{EnvError, ErrorKind, SystemError};

/// A cause kept by a [`TopologyError`]: an I/O error, hwloc's own error, ...
pub type Cause = crate::report::BoxError;

/// Reading a machine's topology failed. The message names the input (a
/// file, a variable); `fix()` says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// A file or folder that cannot be used.
    #[error("{input}: {problem}")]
    Input {
        /// The file, folder or value that was read.
        input: String,
        /// What is wrong with it.
        problem: String,
        /// What to do.
        fix: String,
        /// The error that made it unusable, if one did (reading it).
        #[source]
        source: Option<Cause>,
    },
    /// An environment variable with a value numapin cannot use.
    #[error(transparent)]
    Env(EnvError),
    /// The system failed (hwloc, a system call, a temporary folder).
    #[error(transparent)]
    System(SystemError),
}

impl TopologyError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            TopologyError::Input { .. } | TopologyError::Env(_) => ErrorKind::Input,
            TopologyError::System(_) => ErrorKind::System,
        }
    }

    /// What to do about it.
    pub fn fix(&self) -> Option<String> {
        match self {
            TopologyError::Input { fix, .. }
            | TopologyError::Env(EnvError { fix, .. })
            | TopologyError::System(SystemError { fix, .. }) => Some(fix.clone()),
        }
    }

    /// An input error without an underlying cause.
    pub(crate) fn input(
        input: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        TopologyError::Input {
            input: input.into(),
            problem: problem.into(),
            fix: fix.into(),
            source: None,
        }
    }

    /// An I/O error while reading an input file: an input error when it is
    /// about the file (missing, unreadable, not a file), a system error when
    /// it is about this process or machine (too many open files, no memory,
    /// a full disk, an I/O error of the device), so that the exit code and
    /// the fix name the real cause.
    pub(crate) fn io_input(path: &std::path::Path, e: std::io::Error) -> Self {
        Self::io_named(
            &crate::report::shorten(&path.display().to_string()),
            "cannot read it",
            e,
        )
    }

    /// An I/O error about `input` (a file or folder, already displayable),
    /// `what` saying what was attempted; classified as [`Self::io_input`] says.
    pub(crate) fn io_named(input: &str, what: &str, e: std::io::Error) -> Self {
        if is_system_io(&e) {
            return TopologyError::system(
                format!("{input}: {what}"),
                crate::platform::sys::fix_for_io(&e),
                e,
            );
        }
        let fix = match e.kind() {
            std::io::ErrorKind::NotFound => "check the path",
            std::io::ErrorKind::PermissionDenied => "make the file readable by this user",
            _ => "check the file",
        };
        TopologyError::Input {
            input: input.to_string(),
            problem: what.into(),
            fix: fix.into(),
            source: Some(e.into()),
        }
    }

    /// An environment variable `variable` set to `value` that cannot be
    /// used.
    pub(crate) fn env(
        variable: impl Into<String>,
        value: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        TopologyError::Env(EnvError::new(variable, value, problem, fix))
    }

    /// A system failure with its cause.
    pub(crate) fn system(
        what: impl Into<String>,
        fix: impl Into<String>,
        source: impl Into<Cause>,
    ) -> Self {
        TopologyError::System(SystemError::new(what, fix, source))
    }
}

/// Whether an I/O error is the system's (a limit of this process, memory, a
/// full disk, the device) rather than the file's.
pub(crate) fn is_system_io(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EMFILE
                | libc::ENFILE
                | libc::ENOMEM
                | libc::ENOSPC
                | libc::EDQUOT
                | libc::EFBIG
                | libc::EIO
                | libc::EAGAIN
                | libc::ENOBUFS
        )
    ) || e.kind() == std::io::ErrorKind::OutOfMemory
}
