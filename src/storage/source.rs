//! [`Source`]: a file opened for the reader, with `O_DIRECT` where its
//! filesystem allows it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::platform::block::{self, Backing};
use crate::platform::file::{self, FileKind, Identity, Opened};

use super::StorageError;

/// The smallest alignment direct reads use (a page: what the arena's
/// buffers are aligned to, and a multiple of every logical block size
/// below it).
pub(crate) const MIN_ALIGN: u64 = 4096;
/// Alignments above this turn direct reads off for the file (none seen in
/// practice; slots would grow).
const MAX_ALIGN: u64 = 1 << 20;

/// A regular file opened for reading: a buffered descriptor and, where the
/// filesystem allows it, an `O_DIRECT` one on the same file. `Sync`: any
/// number of reader threads read it at once.
#[derive(Debug)]
pub struct Source {
    path: PathBuf,
    file: File,
    direct: Option<File>,
    /// Why there is no direct descriptor (for the report).
    why_buffered: Option<String>,
    align: u64,
    len: u64,
    dev: (u32, u32),
    /// Device, inode, length and modification time when opened.
    identity: Identity,
    /// Cleared when a direct read is refused (`EINVAL` from a filesystem
    /// that took the open): the rest goes through the page cache.
    direct_ok: AtomicBool,
    /// Cleared when the file or kernel refuses `RWF_NOWAIT`.
    nowait_ok: AtomicBool,
    /// Cleared when the kernel will not say what the page cache holds of
    /// the file (`cachestat`); why, for the report.
    residency_ok: AtomicBool,
    why_no_residency: OnceLock<String>,
    backing: OnceLock<Backing>,
}

impl Source {
    /// Opens `path` (a regular file) for reading, with a second, `O_DIRECT`
    /// descriptor when its filesystem supports direct I/O.
    ///
    /// # Errors
    /// [`StorageError::Input`] when the path does not exist, cannot be read,
    /// or is not a regular file (a directory, a FIFO, a device, a socket):
    /// a FIFO is recognised without waiting for a writer.
    pub fn open(path: impl AsRef<Path>) -> Result<Source, StorageError> {
        let path = path.as_ref();
        let o = file::open(path, false).map_err(|e| open_error(path, e))?;
        if o.kind != FileKind::Regular {
            return Err(StorageError::input(
                path,
                format!("is {}, not a regular file", o.kind.describe()),
                "pass the path of a regular file",
            ));
        }
        let (direct, align, why_buffered) = direct_descriptor(&o, || open_direct(path));
        let identity = file::identity(&o.file).map_err(|e| open_error(path, e))?;
        Ok(Source {
            path: path.to_path_buf(),
            identity,
            file: o.file,
            direct_ok: AtomicBool::new(direct.is_some()),
            direct,
            why_buffered,
            align,
            len: o.len,
            dev: o.dev,
            nowait_ok: AtomicBool::new(true),
            residency_ok: AtomicBool::new(true),
            why_no_residency: OnceLock::new(),
            backing: OnceLock::new(),
        })
    }

    /// The path it was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its length in bytes when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether it is read with `O_DIRECT` where the page cache does not
    /// hold the data (false when its filesystem refused direct I/O).
    pub fn direct_io(&self) -> bool {
        self.direct.is_some() && self.direct_ok.load(Ordering::Relaxed)
    }

    /// Why it is read through the page cache only, when it is.
    pub fn why_buffered(&self) -> Option<&str> {
        if self.direct.is_some() && !self.direct_ok.load(Ordering::Relaxed) {
            return Some("its filesystem refused an O_DIRECT read");
        }
        self.why_buffered.as_deref()
    }

    /// The alignment of direct reads (file offsets, lengths and memory).
    pub fn alignment(&self) -> u64 {
        self.align
    }

    /// The device the file lives on (`st_dev`: major, minor).
    pub fn device(&self) -> (u32, u32) {
        self.dev
    }

    /// Its device, inode, length and modification time when it was
    /// opened.
    pub(crate) fn identity(&self) -> Identity {
        self.identity
    }

    /// What has changed about it since it was opened (it was written to,
    /// shortened or extended), if anything.
    pub(crate) fn changed(&self) -> Option<String> {
        match file::identity(&self.file) {
            Err(e) => Some(format!("it cannot be examined any more ({e})")),
            Ok(now) if now.len != self.identity.len => Some(format!(
                "it is {} bytes long now, and was {} bytes",
                now.len, self.identity.len
            )),
            Ok(now) if now.mtime != self.identity.mtime => Some("it was written to".to_string()),
            Ok(_) => None,
        }
    }

    pub(crate) fn buffered(&self) -> &File {
        &self.file
    }

    pub(crate) fn direct_file(&self) -> Option<&File> {
        self.direct
            .as_ref()
            .filter(|_| self.direct_ok.load(Ordering::Relaxed))
    }

    pub(crate) fn refuse_direct(&self) {
        self.direct_ok.store(false, Ordering::Relaxed);
    }

    pub(crate) fn nowait(&self) -> bool {
        self.nowait_ok.load(Ordering::Relaxed)
    }

    pub(crate) fn refuse_nowait(&self) {
        self.nowait_ok.store(false, Ordering::Relaxed);
    }

    /// Why [`IoMode::Auto`](super::IoMode::Auto) reads this file through
    /// the page cache: the kernel would not say which parts of it the page
    /// cache holds (`cachestat` needs Linux 6.5, and newer kernels answer
    /// it only for files this user owns or may write).
    pub fn page_cache_unknown(&self) -> Option<&str> {
        self.why_no_residency.get().map(String::as_str)
    }

    pub(crate) fn residency_known(&self) -> bool {
        self.residency_ok.load(Ordering::Relaxed)
    }

    pub(crate) fn refuse_residency(&self, e: &std::io::Error) {
        self.residency_ok.store(false, Ordering::Relaxed);
        let why = match e.raw_os_error() {
            Some(libc::ENOSYS) => "the kernel has no cachestat (Linux 6.5+)".to_string(),
            Some(libc::EPERM) => {
                "the kernel answers cachestat only for files this user owns or may write"
                    .to_string()
            }
            _ => format!("cachestat failed: {e}"),
        };
        let _ = self.why_no_residency.set(why);
    }

    /// Where its bytes come from (found once, from sysfs and mountinfo).
    pub(crate) fn backing(&self) -> &Backing {
        self.backing
            .get_or_init(|| block::locate(self.dev, Path::new("/")))
    }
}

/// The `O_DIRECT` descriptor of the file opened as `o` (`reopen` opens it
/// again with `O_DIRECT`, checked to be the same file), its alignment
/// (at least [`MIN_ALIGN`]), and why there is none when there is none.
pub(crate) fn direct_descriptor(
    o: &Opened,
    reopen: impl FnOnce() -> std::io::Result<Opened>,
) -> (Option<File>, u64, Option<String>) {
    match o.direct_align {
        Some(None) => (
            None,
            MIN_ALIGN,
            Some("its filesystem does not support O_DIRECT for it".to_string()),
        ),
        Some(Some(a)) if a > MAX_ALIGN => (
            None,
            MIN_ALIGN,
            Some(format!(
                "O_DIRECT needs {a}-byte alignment, more than numapin uses"
            )),
        ),
        known => {
            let align = known.flatten().unwrap_or(MIN_ALIGN).max(MIN_ALIGN);
            match reopen() {
                Ok(d) if d.dev == o.dev && d.ino == o.ino => (Some(d.file), align, None),
                Ok(_) => (
                    None,
                    MIN_ALIGN,
                    Some("the path changed between two opens".to_string()),
                ),
                Err(e) => (
                    None,
                    MIN_ALIGN,
                    Some(format!("opening it with O_DIRECT failed: {e}")),
                ),
            }
        }
    }
}

/// The `O_DIRECT` open (tests make the filesystem refuse it).
fn open_direct(path: &Path) -> std::io::Result<file::Opened> {
    #[cfg(test)]
    if super::faults::direct_open_refused() {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    file::open(path, true)
}

fn open_error(path: &Path, e: std::io::Error) -> StorageError {
    let (problem, fix) = match e.raw_os_error() {
        Some(libc::ENOENT) => ("does not exist", "check the path"),
        Some(libc::EACCES | libc::EPERM) => (
            "cannot be read (permission denied)",
            "give this user read permission, or run as one who has it",
        ),
        Some(libc::ENOTDIR) => ("has a part that is not a directory", "check the path"),
        Some(libc::ELOOP) => ("has too many symbolic links", "check the path"),
        Some(libc::EMFILE | libc::ENFILE) => (
            "cannot be opened: too many open files",
            "raise the open-file limit (`ulimit -n`)",
        ),
        _ => ("cannot be opened", "check the path and the filesystem"),
    };
    StorageError::input_from(path, problem, fix, e)
}
