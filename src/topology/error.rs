//! [`TopologyError`]: what can go wrong reading a machine's topology.

use crate::report::ErrorKind;

/// A cause kept by a [`TopologyError`]: an I/O error, hwloc's own error, ...
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

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
    /// The system failed (hwloc, a system call, a temporary folder).
    #[error("{what}")]
    System {
        /// What was attempted.
        what: String,
        /// What to do.
        fix: String,
        /// What went wrong.
        #[source]
        source: Cause,
    },
}

impl TopologyError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            TopologyError::Input { .. } | TopologyError::Env { .. } => ErrorKind::Input,
            TopologyError::System { .. } => ErrorKind::System,
        }
    }

    /// What to do about it.
    pub fn fix(&self) -> Option<String> {
        match self {
            TopologyError::Input { fix, .. }
            | TopologyError::Env { fix, .. }
            | TopologyError::System { fix, .. } => Some(fix.clone()),
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
            return TopologyError::System {
                what: format!("{input}: {what}"),
                fix: crate::platform::sys::fix_for_io(&e).into(),
                source: e.into(),
            };
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

    /// A system failure with its cause.
    pub(crate) fn system(
        what: impl Into<String>,
        fix: impl Into<String>,
        source: impl Into<Cause>,
    ) -> Self {
        TopologyError::System {
            what: what.into(),
            fix: fix.into(),
            source: source.into(),
        }
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
