//! Reading files for the storage reader: opening without blocking on a
//! FIFO, `O_DIRECT` and the alignment it needs (`statx`), and single
//! `pread`/`preadv2(RWF_NOWAIT)` calls. Each function makes
//! one system call and returns its outcome (`EINTR` and short reads
//! included): the loops that retry and advance are the reader's
//! (`storage::io`), where tests can inject failures.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// What a path names, from `fstat` of the opened file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// A regular file.
    Regular,
    /// A directory.
    Directory,
    /// A FIFO (named pipe).
    Fifo,
    /// A socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
}

impl FileKind {
    /// `a regular file`, `a directory`, ...
    pub(crate) fn describe(self) -> &'static str {
        match self {
            FileKind::Regular => "a regular file",
            FileKind::Directory => "a directory",
            FileKind::Fifo => "a FIFO (named pipe)",
            FileKind::Socket => "a socket",
            FileKind::CharDevice => "a character device",
            FileKind::BlockDevice => "a block device",
        }
    }
}

/// An opened file and what `fstat`/`statx` say about it.
#[derive(Debug)]
pub(crate) struct Opened {
    /// Opened read-only (blocking mode restored after the open).
    pub file: File,
    /// What it is.
    pub kind: FileKind,
    /// Its length in bytes (regular files).
    pub len: u64,
    /// The device it lives on (`st_dev`: major, minor).
    pub dev: (u32, u32),
    /// Its inode.
    pub ino: u64,
    /// `O_DIRECT` alignment from `statx(STATX_DIOALIGN)` (Linux 6.1+):
    /// `Some(Some(n))` when the kernel reports direct I/O for this file,
    /// with file offsets, lengths and memory aligned to `n` bytes;
    /// `Some(None)` when it reports that the file does not support direct
    /// I/O; `None` when the kernel does not say.
    pub direct_align: Option<Option<u64>>,
}

/// What a file of `st_mode` `mode` is.
pub(crate) fn kind_of(mode: libc::mode_t) -> FileKind {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileKind::Directory,
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDevice,
        libc::S_IFBLK => FileKind::BlockDevice,
        _ => FileKind::Regular,
    }
}

fn c_path(path: &Path) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path contains a NUL byte"))
}

/// Opens `path` read-only with `O_NONBLOCK` (so that opening a FIFO with no
/// writer returns at once instead of waiting for one), `O_NOCTTY` and
/// `O_CLOEXEC`, plus `O_DIRECT` when `direct`; then restores blocking mode
/// and describes the file.
pub(crate) fn open(path: &Path, direct: bool) -> io::Result<Opened> {
    let c = c_path(path)?;
    let mut flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    if direct {
        flags |= libc::O_DIRECT;
    }
    // SAFETY: `c` is a NUL-terminated path; open has no other precondition.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor this function owns from now on.
    let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let keep = if direct { libc::O_DIRECT } else { 0 };
    // SAFETY: F_SETFL with plain flags on our own descriptor.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, keep) } < 0 {
        return Err(io::Error::last_os_error());
    }
    describe(file)
}

/// What `fstat`/`statx` say about an opened `file`.
pub(crate) fn describe(file: File) -> io::Result<Opened> {
    // SAFETY: an all-zero statx is a valid value for the kernel to fill.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let empty = c"";
    let mask = libc::STATX_TYPE | libc::STATX_SIZE | libc::STATX_INO | libc::STATX_DIOALIGN;
    // SAFETY: AT_EMPTY_PATH with an empty path describes the descriptor
    // itself; `stx` is a valid out-pointer.
    let r = unsafe {
        libc::statx(
            file.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            mask,
            &mut stx,
        )
    };
    if r < 0 {
        // A kernel without statx (before 4.11): fstat has the rest.
        let m = file.metadata()?;
        use std::os::unix::fs::MetadataExt;
        let dev = m.dev();
        return Ok(Opened {
            kind: kind_of(m.mode() as libc::mode_t),
            len: m.len(),
            dev: (libc::major(dev), libc::minor(dev)),
            ino: m.ino(),
            direct_align: None,
            file,
        });
    }
    let direct_align = (stx.stx_mask & libc::STATX_DIOALIGN != 0).then(|| {
        let a = u64::from(stx.stx_dio_offset_align.max(stx.stx_dio_mem_align));
        (a != 0).then_some(a)
    });
    Ok(Opened {
        kind: kind_of(libc::mode_t::from(stx.stx_mode)),
        len: stx.stx_size,
        dev: (stx.stx_dev_major, stx.stx_dev_minor),
        ino: stx.stx_ino,
        direct_align,
        file,
    })
}

/// What identifies a file's contents: its device, inode, length and
/// modification time (`fstat`). Two equal identities of one path are, for
/// all a reader can tell, the same bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    pub dev: u64,
    pub ino: u64,
    pub len: u64,
    pub mtime: (i64, i64),
}

/// The identity of an open file now (`fstat`).
pub(crate) fn identity(file: &File) -> io::Result<Identity> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata()?;
    Ok(Identity {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        mtime: (m.mtime(), m.mtime_nsec()),
    })
}

/// The file's length now (`fstat`).
pub(crate) fn len_now(file: &File) -> io::Result<u64> {
    file.metadata().map(|m| m.len())
}

/// One `pread` of `buf.len()` bytes at `offset`: bytes read (0 at the end
/// of the file), or the error as the kernel gave it (`EINTR` included).
pub(crate) fn pread_once(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let off = i64::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset past 2^63"))?;
    // SAFETY: the kernel writes at most buf.len() bytes into buf, borrowed
    // mutably for the call; the descriptor is open for the borrow of `file`.
    let n = unsafe { libc::pread(file.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), off) };
    // A negative count is the error; any other is at most buf.len().
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// What one `preadv2(RWF_NOWAIT)` gave.
#[derive(Debug)]
pub(crate) enum NoWait {
    /// Bytes read from the page cache (0 at the end of the file).
    Read(usize),
    /// The data is not in the page cache (`EAGAIN`): read it another way.
    WouldBlock,
    /// The file or the kernel does not take `RWF_NOWAIT` (`EOPNOTSUPP`,
    /// `ENOSYS`, `EINVAL`).
    Unsupported,
}

/// One `preadv2(fd, buf, offset, RWF_NOWAIT)` on a buffered descriptor:
/// reads only what the page cache holds, never waits for the drive and
/// starts no readahead (Linux 4.14+).
pub(crate) fn pread_nowait_once(file: &File, buf: &mut [u8], offset: u64) -> io::Result<NoWait> {
    let off = i64::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset past 2^63"))?;
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: one iovec over buf, borrowed mutably for the call; the
    // descriptor is open for the borrow of `file`.
    let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, off, libc::RWF_NOWAIT) };
    if let Ok(n) = usize::try_from(n) {
        return Ok(NoWait::Read(n));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) => Ok(NoWait::WouldBlock),
        Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL) => Ok(NoWait::Unsupported),
        _ => Err(e),
    }
}

/// The page size the page cache counts in.
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// `cachestat(2)`'s number on the architectures numapin is built for (new
/// system calls share one number on every architecture).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const SYS_CACHESTAT: libc::c_long = 451;

/// Pages of `file` in `offset..offset + len` that the page cache holds
/// (`cachestat`, Linux 6.5+; it reads nothing and starts no readahead).
/// `ENOSYS` on older kernels; `EPERM` for a file this process may not
/// write and does not own, on kernels that keep page cache state from
/// other users' files.
pub(crate) fn cached_pages(file: &File, offset: u64, len: u64) -> io::Result<u64> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        let range = Range { off: offset, len };
        let mut st = Stat::default();
        // SAFETY: the kernel reads `range` and writes `st`, both valid for
        // the call; flags must be 0.
        let r = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                file.as_raw_fd(),
                &range as *const Range,
                &mut st as *mut Stat,
                0,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st.nr_cache)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (file, offset, len);
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_opens_at_once_and_says_what_it_is() {
        let d = tempfile::tempdir().expect("a temporary folder");
        let p = d.path().join("fifo");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let o = open(&p, false).expect("opening a FIFO without a writer returns");
        assert_eq!(o.kind, FileKind::Fifo);
        let o = open(d.path(), false).expect("a directory opens read-only");
        assert_eq!(o.kind, FileKind::Directory);
    }

    #[test]
    fn reads_report_lengths_and_the_end() {
        let d = tempfile::tempdir().expect("a temporary folder");
        let p = d.path().join("f");
        std::fs::write(&p, b"hello world").expect("write");
        let o = open(&p, false).expect("open");
        assert_eq!((o.kind, o.len), (FileKind::Regular, 11));
        let mut buf = [0u8; 16];
        let n = pread_once(&o.file, &mut buf, 6).expect("pread");
        assert_eq!(&buf[..n], b"world");
        let n = pread_once(&o.file, &mut buf, 11).expect("pread");
        assert_eq!(n, 0);
        // Just written: in the page cache (a filesystem may refuse the
        // flag, never report the data missing).
        match pread_nowait_once(&o.file, &mut buf[..5], 0).expect("preadv2") {
            NoWait::Read(n) => assert_eq!(&buf[..n], b"hello"),
            NoWait::Unsupported => {}
            NoWait::WouldBlock => panic!("a file just written is in the page cache"),
        }
        // All of it is in the page cache, when the kernel can say.
        if let Ok(n) = cached_pages(&o.file, 0, 11) {
            assert_eq!(n, 1);
        }
    }
}
