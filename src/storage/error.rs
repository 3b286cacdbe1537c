//! [`StorageError`]: what can go wrong reading files to a GPU or to pinned
//! memory.

use std::path::PathBuf;

use crate::arena::ArenaError;
use crate::gpu::{CudaError, CudaOrdinal};
use crate::loader::BoxError;
use crate::report::ErrorKind;

/// A failure of the storage reader or of a checkpoint loader; `fix()` says
/// what to do, `kind()` what kind of failure it is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// A file (or its contents) cannot be used: not there, not a regular
    /// file, too short for what was asked, a header that does not parse or
    /// that lies.
    #[error("{}: {problem}", path.display())]
    Input {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: String,
        /// The system's or the parser's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// Opening or reading a file failed in the system (an I/O error from
    /// the drive, a network filesystem gone).
    #[error("{}: reading {len} bytes at offset {offset} failed", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Where the read started.
        offset: u64,
        /// How many bytes it asked for.
        len: usize,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file ended before the bytes asked for (it was shortened while
    /// being read).
    #[error("{}: the file ends at byte {file_len}, before byte {wanted_end} that the read needs (it changed while being read?)", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Its length now.
        file_len: u64,
        /// The end of the bytes asked for.
        wanted_end: u64,
    },
    /// A request that cannot be done: a range past a file's end, a device
    /// pointer that is not device memory of the GPU, a bad option.
    #[error("{problem}")]
    Request {
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: String,
    },
    /// A CUDA call failed.
    #[error("{what} on GPU {gpu} failed")]
    Cuda {
        /// The GPU.
        gpu: CudaOrdinal,
        /// What was attempted.
        what: &'static str,
        /// The driver's error.
        #[source]
        source: CudaError,
    },
    /// Threads could not be started or placed.
    #[error("{what}")]
    Setup {
        /// What was attempted.
        what: String,
        /// What to do.
        fix: String,
        /// The cause.
        #[source]
        source: BoxError,
    },
    /// The pinned slots (or pinned tensors) could not be had.
    #[error(transparent)]
    Arena(#[from] ArenaError),
    /// The pinned memory for one tensor of a checkpoint could not be had
    /// (the node's budget is short, or the file claims more than it can
    /// hold).
    #[error("{}: tensor {tensor} needs {len} bytes of pinned memory", path.display())]
    TensorMemory {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor's name, quoted.
        tensor: String,
        /// Its bytes.
        len: usize,
        /// The arena's error.
        #[source]
        source: Box<ArenaError>,
    },
}

impl StorageError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            StorageError::Input { .. }
            | StorageError::Truncated { .. }
            | StorageError::Request { .. } => ErrorKind::Input,
            StorageError::Arena(e) => e.kind(),
            StorageError::TensorMemory { source, .. } => source.kind(),
            StorageError::Read { .. } | StorageError::Cuda { .. } | StorageError::Setup { .. } => {
                ErrorKind::System
            }
        }
    }

    /// What to do about it.
    pub fn fix(&self) -> Option<String> {
        match self {
            StorageError::Input { fix, .. }
            | StorageError::Request { fix, .. }
            | StorageError::Setup { fix, .. } => Some(fix.clone()),
            StorageError::Read { source, .. } => Some(read_fix(source).into()),
            StorageError::Truncated { .. } => Some(
                "do not write the file while it is read; check that it was copied whole".into(),
            ),
            StorageError::Cuda { source, .. } => Some(if source.is_no_driver() {
                "run on a machine with the NVIDIA driver, or load to pinned host memory".into()
            } else {
                "check the GPU (`nvidia-smi`) and its free memory".into()
            }),
            StorageError::Arena(e) => e.fix(),
            StorageError::TensorMemory { source, .. } => source.fix(),
        }
    }

    /// An input error about `path`.
    pub(crate) fn input(
        path: impl Into<PathBuf>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        StorageError::Input {
            path: path.into(),
            problem: problem.into(),
            fix: fix.into(),
            source: None,
        }
    }

    /// An input error about `path`, with its cause.
    pub(crate) fn input_from(
        path: impl Into<PathBuf>,
        problem: impl Into<String>,
        fix: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        StorageError::Input {
            path: path.into(),
            problem: problem.into(),
            fix: fix.into(),
            source: Some(source.into()),
        }
    }

    /// A request that cannot be done.
    pub(crate) fn request(problem: impl Into<String>, fix: impl Into<String>) -> Self {
        StorageError::Request {
            problem: problem.into(),
            fix: fix.into(),
        }
    }

    pub(crate) fn setup(
        what: impl Into<String>,
        fix: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        StorageError::Setup {
            what: what.into(),
            fix: fix.into(),
            source: source.into(),
        }
    }
}

fn read_fix(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EIO) => "the drive reported an error: check `dmesg` and the drive's health (`nvme smart-log`, `smartctl`)",
        Some(libc::ESTALE | libc::ENOTCONN | libc::ETIMEDOUT | libc::EHOSTDOWN) => {
            "the network filesystem went away: check the mount and the server"
        }
        Some(libc::ENOMEM) => "free memory, or read with fewer threads (ReadOptions::threads)",
        _ => "check the file and the filesystem it is on",
    }
}
