//! A small state file the processes of one user share (the machine
//! budget's, `arena::machine`): opened below a folder without following
//! links, described with `fstat` after the open (owner, mode, kind, size,
//! links) so that the caller refuses what it must not trust; byte-range
//! locks that belong to the open file description (`F_OFD_SETLK`: the
//! kernel drops them when the last descriptor of it closes, at exit or
//! `SIGKILL` included, and two descriptions of one process conflict like
//! two processes); reads and writes at an offset; and descriptors that a
//! forked child closes at once (a `pthread_atfork` handler), so that a
//! child never keeps its parent's locks alive.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Once;

/// What `fstat` says about an open file or folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Facts {
    /// The owner.
    pub(crate) uid: u32,
    /// The permission bits (and set-id and sticky bits): `mode & 0o7777`.
    pub(crate) mode: u32,
    /// Bytes.
    pub(crate) size: u64,
    /// A regular file.
    pub(crate) regular: bool,
    /// A folder.
    pub(crate) directory: bool,
    /// A symbolic link (only [`stat_at`] sees one).
    pub(crate) link: bool,
    /// Hard links (0: removed while open).
    pub(crate) links: u64,
    /// Device and inode: which file it is.
    pub(crate) id: (u64, u64),
}

fn facts_of(st: &libc::stat) -> Facts {
    let kind = st.st_mode & libc::S_IFMT;
    Facts {
        uid: st.st_uid,
        mode: st.st_mode & 0o7777,
        size: u64::try_from(st.st_size).unwrap_or(0),
        regular: kind == libc::S_IFREG,
        directory: kind == libc::S_IFDIR,
        link: kind == libc::S_IFLNK,
        links: st.st_nlink,
        id: (st.st_dev, st.st_ino),
    }
}

/// The effective user of this process.
pub(crate) fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

fn cstring(s: &[u8]) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Opens folder `dir` (following links: `/dev/shm` is one on some
/// systems) as an `O_PATH` descriptor, with its facts.
pub(crate) fn open_dir(dir: &Path) -> io::Result<(OwnedFd, Facts)> {
    use std::os::unix::ffi::OsStrExt;
    let c = cstring(dir.as_os_str().as_bytes())?;
    // SAFETY: a NUL-terminated path; open touches no memory of ours.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let facts = stat(fd.as_raw_fd())?;
    Ok((fd, facts))
}

/// How [`open_at`] opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Read only; the file must exist.
    Read,
    /// Read and write, made (mode 0600) when missing.
    ReadWriteCreate,
}

/// Opens `name` in folder `dir` without following a link there
/// (`O_NOFOLLOW`: a link is `ELOOP`), close-on-exec.
pub(crate) fn open_at(dir: &OwnedFd, name: &str, access: Access) -> io::Result<OwnedFd> {
    let c = cstring(name.as_bytes())?;
    let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK;
    let flags = match access {
        Access::Read => flags | libc::O_RDONLY,
        Access::ReadWriteCreate => flags | libc::O_RDWR | libc::O_CREAT,
    };
    // SAFETY: a NUL-terminated name relative to a descriptor we own; the
    // mode argument is read only with O_CREAT.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags, 0o600 as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The facts of an open descriptor.
pub(crate) fn stat(fd: RawFd) -> io::Result<Facts> {
    // SAFETY: fstat writes into the zeroed struct we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; a bad descriptor is an error.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(facts_of(&st))
}

/// The facts of `name` in `dir` itself (a link is described, not
/// followed: `link` set); `None` when there is no such name.
pub(crate) fn stat_at(dir: &OwnedFd, name: &str) -> io::Result<Option<Facts>> {
    let c = cstring(name.as_bytes())?;
    // SAFETY: fstatat writes into the zeroed struct we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated name relative to our descriptor; the
    // struct is ours.
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(facts_of(&st)))
}

/// Whether `name` in `dir` is a symbolic link.
pub(crate) fn is_link_at(dir: &OwnedFd, name: &str) -> bool {
    stat_at(dir, name).ok().flatten().is_some_and(|f| f.link)
}

/// Whether `path` is a folder (links followed).
pub(crate) fn is_dir(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_dir())
}

/// The names in folder `dir` (links followed for the folder itself).
pub(crate) fn names_in(dir: &Path) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir)? {
        if let Ok(n) = e?.file_name().into_string() {
            names.push(n);
        }
    }
    names.sort();
    Ok(names)
}

/// Removes `name` from `dir`.
pub(crate) fn unlink_at(dir: &OwnedFd, name: &str) -> io::Result<()> {
    let c = cstring(name.as_bytes())?;
    // SAFETY: a NUL-terminated name relative to our descriptor.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A byte-range lock's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lock {
    /// Shared (`F_RDLCK`): readers.
    Read,
    /// Exclusive (`F_WRLCK`).
    Write,
    /// None (`F_UNLCK`): gives a lock back.
    Unlock,
}

/// A lock type or `SEEK_SET` as `struct flock`'s `short` fields hold it.
#[allow(clippy::cast_possible_truncation)] // F_RDLCK, F_WRLCK, F_UNLCK, SEEK_SET are 0..=2
const fn short(v: libc::c_int) -> libc::c_short {
    v as libc::c_short
}

fn flock(start: u64, len: u64, kind: Lock) -> io::Result<libc::flock> {
    let off = |v: u64| {
        libc::off_t::try_from(v).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))
    };
    // SAFETY: flock is plain data; every field is set below or zero.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = short(match kind {
        Lock::Read => libc::F_RDLCK,
        Lock::Write => libc::F_WRLCK,
        Lock::Unlock => libc::F_UNLCK,
    });
    l.l_whence = short(libc::SEEK_SET);
    l.l_start = off(start)?;
    l.l_len = off(len)?;
    // OFD locks require l_pid = 0.
    l.l_pid = 0;
    Ok(l)
}

/// Takes (or gives back, [`Lock::Unlock`]) a lock on bytes `start..start
/// + len` for the open file description of `fd`, without waiting:
/// `Ok(false)` when another description holds a conflicting one.
pub(crate) fn try_lock(fd: RawFd, start: u64, len: u64, kind: Lock) -> io::Result<bool> {
    let l = flock(start, len, kind)?;
    // SAFETY: F_OFD_SETLK reads the flock struct we own.
    if unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &l) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN | libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// Whether another open file description holds a lock on any of bytes
/// `start..start + len` (`F_OFD_GETLK`; this description's own locks do
/// not count).
pub(crate) fn locked_by_other(fd: RawFd, start: u64, len: u64) -> io::Result<bool> {
    let mut l = flock(start, len, Lock::Write)?;
    // SAFETY: F_OFD_GETLK reads and writes the flock struct we own.
    if unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut l) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(l.l_type != short(libc::F_UNLCK))
}

/// Reads up to `buf.len()` bytes at `offset` (fewer only at the end of the
/// file); how many.
pub(crate) fn read_at(fd: RawFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let at = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        let rest = &mut buf[done..];
        // SAFETY: pread writes at most rest.len() bytes into `rest`.
        let n = unsafe { libc::pread(fd, rest.as_mut_ptr().cast(), rest.len(), at) };
        // A negative count is the error.
        let Ok(n) = usize::try_from(n) else {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        };
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(done)
}

/// Writes all of `data` at `offset` in one `pwrite` (a short write is an
/// error: callers keep what they write inside one page, which a file
/// system writes whole).
pub(crate) fn write_at(fd: RawFd, data: &[u8], offset: u64) -> io::Result<()> {
    let at =
        libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
    loop {
        // SAFETY: pwrite reads data.len() bytes from `data`.
        let n = unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), at) };
        // A negative count is the error.
        let Ok(n) = usize::try_from(n) else {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        };
        if n != data.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("wrote {n} of {} bytes", data.len()),
            ));
        }
        return Ok(());
    }
}

/// Runs `f` when the process exits normally (`exit`, a return from
/// `main`; not a signal), once however often it is asked for.
pub(crate) fn at_exit_once(f: extern "C" fn()) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain function that lives as long as the
        // process; atexit only stores the pointer.
        let _ = unsafe { libc::atexit(f) };
    });
}

/// Ends this process at once with `SIGKILL` (test hook: a process killed
/// at a chosen step).
pub(crate) fn kill_self() -> ! {
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    // Not reached: SIGKILL cannot be caught.
    std::process::abort()
}

/// Descriptors a forked child closes right after `fork`: a child
/// otherwise shares the open file description, and with it the locks,
/// until it exits.
const FORK_SLOTS: usize = 32;
static FORK_FDS: [AtomicI32; FORK_SLOTS] = [const { AtomicI32::new(-1) }; FORK_SLOTS];
static FORK_CLAIMED: [AtomicBool; FORK_SLOTS] = [const { AtomicBool::new(false) }; FORK_SLOTS];

extern "C" fn close_in_child() {
    for slot in &FORK_FDS {
        let fd = slot.swap(-1, Ordering::SeqCst);
        if fd >= 0 {
            // SAFETY: a descriptor a ForkClosedFd owns, inherited by this
            // child, where nothing else uses it; close is
            // async-signal-safe (this runs in the child right after fork).
            unsafe { libc::close(fd) };
        }
    }
}

fn register_at_fork() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a handler that only closes descriptors; the
        // handler stays valid for the life of the process (a static fn).
        let _ = unsafe { libc::pthread_atfork(None, None, Some(close_in_child)) };
    });
}

/// A descriptor that a forked child closes right after `fork` (it stays
/// open across `exec` only if it was made without close-on-exec, which
/// [`open_at`] never does). Up to 32 at once are closed so; beyond that a
/// descriptor is an ordinary one, closed by the child's first use of it
/// (the owner sees the changed process id).
#[derive(Debug)]
pub(crate) struct ForkClosedFd {
    slot: Option<usize>,
    own: Option<OwnedFd>,
}

impl ForkClosedFd {
    /// Takes `fd` over.
    pub(crate) fn new(fd: OwnedFd) -> ForkClosedFd {
        register_at_fork();
        for (i, claimed) in FORK_CLAIMED.iter().enumerate() {
            if claimed
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                FORK_FDS[i].store(fd.into_raw_fd(), Ordering::SeqCst);
                return ForkClosedFd {
                    slot: Some(i),
                    own: None,
                };
            }
        }
        ForkClosedFd {
            slot: None,
            own: Some(fd),
        }
    }

    /// The descriptor; `None` in a forked child once closed there.
    pub(crate) fn raw(&self) -> Option<RawFd> {
        match (self.slot, &self.own) {
            (Some(i), _) => Some(FORK_FDS[i].load(Ordering::SeqCst)).filter(|&fd| fd >= 0),
            (None, Some(fd)) => Some(fd.as_raw_fd()),
            (None, None) => None,
        }
    }
}

impl Drop for ForkClosedFd {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            let fd = FORK_FDS[i].swap(-1, Ordering::SeqCst);
            if fd >= 0 {
                // SAFETY: the descriptor this value took over in new();
                // nobody else closes it (the fork handler swapped -1 in
                // if it had).
                drop(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            FORK_CLAIMED[i].store(false, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> (tempfile::TempDir, OwnedFd) {
        let d = tempfile::tempdir().expect("a temporary folder");
        let (fd, facts) = open_dir(d.path()).expect("open the folder");
        assert!(facts.directory);
        (d, fd)
    }

    #[test]
    fn files_are_made_private_and_links_are_not_followed() {
        let (d, dfd) = dir();
        let f = open_at(&dfd, "state", Access::ReadWriteCreate).expect("made");
        let facts = stat(f.as_raw_fd()).expect("fstat");
        assert!(facts.regular);
        assert_eq!(facts.uid, euid());
        assert_eq!(facts.mode & 0o077, 0, "mode {:o}", facts.mode);
        std::os::unix::fs::symlink(d.path().join("state"), d.path().join("link")).expect("link");
        let e = open_at(&dfd, "link", Access::ReadWriteCreate).expect_err("a link is refused");
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
        assert!(is_link_at(&dfd, "link"));
        assert!(!is_link_at(&dfd, "state"));
        let e = open_at(&dfd, "missing", Access::Read).expect_err("not made for reading");
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        assert_eq!(stat_at(&dfd, "missing").expect("stat"), None);
        assert_eq!(
            stat_at(&dfd, "state").expect("stat").map(|f| f.id),
            Some(facts.id)
        );
        unlink_at(&dfd, "state").expect("removed");
        assert_eq!(stat(f.as_raw_fd()).expect("fstat").links, 0);
    }

    #[test]
    fn two_descriptions_in_one_process_conflict_and_closing_releases() {
        let (_d, dfd) = dir();
        let a = open_at(&dfd, "state", Access::ReadWriteCreate).expect("a");
        let b = open_at(&dfd, "state", Access::ReadWriteCreate).expect("b");
        assert!(try_lock(a.as_raw_fd(), 0, 10, Lock::Write).expect("lock"));
        assert!(!try_lock(b.as_raw_fd(), 5, 10, Lock::Read).expect("refused"));
        assert!(locked_by_other(b.as_raw_fd(), 0, 1).expect("getlk"));
        // The holder's own lock does not count for itself.
        assert!(!locked_by_other(a.as_raw_fd(), 0, 1).expect("getlk"));
        // Disjoint ranges do not conflict.
        assert!(try_lock(b.as_raw_fd(), 10, 10, Lock::Write).expect("lock"));
        drop(a);
        assert!(!locked_by_other(b.as_raw_fd(), 0, 10).expect("getlk"));
        assert!(try_lock(b.as_raw_fd(), 0, 10, Lock::Write).expect("lock"));
        assert!(try_lock(b.as_raw_fd(), 0, 20, Lock::Unlock).expect("unlock"));
    }

    #[test]
    fn reads_and_writes_at_offsets() {
        let (_d, dfd) = dir();
        let f = open_at(&dfd, "state", Access::ReadWriteCreate).expect("made");
        write_at(f.as_raw_fd(), b"hello", 4096).expect("write");
        let mut buf = [1u8; 8192];
        assert_eq!(read_at(f.as_raw_fd(), &mut buf, 0).expect("read"), 4101);
        assert_eq!(&buf[4096..4101], b"hello");
        assert!(buf[..4096].iter().all(|&b| b == 0));
    }

    #[test]
    fn fork_closed_descriptors_are_usable_and_closed_on_drop() {
        let (_d, dfd) = dir();
        let f = open_at(&dfd, "state", Access::ReadWriteCreate).expect("made");
        let kept = ForkClosedFd::new(f);
        let raw = kept.raw().expect("open");
        assert!(stat(raw).is_ok());
        assert!(try_lock(raw, 0, 1, Lock::Write).expect("lock"));
        let other = open_at(&dfd, "state", Access::Read).expect("other");
        assert!(locked_by_other(other.as_raw_fd(), 0, 1).expect("getlk"));
        drop(kept);
        assert!(!locked_by_other(other.as_raw_fd(), 0, 1).expect("getlk"));
    }
}
