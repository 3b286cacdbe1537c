//! The state file on disk: opening it (checked before anything in it is
//! read), its header lock, and reading its live records.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use super::format::{self, Record, BLOCK};
use crate::arena::RuntimeError;
use crate::num::usize_from;
use crate::platform::statefile::{self as sf, Access, Facts, Lock};

/// How long a process waits for another to give the header lock back
/// before saying so (holders keep it for microseconds: only a stopped
/// process holds it longer).
pub(super) const LOCK_WAIT: Duration = Duration::from_secs(5);

/// The state file's name for user `uid`.
pub(crate) fn file_name(uid: u32) -> String {
    format!("numapin-budget-{uid}")
}

/// The error for the state file at `path` that cannot be used: `problem`,
/// with the system's error when one was the cause.
pub(super) fn refused(
    path: &Path,
    problem: impl Into<String>,
    source: Option<std::io::Error>,
) -> RuntimeError {
    RuntimeError::MachineState {
        path: path.display().to_string(),
        problem: problem.into(),
        source,
    }
}

/// An open state file: its folder, the file, and which file it is.
#[derive(Debug)]
pub(super) struct Opened {
    pub(super) dir: OwnedFd,
    pub(super) file: OwnedFd,
}

/// Checks the facts of an open state file owned by `uid`: a regular file
/// of that user that no one else may read or write.
pub(super) fn check_facts(path: &Path, f: &Facts, uid: u32) -> Result<(), RuntimeError> {
    if !f.regular {
        return Err(refused(path, "it is not a regular file", None));
    }
    if f.uid != uid {
        return Err(refused(
            path,
            format!(
                "it belongs to user {}, not to user {uid} whose file it must be",
                f.uid
            ),
            None,
        ));
    }
    if f.mode & 0o077 != 0 {
        return Err(refused(
            path,
            format!(
                "its mode is {:04o}: other users may read or write it (numapin makes it 0600)",
                f.mode
            ),
            None,
        ));
    }
    Ok(())
}

/// Checks the folder: others must not be able to replace the file (owned
/// by this user or root; writable by others only with the sticky bit).
fn check_dir(dir: &Path, f: &Facts) -> Result<(), RuntimeError> {
    let uid = sf::euid();
    let shared_unsticky = f.mode & 0o022 != 0 && f.mode & 0o1000 == 0;
    if !f.directory || (f.uid != uid && f.uid != 0) || shared_unsticky {
        return Err(refused(
            dir,
            format!(
                "the folder for the state file must be owned by this user or root and not writable by others without the sticky bit (it is {}, owned by user {}, mode {:04o})",
                if f.directory { "a folder" } else { "not a folder" },
                f.uid,
                f.mode
            ),
            None,
        ));
    }
    Ok(())
}

/// Opens the state file `name` in `dir` (made, mode 0600, when missing and
/// `access` says so), never through a link, and checks what was opened
/// before anything in it is read.
pub(super) fn open(
    dir: &Path,
    name: &str,
    access: Access,
    uid: u32,
) -> Result<Opened, RuntimeError> {
    let path = dir.join(name);
    let (dfd, dfacts) = sf::open_dir(dir).map_err(|e| {
        refused(
            dir,
            "the folder for the state file cannot be opened",
            Some(e),
        )
    })?;
    check_dir(dir, &dfacts)?;
    let file = match sf::open_at(&dfd, name, access) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) || sf::is_link_at(&dfd, name) => {
            return Err(refused(
                &path,
                "it is a symbolic link (numapin never follows one there)",
                Some(e),
            ))
        }
        Err(e) => {
            let problem = match sf::stat_at(&dfd, name).ok().flatten() {
                Some(f) if !f.regular => "it is not a regular file".into(),
                Some(f) if f.uid != uid => {
                    format!("it cannot be opened: it belongs to user {}", f.uid)
                }
                _ => "it cannot be opened".into(),
            };
            return Err(refused(&path, problem, Some(e)));
        }
    };
    let facts = sf::stat(file.as_raw_fd()).map_err(|e| refused(&path, "fstat failed", Some(e)))?;
    check_facts(&path, &facts, uid)?;
    Ok(Opened { dir: dfd, file })
}

/// Takes the header lock (`kind`: [`Lock::Write`] to change the file,
/// [`Lock::Read`] to read it), waiting up to [`LOCK_WAIT`].
pub(super) fn lock_header(path: &Path, fd: RawFd, kind: Lock) -> Result<HeaderLock, RuntimeError> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(20);
    loop {
        match sf::try_lock(fd, 0, BLOCK as u64, kind) {
            Ok(true) => return Ok(HeaderLock { fd }),
            Ok(false) if start.elapsed() < LOCK_WAIT => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(10));
            }
            Ok(false) => {
                return Err(refused(
                    path,
                    format!(
                        "another process has held its lock for {} s (a stopped process, or one in a debugger?)",
                        LOCK_WAIT.as_secs()
                    ),
                    None,
                ))
            }
            Err(e) => return Err(refused(path, "locking it failed (fcntl F_OFD_SETLK)", Some(e))),
        }
    }
}

/// The header lock, given back when dropped.
#[derive(Debug)]
pub(super) struct HeaderLock {
    fd: RawFd,
}

impl HeaderLock {
    /// The lock just taken on `fd`'s header, to be given back when dropped.
    pub(super) fn taken(fd: RawFd) -> HeaderLock {
        HeaderLock { fd }
    }
}

impl Drop for HeaderLock {
    fn drop(&mut self) {
        let _ = sf::try_lock(self.fd, 0, BLOCK as u64, Lock::Unlock);
    }
}

/// A record of a live process: its index and contents.
pub(super) type Live = (usize, Record);

/// Reads the file (`len` bytes, its facts just taken under the header
/// lock) and returns the records of live processes, skipping record
/// `own` (this description's, counted by the caller). With `clear`, the
/// records of processes that are gone are zeroed. Everything is checked
/// before it is used: sizes first, then the header, then each live
/// record.
pub(super) fn live_records(
    path: &Path,
    fd: RawFd,
    len: u64,
    own: Option<usize>,
    clear: bool,
) -> Result<Vec<Live>, RuntimeError> {
    let head = [0u8; BLOCK];
    if len > format::MAX_FILE || len < BLOCK as u64 {
        return Err(refused(
            path,
            format::check_file(&head, len).err().unwrap_or_default(),
            None,
        ));
    }
    let mut buf = vec![0u8; usize_from(len.next_multiple_of(BLOCK as u64))];
    let got = sf::read_at(fd, &mut buf[..usize_from(len)], 0)
        .map_err(|e| refused(path, "reading it failed", Some(e)))?;
    format::check_file(&buf[..BLOCK], got as u64).map_err(|p| refused(path, p, None))?;
    let mut live = Vec::new();
    for (i, block) in buf[BLOCK..].chunks_exact(BLOCK).enumerate() {
        if Some(i) == own || block.iter().all(|&b| b == 0) {
            continue;
        }
        let (start, n) = format::record_range(i);
        let held = sf::locked_by_other(fd, start, n).map_err(|e| {
            refused(
                path,
                "testing a record's lock failed (fcntl F_OFD_GETLK)",
                Some(e),
            )
        })?;
        if !held {
            // Its process is gone (the kernel dropped its lock): its bytes
            // are free again.
            if clear {
                sf::write_at(fd, &[0u8; BLOCK], start).map_err(|e| {
                    refused(path, "clearing a dead process's record failed", Some(e))
                })?;
            }
            continue;
        }
        match format::decode(block) {
            Ok(Some(r)) => live.push((i, r)),
            Ok(None) => {}
            Err(p) => {
                return Err(refused(
                    path,
                    format!("record {i}, held by a live process, is corrupted: {p}"),
                    None,
                ))
            }
        }
    }
    Ok(live)
}
