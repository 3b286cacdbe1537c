//! [`ProcessError`]: what can go wrong reading another process.

use crate::report::ErrorKind;

/// Reading a process (or the process table) failed. The message names the
/// process and the file; `fix()` says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// There is no process with this id (under the root read).
    #[error("pid {pid}: no such process")]
    NoSuchProcess {
        /// The process id asked for.
        pid: u32,
    },
    /// The process went away while it was read (or is a zombie: exited,
    /// not yet reaped by its parent).
    #[error("pid {pid}: {how}")]
    Exited {
        /// The process id.
        pid: u32,
        /// `exited while it was read`, `is a zombie (exited, not yet reaped)`.
        how: String,
    },
    /// A file of the process (or `/proc` itself) could not be read.
    #[error("{path}: {problem}")]
    Unreadable {
        /// The file.
        path: String,
        /// What went wrong, in words.
        problem: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
}

impl ProcessError {
    /// What kind of failure this is: [`ErrorKind::Input`] for a process
    /// that is not there, [`ErrorKind::Permission`] for a file this user
    /// may not read, [`ErrorKind::System`] otherwise.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ProcessError::NoSuchProcess { .. } => ErrorKind::Input,
            ProcessError::Exited { .. } => ErrorKind::System,
            ProcessError::Unreadable { source, .. }
                if crate::platform::procfs::is_denied(source) =>
            {
                ErrorKind::Permission
            }
            ProcessError::Unreadable { .. } => ErrorKind::System,
        }
    }

    /// What to do about it.
    pub fn fix(&self) -> Option<String> {
        Some(match self {
            ProcessError::NoSuchProcess { .. } => {
                "check the process id (`ps -ef`, `pgrep -f train.py`): the process may have exited".into()
            }
            ProcessError::Exited { .. } => "nothing to check: the process has ended".into(),
            ProcessError::Unreadable { source, .. }
                if crate::platform::procfs::is_denied(source) =>
            {
                "run numapin ps as the process's user, or as root (another user's descriptors, environment and memory map are private)".into()
            }
            ProcessError::Unreadable { source, .. }
                if source.kind() == std::io::ErrorKind::InvalidData =>
            {
                "the file is larger or stranger than a process's file should be: check the process (or the folder given with --root)".into()
            }
            ProcessError::Unreadable { .. } => {
                "check that /proc is mounted and readable (`mount -t proc proc /proc`)".into()
            }
        })
    }

    /// An I/O error reading `path`, in words.
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        let problem = if crate::platform::procfs::is_denied(&source) {
            "not readable by this user"
        } else if source.kind() == std::io::ErrorKind::InvalidData {
            "cannot be used"
        } else {
            "cannot be read"
        };
        ProcessError::Unreadable {
            path: crate::report::shorten(&path.display().to_string()),
            problem: problem.into(),
            source,
        }
    }
}
