//! Writing files for the storage writer: creating a new file beside its
//! target (`O_EXCL`), a second descriptor with `O_DIRECT`, single `pwrite`
//! calls, `fallocate`, `ftruncate`, `fsync` of a file and of a folder,
//! `renameat`, `unlink`, `flock` and whether a process is alive. Each
//! function makes one system call (or one short, fixed sequence) and
//! returns its outcome (`EINTR` and short writes included): the loops that
//! retry and advance are the writer's (`storage::write::io`).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;

use super::file::{describe, Opened};

fn c_path(path: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path contains a NUL byte"))
}

/// The descriptor `fd` a call returned, owned, or the call's error.
fn own(fd: libc::c_int) -> io::Result<File> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor the caller hands over.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `Ok` for a call that returned 0, its error otherwise.
fn done(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An offset or length as the kernel takes it.
fn signed(v: u64) -> io::Result<i64> {
    i64::try_from(v).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "past 2^63 bytes"))
}

/// Creates `path`, which must not exist (`O_CREAT | O_EXCL`, never
/// following a symbolic link there), for writing, with permission bits
/// `mode` (less the umask) and `O_CLOEXEC`.
pub(crate) fn create_new(path: &Path, mode: u32) -> io::Result<Opened> {
    let c = c_path(path)?;
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOCTTY;
    // SAFETY: `c` is a NUL-terminated path; the mode is passed as the
    // variadic argument open takes with O_CREAT.
    describe(own(unsafe {
        libc::open(c.as_ptr(), flags, mode as libc::c_uint)
    })?)
}

/// Opens the existing file `path` for writing with `O_DIRECT` (no
/// creation, no truncation; `O_NOFOLLOW`: the writer opens its own file).
pub(crate) fn open_direct_writer(path: &Path) -> io::Result<Opened> {
    let c = c_path(path)?;
    let flags = libc::O_WRONLY | libc::O_DIRECT | libc::O_CLOEXEC | libc::O_NOFOLLOW;
    // SAFETY: `c` is a NUL-terminated path; no other precondition.
    describe(own(unsafe { libc::open(c.as_ptr(), flags) })?)
}

/// One `pwrite` of `buf` at `offset`: bytes written, or the error as the
/// kernel gave it (`EINTR` included).
pub(crate) fn pwrite_once(file: &File, buf: &[u8], offset: u64) -> io::Result<usize> {
    let off = signed(offset)?;
    // SAFETY: the kernel reads at most buf.len() bytes from buf, borrowed
    // for the call; the descriptor is open for the borrow of `file`.
    let n = unsafe { libc::pwrite(file.as_raw_fd(), buf.as_ptr().cast(), buf.len(), off) };
    // A negative count is the error; any other is at most buf.len().
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// `fallocate(fd, 0, 0, len)`: reserves the file's blocks (and sets its
/// size), so that a full filesystem is found before anything is written.
/// `EOPNOTSUPP`/`ENOSYS` where the filesystem cannot.
pub(crate) fn allocate(file: &File, len: u64) -> io::Result<()> {
    let len = signed(len)?;
    if len == 0 {
        return Ok(());
    }
    // SAFETY: fallocate on our own descriptor with plain arguments.
    done(unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) })
}

/// `ftruncate(fd, len)`.
pub(crate) fn truncate(file: &File, len: u64) -> io::Result<()> {
    let len = signed(len)?;
    // SAFETY: ftruncate on our own descriptor with a plain length.
    done(unsafe { libc::ftruncate(file.as_raw_fd(), len) })
}

/// `fsync(fd)`: the file's data and metadata on the drive.
pub(crate) fn fsync(file: &File) -> io::Result<()> {
    // SAFETY: fsync on our own descriptor.
    done(unsafe { libc::fsync(file.as_raw_fd()) })
}

/// `sync_file_range(fd, offset, len, SYNC_FILE_RANGE_WRITE)`: starts
/// writeback of those dirty pages without waiting for it (a later `fsync`
/// then finds less to write).
pub(crate) fn start_writeback(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let (off, len) = (
        i64::try_from(offset).unwrap_or(i64::MAX),
        i64::try_from(len).unwrap_or(i64::MAX),
    );
    // SAFETY: sync_file_range on our own descriptor with plain arguments.
    done(unsafe { libc::sync_file_range(file.as_raw_fd(), off, len, libc::SYNC_FILE_RANGE_WRITE) })
}

/// `fchmod(fd, mode)`.
pub(crate) fn chmod(file: &File, mode: u32) -> io::Result<()> {
    // SAFETY: fchmod on our own descriptor with plain permission bits.
    done(unsafe { libc::fchmod(file.as_raw_fd(), mode as libc::mode_t) })
}

/// `fsync` of the folder `dir` (what makes a rename in it durable).
/// Filesystems that cannot sync a folder (`EINVAL`) count as done.
pub(crate) fn fsync_dir(dir: &Path) -> io::Result<()> {
    let c = c_path(dir)?;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: `c` is a NUL-terminated path; no other precondition.
    let d = own(unsafe { libc::open(c.as_ptr(), flags) })?;
    match fsync(&d) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        r => r,
    }
}

/// `renameat(AT_FDCWD, from, AT_FDCWD, to)`: atomically replaces `to`.
pub(crate) fn rename(from: &Path, to: &Path) -> io::Result<()> {
    let (f, t) = (c_path(from)?, c_path(to)?);
    // SAFETY: two NUL-terminated paths relative to the working folder.
    done(unsafe { libc::renameat(libc::AT_FDCWD, f.as_ptr(), libc::AT_FDCWD, t.as_ptr()) })
}

/// `unlink(path)`.
pub(crate) fn unlink(path: &Path) -> io::Result<()> {
    let c = c_path(path)?;
    // SAFETY: a NUL-terminated path.
    done(unsafe { libc::unlink(c.as_ptr()) })
}

/// `flock(fd, LOCK_EX | LOCK_NB)`: whether the lock was taken (false when
/// another open file description holds one). Released when every
/// descriptor of the description is closed, a killed process's included.
pub(crate) fn try_lock(file: &File) -> io::Result<bool> {
    // SAFETY: flock on our own descriptor with plain flags.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        _ => Err(e),
    }
}

/// Opens `path` read-only without following a final symbolic link (for
/// taking its lock).
pub(crate) fn open_for_lock(path: &Path) -> io::Result<File> {
    let c = c_path(path)?;
    let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    // SAFETY: `c` is a NUL-terminated path; no other precondition.
    own(unsafe { libc::open(c.as_ptr(), flags) })
}

/// Whether process `pid` exists in this process's PID namespace
/// (`kill(pid, 0)`: `EPERM` means it exists and belongs to another user).
pub(crate) fn process_alive(pid: i32) -> bool {
    if pid <= 0 {
        return true;
    }
    // SAFETY: signal 0 checks for the process and sends nothing.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// The soft `RLIMIT_FSIZE` (`ulimit -f`) in bytes, `None` when unlimited.
pub(crate) fn file_size_limit() -> Option<u64> {
    let (soft, _) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_FSIZE).ok()?;
    (soft != libc::RLIM_INFINITY).then_some(soft)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_file_is_created_once_written_synced_renamed_and_locked() {
        let d = tempfile::tempdir().expect("a temporary folder");
        let p = d.path().join("new");
        let o = create_new(&p, 0o600).expect("create");
        assert_eq!(
            create_new(&p, 0o600).unwrap_err().raw_os_error(),
            Some(libc::EEXIST)
        );
        assert_eq!(pwrite_once(&o.file, b"hello", 3).expect("pwrite"), 5);
        truncate(&o.file, 6).expect("ftruncate");
        fsync(&o.file).expect("fsync");
        fsync_dir(d.path()).expect("fsync of the folder");
        assert_eq!(std::fs::read(&p).expect("read"), b"\0\0\0hel");
        assert!(try_lock(&o.file).expect("flock"));
        let other = open_for_lock(&p).expect("open");
        assert!(!try_lock(&other).expect("flock"), "held by the first");
        drop(o);
        // Free once closed (a child another test's thread forks holds a
        // copy of the descriptor until it execs).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !try_lock(&other).expect("flock") {
            assert!(std::time::Instant::now() < deadline, "free once closed");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let q = d.path().join("renamed");
        rename(&p, &q).expect("rename");
        unlink(&q).expect("unlink");
        assert!(!q.exists());
        assert!(process_alive(nix::unistd::getpid().as_raw()));
    }
}
