//! The file a save replaces, and the temporary file beside it that the
//! save writes: named after the target (`.<name>.numapin-tmp-<pid>-<n>`),
//! created with `O_EXCL` and locked (`flock`) while it is written, renamed
//! over the target when whole, removed on any failure (and, when a killed
//! save left one, by the next save to the same path).
//!
//! What the target may be: a regular file or nothing (a new file); a
//! symbolic link is followed (the file it points to is replaced, the link
//! stays, as `open(path, "wb")` would write through it); a directory, a
//! FIFO, a socket or a device is refused.

use std::fs::File;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::platform::file::{self, Opened};
use crate::platform::file_write as sys;

use super::super::StorageError;

/// Symbolic links followed before giving up (as the kernel's `ELOOP`).
const MAX_LINKS: usize = 40;
/// Bytes of the target's name kept in a temporary file's name (names are
/// at most 255 bytes; the rest is `.`, the marker, the pid and a count).
const MAX_NAME_KEPT: usize = 200;
/// What marks numapin's temporary files.
const MARKER: &[u8] = b".numapin-tmp-";

/// Temporary files made by this process so far (their `<n>`).
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Where a save goes: the file to replace (symbolic links followed) and
/// its permission bits when it exists.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The path as the caller gave it (for messages).
    pub(crate) shown: PathBuf,
    /// The file replaced.
    pub(crate) real: PathBuf,
    /// Its permission bits, when it exists.
    pub(crate) mode: Option<u32>,
}

impl Target {
    /// The folder the file is in.
    pub(crate) fn dir(&self) -> PathBuf {
        match self.real.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }
}

/// Resolves `path`: follows symbolic links to the file they name (which
/// need not exist), refuses what is not a regular file.
///
/// # Errors
/// [`StorageError::Input`] for a path without a file name, a directory,
/// a FIFO, a socket or a device, a loop of links, or a path that cannot be
/// looked at.
pub(crate) fn resolve(path: &Path) -> Result<Target, StorageError> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        if p.file_name().is_none() {
            return Err(StorageError::input(
                path,
                "names no file (it ends in `/`, `.` or `..`)",
                "pass the path of the file to write",
            ));
        }
        let m = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Target {
                    shown: path.to_path_buf(),
                    real: p,
                    mode: None,
                })
            }
            Err(e) => {
                return Err(StorageError::input_from(
                    path,
                    "cannot be looked at",
                    "check the path and its folders' permissions",
                    e,
                ))
            }
        };
        let t = m.file_type();
        if t.is_symlink() {
            let link = std::fs::read_link(&p).map_err(|e| {
                StorageError::input_from(path, "is a link that cannot be read", "check the path", e)
            })?;
            p = match p.parent() {
                Some(d) if link.is_relative() => d.join(link),
                _ => link,
            };
            continue;
        }
        if !t.is_file() {
            let real = if p == path {
                String::new()
            } else {
                format!(" (through a link, {})", p.display())
            };
            return Err(StorageError::input(
                path,
                format!(
                    "is {}{real}, not a regular file",
                    file::kind_of(m.mode() as libc::mode_t).describe()
                ),
                "pass the path of a regular file (a save replaces the file whole, through a temporary file and a rename)",
            ));
        }
        return Ok(Target {
            shown: path.to_path_buf(),
            real: p,
            mode: Some(m.mode() & 0o7777),
        });
    }
    Err(StorageError::input(
        path,
        format!("has more than {MAX_LINKS} symbolic links in a row (a loop?)"),
        "check the links",
    ))
}

/// The start of the temporary file names made for a file called `name`:
/// `.<name>.numapin-tmp-` (the name cut to [`MAX_NAME_KEPT`] bytes).
pub(crate) fn temp_prefix(name: &std::ffi::OsStr) -> Vec<u8> {
    let b = name.as_bytes();
    let mut out = Vec::with_capacity(b.len().min(MAX_NAME_KEPT) + MARKER.len() + 1);
    out.push(b'.');
    out.extend_from_slice(&b[..b.len().min(MAX_NAME_KEPT)]);
    out.extend_from_slice(MARKER);
    out
}

/// The pid in a temporary file's name after its prefix (`<pid>-<n>`).
fn owner(rest: &[u8]) -> Option<i32> {
    let s = std::str::from_utf8(rest).ok()?;
    let (pid, n) = s.split_once('-')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// Removes the temporary files that saves to `target` left when their
/// process died (killed mid-save): named after it, their owner gone, and
/// no process holding their lock. Returns how many were removed.
pub(crate) fn remove_stale(target: &Target) -> usize {
    let Some(name) = target.real.file_name() else {
        return 0;
    };
    let prefix = temp_prefix(name);
    let Ok(entries) = std::fs::read_dir(target.dir()) else {
        return 0;
    };
    let me = nix::unistd::getpid().as_raw();
    let mut removed = 0;
    for e in entries.flatten() {
        let n = e.file_name();
        let Some(rest) = n.as_bytes().strip_prefix(prefix.as_slice()) else {
            continue;
        };
        let Some(pid) = owner(rest) else { continue };
        if pid == me || sys::process_alive(pid) {
            continue;
        }
        let p = e.path();
        // A save by a process of another PID namespace holds its lock.
        let free = sys::open_for_lock(&p)
            .and_then(|f| sys::try_lock(&f))
            .unwrap_or(false);
        if free && sys::unlink(&p).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// A temporary file beside a target, removed on drop unless it was
/// renamed over the target.
#[derive(Debug)]
pub(crate) struct TempFile {
    pub(crate) target: Target,
    pub(crate) path: PathBuf,
    /// Opened for writing; holds the `flock` that marks it as in use.
    pub(crate) opened: Opened,
    committed: bool,
}

impl TempFile {
    /// Creates a new temporary file beside `target` (after removing stale
    /// ones), locked, with the target's permission bits when it exists.
    ///
    /// # Errors
    /// [`StorageError::Write`] when the folder does not exist, is not
    /// writable, is on a read-only filesystem, or the file cannot be made.
    pub(crate) fn create(target: Target) -> Result<TempFile, StorageError> {
        let name = target.real.file_name().unwrap_or_default().to_owned();
        let mut n = temp_prefix(&name);
        let count = COUNTER.fetch_add(1, Ordering::Relaxed);
        n.extend_from_slice(format!("{}-{count}", std::process::id()).as_bytes());
        let path = target.dir().join(std::ffi::OsString::from_vec(n));
        let opened = sys::create_new(&path, 0o666).map_err(|source| StorageError::Write {
            path: target.shown.clone(),
            temp: None,
            op: "creating the temporary file",
            offset: 0,
            len: 0,
            source,
        })?;
        let t = TempFile {
            target,
            path,
            opened,
            committed: false,
        };
        // Fails only for a file not ours to lock: it was made just now.
        let _ = sys::try_lock(&t.opened.file);
        if let Some(mode) = t.target.mode {
            sys::chmod(&t.opened.file, mode)
                .map_err(|e| t.error("creating the temporary file", 0, 0, e))?;
        }
        Ok(t)
    }

    /// The writable descriptor.
    pub(crate) fn file(&self) -> &File {
        &self.opened.file
    }

    /// A write error about this file.
    pub(crate) fn error(
        &self,
        op: &'static str,
        offset: u64,
        len: u64,
        source: io::Error,
    ) -> StorageError {
        StorageError::Write {
            path: self.target.shown.clone(),
            temp: Some(self.path.clone()),
            op,
            offset,
            len,
            source,
        }
    }

    /// Renames the temporary file over the target.
    ///
    /// # Errors
    /// [`StorageError::Write`] when the rename fails (the temporary file is
    /// then removed).
    pub(crate) fn commit(&mut self) -> Result<(), StorageError> {
        sys::rename(&self.path, &self.target.real)
            .map_err(|e| self.error("renaming into place", 0, 0, e))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = sys::unlink(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_names_follow_the_target_and_are_found_again() {
        let p = temp_prefix(std::ffi::OsStr::new("model.safetensors"));
        assert_eq!(p, b".model.safetensors.numapin-tmp-");
        assert_eq!(owner(b"123-0"), Some(123));
        assert_eq!(owner(b"123"), None);
        assert_eq!(owner(b"x-1"), None);
        let long = "a".repeat(300);
        assert!(temp_prefix(std::ffi::OsStr::new(&long)).len() + 30 < 255);
    }

    #[test]
    fn links_are_followed_and_what_is_not_a_file_is_refused() {
        let d = tempfile::tempdir().expect("a temporary folder");
        let real = d.path().join("real.bin");
        std::fs::write(&real, b"x").expect("write");
        let link = d.path().join("link.bin");
        std::os::unix::fs::symlink("real.bin", &link).expect("symlink");
        let t = resolve(&link).expect("a link to a file");
        assert_eq!(t.real, real);
        assert!(t.mode.is_some());
        let dangling = d.path().join("dangling");
        std::os::unix::fs::symlink("new.bin", &dangling).expect("symlink");
        assert_eq!(
            resolve(&dangling).expect("dangling").real,
            d.path().join("new.bin")
        );
        let e = resolve(d.path()).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let e = resolve(&fifo).unwrap_err().to_string();
        assert!(e.contains("FIFO"), "{e}");
        let a = d.path().join("a");
        std::os::unix::fs::symlink("b", &a).expect("symlink");
        std::os::unix::fs::symlink("a", d.path().join("b")).expect("symlink");
        assert!(resolve(&a).unwrap_err().to_string().contains("loop"));
    }

    #[test]
    fn a_temporary_file_goes_away_unless_committed() {
        let d = tempfile::tempdir().expect("a temporary folder");
        let target = d.path().join("out.bin");
        let t = TempFile::create(resolve(&target).expect("resolve")).expect("create");
        let tmp = t.path.clone();
        assert!(tmp.exists());
        assert!(tmp
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .starts_with(".out.bin.numapin-tmp-"));
        drop(t);
        assert!(!tmp.exists());
        let mut t = TempFile::create(resolve(&target).expect("resolve")).expect("create");
        t.commit().expect("rename");
        drop(t);
        assert!(target.exists());
        assert_eq!(std::fs::read_dir(d.path()).expect("list").count(), 1);
    }

    #[test]
    fn stale_files_of_dead_processes_are_removed_and_live_ones_kept() {
        let d = tempfile::tempdir().expect("a temporary folder");
        let target = resolve(&d.path().join("m.bin")).expect("resolve");
        // A pid that cannot be alive (above pid_max's largest value).
        let dead = d.path().join(".m.bin.numapin-tmp-2147483600-0");
        std::fs::write(&dead, b"partial").expect("write");
        let mine = d
            .path()
            .join(format!(".m.bin.numapin-tmp-{}-99", std::process::id()));
        std::fs::write(&mine, b"in flight").expect("write");
        let other = d.path().join(".other.numapin-tmp-2147483600-0");
        std::fs::write(&other, b"not ours").expect("write");
        assert_eq!(remove_stale(&target), 1);
        assert!(!dead.exists() && mine.exists() && other.exists());
    }
}
