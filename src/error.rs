//! Errors that name the input, the problem and the fix.
//!
//! Every error numapin reports to a person says what it read (a file, an
//! environment variable, a limit, a device), what is wrong with it, and what
//! to do. [`Error::exit_code`] maps usage and input errors to exit code 2.

use std::path::Path;

/// numapin's error type.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or other input that cannot be used.
    #[error("{input}: {problem}\n  fix: {fix}")]
    Input {
        /// The file, folder or value that was read.
        input: String,
        /// What is wrong with it.
        problem: String,
        /// What to do.
        fix: String,
    },
    /// An environment variable with a value numapin cannot use.
    #[error("{variable}={value:?}: {problem}\n  fix: {fix}")]
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
    /// A command-line request that cannot be met (a GPU out of range, ...).
    #[error("{problem}\n  fix: {fix}")]
    Usage {
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: String,
    },
    /// The system refused something (hwloc, a system call, the CUDA driver).
    #[error("{what}: {problem}\n  fix: {fix}")]
    System {
        /// What was attempted.
        what: String,
        /// What went wrong, with the system's own error.
        problem: String,
        /// What to do.
        fix: String,
    },
    /// An arena error (budget, mlock, mbind, registration, placement).
    #[error(transparent)]
    Arena(#[from] crate::arena::ArenaError),
    /// A loader error (configuration, or a batch that failed).
    #[error(transparent)]
    Loader(#[from] crate::loader::LoaderError),
}

/// `Result` with numapin's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An I/O error while reading an input file.
    pub fn io_input(path: &Path, e: std::io::Error) -> Self {
        let fix = match e.kind() {
            std::io::ErrorKind::NotFound => "check the path",
            std::io::ErrorKind::PermissionDenied => "make the file readable by this user",
            _ => "check the file",
        };
        Error::Input {
            input: path.display().to_string(),
            problem: format!("cannot read it: {e}"),
            fix: fix.into(),
        }
    }

    /// The process exit code for this error: 2 for usage and input errors,
    /// 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Input { .. } | Error::Env { .. } | Error::Usage { .. } => 2,
            Error::System { .. } => 1,
            Error::Arena(e) => e.exit_code(),
            Error::Loader(e) => e.exit_code(),
        }
    }
}
