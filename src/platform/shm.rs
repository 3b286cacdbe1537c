//! Shared memory between processes: memfd files (made, sized, opened by
//! their `/proc/<pid>/fd/<n>` path, found by name), and the futex words
//! waiters sleep on in a shared mapping.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

/// The prefix of every memfd numapin names (`/proc/<pid>/fd/<n>` links read
/// `/memfd:<name> (deleted)`).
pub(crate) const MEMFD_PREFIX: &str = "numapin-";

/// A new memfd named `name` (shown in `/proc/<pid>/fd` links as
/// `/memfd:<name>`), close-on-exec, of length 0.
pub(crate) fn memfd(name: &str) -> io::Result<OwnedFd> {
    let c = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a memfd name with a NUL"))?;
    // SAFETY: a NUL-terminated name; memfd_create touches no memory of ours.
    let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sets the file's length (`ftruncate`).
pub(crate) fn set_len(fd: RawFd, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a length past off_t"))?;
    // SAFETY: ftruncate on a descriptor; a bad one is an error.
    if unsafe { libc::ftruncate(fd, len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The file's length (`fstat`).
pub(crate) fn len(fd: RawFd) -> io::Result<u64> {
    // SAFETY: fstat writes into the zeroed struct we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::try_from(st.st_size).unwrap_or(0))
}

/// Opens `path` (a `/proc/<pid>/fd/<n>` link to another process's memfd)
/// read-write, close-on-exec.
pub(crate) fn open(path: &std::path::Path) -> io::Result<OwnedFd> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    Ok(OwnedFd::from(f))
}

/// The path another process opens this process's descriptor `fd` by.
pub(crate) fn proc_path(fd: &OwnedFd) -> std::path::PathBuf {
    format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd()).into()
}

/// Sleeps while `word` (in a mapping shared between processes) holds
/// `expected`, at most `timeout` (spurious wake-ups happen: callers look
/// again).
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        // At most i32::MAX seconds (68 years): a wait that long is forever.
        tv_sec: libc::time_t::try_from(timeout.as_secs())
            .unwrap_or(libc::time_t::MAX)
            .min(libc::time_t::from(i32::MAX)),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos()),
    };
    // SAFETY: `word` is a live AtomicU32; FUTEX_WAIT (not PRIVATE: other
    // processes wake it) only reads it and sleeps at most `timeout`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every process and thread sleeping on `word`.
pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: as in futex_wait; FUTEX_WAKE only wakes sleepers.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// The `/proc/<pid>/fd/<n>` paths of memfds named exactly `name` in the
/// processes this one may look into, this process's own first. Processes
/// that exit while read, and descriptors that cannot be read, are skipped.
pub(crate) fn find_memfd(name: &str) -> Vec<std::path::PathBuf> {
    let want = format!("/memfd:{name} (deleted)");
    let me = std::process::id().to_string();
    let mut pids: Vec<String> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        .collect();
    pids.sort_by_key(|p| (p != &me, p.parse::<u64>().unwrap_or(u64::MAX)));
    let mut out = Vec::new();
    for pid in pids {
        let dir = std::path::PathBuf::from(format!("/proc/{pid}/fd"));
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if std::fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == want.as_str()) {
                out.push(e.path());
            }
        }
    }
    out
}

/// A memfd other processes read through `/proc/<pid>/fd/<n>`, rewritten
/// under a sequence counter: bytes 0..8 `magic`, 8..12 the counter (odd
/// while a rewrite is under way), 12..16 the length `n` of the data,
/// then the data. Mapped into this process only (not into forked
/// children).
pub(crate) struct SeqFile {
    _fd: OwnedFd,
    ptr: *mut u8,
    len: usize,
    pid: u32,
}

// SAFETY: the mapping is owned by the value; writes take `&mut self`.
unsafe impl Send for SeqFile {}

/// Bytes of a [`SeqFile`] before its data.
pub(crate) const SEQ_DATA_AT: usize = 16;

impl SeqFile {
    /// A new file named `name` of `len` bytes (at least [`SEQ_DATA_AT`]).
    pub(crate) fn new(name: &str, len: usize) -> io::Result<SeqFile> {
        let fd = memfd(name)?;
        set_len(fd.as_raw_fd(), len as u64)?;
        let ptr = crate::platform::numa::map_shared(fd.as_raw_fd(), len, 0)?;
        // SAFETY: our own fresh mapping; advice changes no data.
        let _ = unsafe { crate::platform::numa::advise(ptr, len, libc::MADV_DONTFORK) };
        Ok(SeqFile {
            _fd: fd,
            ptr,
            len,
            pid: std::process::id(),
        })
    }

    /// The process that made it (a forked child holds its parent's, not
    /// mapped there: it must make its own).
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Rewrites the data (cut to the file's room) and sets `magic`.
    pub(crate) fn write(&mut self, magic: u64, data: &[u8]) {
        debug_assert_eq!(self.pid, std::process::id());
        // SAFETY: the mapping is `len` >= 16 bytes, page-aligned, this
        // process's; the header words are naturally aligned atomics.
        let (m, seq, n) = unsafe {
            (
                &*self.ptr.cast::<AtomicU64>(),
                &*self.ptr.add(8).cast::<AtomicU32>(),
                &*self.ptr.add(12).cast::<AtomicU32>(),
            )
        };
        // The length word is 32 bits: data past 4 GiB is cut as past the room.
        let k = u32::try_from(data.len().min(self.len - SEQ_DATA_AT)).unwrap_or(u32::MAX);
        seq.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        // SAFETY: SEQ_DATA_AT + k <= len; `data` is not in the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(SEQ_DATA_AT), k as usize);
        };
        n.store(k, std::sync::atomic::Ordering::Release);
        m.store(magic, std::sync::atomic::Ordering::Release);
        seq.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl Drop for SeqFile {
    fn drop(&mut self) {
        if self.pid == std::process::id() {
            // SAFETY: our own mapping, referenced by nothing else.
            let _ = unsafe { crate::platform::numa::unmap(self.ptr, self.len) };
        }
    }
}
