//! [`StorageError`]: what can go wrong reading files to a GPU or to pinned
//! memory, or writing them from there.

use std::path::PathBuf;

use crate::arena::RuntimeError;
use crate::gpu::{CudaError, CudaOrdinal};
use crate::report::{BoxError, ErrorKind, SystemError};

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
    /// Writing a file failed in the system: a full filesystem (`ENOSPC`),
    /// a spent quota (`EDQUOT`), a file over the size limit (`EFBIG`), a
    /// drive error (`EIO`), a read-only or forbidden folder. The file that
    /// was at `path` before is untouched and no temporary file is left.
    #[error("{}: {op} failed{}", path.display(), write_note(*offset, *len, temp.as_deref()))]
    Write {
        /// The file being written (the target, not the temporary file).
        path: PathBuf,
        /// The temporary file beside it that was being written, if made.
        temp: Option<PathBuf>,
        /// What was being done: `writing`, `creating the temporary file`,
        /// `reserving space`, `fsync`, `renaming into place`.
        op: &'static str,
        /// Where in the file.
        offset: u64,
        /// How many bytes.
        len: u64,
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
    #[error(transparent)]
    Setup(SystemError),
    /// The pinned slots (or pinned tensors) could not be had.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
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
        /// The runtime's error.
        #[source]
        source: Box<RuntimeError>,
    },
}

impl StorageError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            StorageError::Input { .. }
            | StorageError::Truncated { .. }
            | StorageError::Request { .. } => ErrorKind::Input,
            StorageError::Runtime(e) => e.kind(),
            StorageError::Write { source, .. } => write_kind(source),
            StorageError::TensorMemory { source, .. } => source.kind(),
            StorageError::Read { .. } | StorageError::Cuda { .. } | StorageError::Setup(_) => {
                ErrorKind::System
            }
        }
    }

    /// What to do about it.
    pub fn fix(&self) -> Option<String> {
        match self {
            StorageError::Input { fix, .. }
            | StorageError::Request { fix, .. }
            | StorageError::Setup(SystemError { fix, .. }) => Some(fix.clone()),
            StorageError::Read { source, .. } => Some(read_fix(source).into()),
            StorageError::Write { path, source, .. } => Some(write_fix(path, source)),
            StorageError::Truncated { .. } => Some(
                "do not write the file while it is read; check that it was copied whole".into(),
            ),
            StorageError::Cuda { source, .. } => Some(if source.is_no_driver() {
                "run on a machine with the NVIDIA driver, or load to pinned host memory".into()
            } else {
                "check the GPU (`nvidia-smi`) and its free memory".into()
            }),
            StorageError::Runtime(e) => e.fix(),
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
        StorageError::Setup(SystemError::new(what, fix, source))
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

/// ` (N bytes at offset X, through .name.numapin-tmp-..)`, the parts
/// there are.
fn write_note(offset: u64, len: u64, temp: Option<&std::path::Path>) -> String {
    let mut parts = Vec::new();
    if len > 0 {
        parts.push(format!("{len} bytes at offset {offset}"));
    }
    if let Some(name) = temp.and_then(|t| t.file_name()) {
        parts.push(format!("through {}", name.to_string_lossy()));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

fn write_kind(e: &std::io::Error) -> ErrorKind {
    match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM | libc::EROFS) => ErrorKind::Permission,
        _ => ErrorKind::System,
    }
}

/// What to do about a failed write of `path`, by the system's error.
fn write_fix(path: &std::path::Path, e: &std::io::Error) -> String {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.display().to_string(),
        _ => ".".to_string(),
    };
    let untouched = "the file that was there before is untouched";
    match e.raw_os_error() {
        Some(libc::ENOSPC) => format!(
            "the filesystem holding {dir} is full: free space there (`df -h {dir}`) or save to another filesystem; {untouched}"
        ),
        Some(libc::EDQUOT) => format!(
            "this user's disk quota on the filesystem holding {dir} is spent: free space under the quota (`quota -s`) or have it raised; {untouched}"
        ),
        Some(libc::EFBIG) => {
            let limit = match crate::platform::file_write::file_size_limit() {
                Some(l) => format!("now {}", crate::arena::fmt_bytes(l)),
                None => "now unlimited".to_string(),
            };
            format!(
                "the file is larger than this process's file size limit (`ulimit -f`, {limit}) or than the filesystem allows: raise the limit, or save in shards (max_shard_size); {untouched}"
            )
        }
        Some(libc::EIO) => format!(
            "the drive reported an error: check `dmesg` and the drive's health (`nvme smart-log`, `smartctl`); {untouched}"
        ),
        Some(libc::EROFS) => format!(
            "the filesystem holding {dir} is mounted read-only: save elsewhere, or remount it read-write"
        ),
        Some(libc::EACCES | libc::EPERM) => format!(
            "this user may not create files in {dir}: save to a folder it may write, or change the folder's permissions"
        ),
        Some(libc::ENOENT | libc::ENOTDIR) => format!("the folder {dir} does not exist: create it first"),
        Some(libc::EMFILE | libc::ENFILE) => {
            "too many open files: raise the open-file limit (`ulimit -n`)".to_string()
        }
        Some(libc::ENAMETOOLONG) => "the path is too long: use a shorter name".to_string(),
        _ => format!("check the filesystem holding {dir}; {untouched}"),
    }
}
