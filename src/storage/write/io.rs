//! Writing one piece of a file, whatever the kernel does: whole aligned
//! blocks with `O_DIRECT` where the filesystem allows it (no copy through
//! the page cache), the rest (an unaligned end, a filesystem that refuses
//! direct writes at open or at the first write) buffered. Every loop
//! retries `EINTR` and advances over short writes; every system error
//! names the file, the offset and the length.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::platform::file_write as sys;

#[cfg(test)]
use super::super::faults;
use super::super::source::{direct_descriptor, MIN_ALIGN};
use super::super::{IoMode, StorageError};
use super::target::TempFile;

/// Bytes written each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) direct: u64,
    pub(crate) buffered: u64,
}

impl Counts {
    pub(crate) fn add(&mut self, o: Counts) {
        self.direct += o.direct;
        self.buffered += o.buffered;
    }
}

/// A temporary file being written, with its `O_DIRECT` descriptor when
/// the filesystem gives one.
#[derive(Debug)]
pub(crate) struct Dest {
    pub(crate) tmp: TempFile,
    /// Bytes the file will hold.
    pub(crate) len: u64,
    direct: Option<File>,
    align: u64,
    direct_ok: AtomicBool,
    /// Start writeback of each buffered piece at once (the file will be
    /// synced: the drive works while the rest is written).
    early_writeback: bool,
}

impl Dest {
    /// `tmp`, made `len` bytes long (its blocks reserved where the
    /// filesystem can, so a full filesystem is found before any write),
    /// with a direct descriptor unless `mode` is [`IoMode::Buffered`].
    ///
    /// # Errors
    /// [`StorageError::Write`] when the size is over `ulimit -f` or the
    /// space cannot be reserved (`ENOSPC`, `EDQUOT`, `EFBIG`);
    /// [`StorageError::Request`] for [`IoMode::Direct`] on a filesystem
    /// that refuses it.
    pub(crate) fn open(
        tmp: TempFile,
        len: u64,
        mode: IoMode,
        sync: bool,
    ) -> Result<Dest, StorageError> {
        if let Some(limit) = sys::file_size_limit().filter(|&l| len > l) {
            let e = io::Error::from_raw_os_error(libc::EFBIG);
            return Err(tmp.error(
                "checking the size against `ulimit -f`",
                limit,
                len - limit,
                e,
            ));
        }
        reserve(&tmp, len)?;
        let (direct, align, why) = match mode {
            IoMode::Buffered => (
                None,
                MIN_ALIGN,
                Some("buffered writes were asked for".into()),
            ),
            _ => direct_descriptor(&tmp.opened, || sys::open_direct_writer(&tmp.path)),
        };
        if mode == IoMode::Direct {
            if let Some(why) = &why {
                return Err(StorageError::request(
                    format!(
                        "{}: O_DIRECT was asked for, but {why}",
                        tmp.target.shown.display()
                    ),
                    "write it with IoMode::Auto or IoMode::Buffered",
                ));
            }
        }
        Ok(Dest {
            tmp,
            len,
            direct_ok: AtomicBool::new(direct.is_some()),
            direct,
            align,
            early_writeback: sync,
        })
    }

    /// The alignment of direct writes (file offsets, lengths and memory).
    pub(crate) fn alignment(&self) -> u64 {
        self.align
    }

    fn direct_file(&self) -> Option<&File> {
        self.direct
            .as_ref()
            .filter(|_| self.direct_ok.load(Ordering::Relaxed))
    }

    /// Writes `buf` at `offset`: its whole aligned blocks with `O_DIRECT`
    /// when `buf` and `offset` line up, the rest buffered.
    ///
    /// # Errors
    /// [`StorageError::Write`] naming the file, offset and length of the
    /// failed call; [`StorageError::Request`] when [`IoMode::Direct`] was
    /// asked for and the filesystem refused a direct write.
    pub(crate) fn write_at(
        &self,
        offset: u64,
        buf: &[u8],
        mode: IoMode,
    ) -> Result<Counts, StorageError> {
        let mut c = Counts::default();
        let mut done = 0usize;
        let a = crate::num::usize_from(self.align);
        let lined_up = (buf.as_ptr() as usize) % a == 0 && offset % self.align == 0;
        if lined_up {
            let whole = buf.len() / a * a;
            done = self.direct(offset, &buf[..whole], &mut c)?;
        }
        if done < buf.len() {
            if mode == IoMode::Direct && self.direct_file().is_none() {
                return Err(StorageError::request(
                    format!(
                        "{}: O_DIRECT was asked for, but its filesystem refused a direct write",
                        self.tmp.target.shown.display()
                    ),
                    "write it with IoMode::Auto or IoMode::Buffered",
                ));
            }
            self.buffered(offset + done as u64, &buf[done..], &mut c)?;
        }
        Ok(c)
    }

    /// Whole blocks with `O_DIRECT`; returns the bytes written (fewer when
    /// the filesystem refuses direct writes, from then on for the file).
    fn direct(&self, offset: u64, buf: &[u8], c: &mut Counts) -> Result<usize, StorageError> {
        let mut done = 0;
        while done < buf.len() {
            let Some(f) = self.direct_file() else { break };
            let at = offset + done as u64;
            match call(f, &buf[done..], at, true) {
                Ok(0) => return Err(self.zero(at, buf.len() - done)),
                Ok(n) => {
                    c.direct += n as u64;
                    done += n;
                    if n as u64 % self.align != 0 {
                        break; // the rest is no longer aligned
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.direct_ok.store(false, Ordering::Relaxed);
                    break;
                }
                Err(e) => return Err(self.tmp.error("writing", at, (buf.len() - done) as u64, e)),
            }
        }
        Ok(done)
    }

    /// The rest through the page cache, to the last byte.
    fn buffered(&self, offset: u64, buf: &[u8], c: &mut Counts) -> Result<(), StorageError> {
        let mut done = 0;
        while done < buf.len() {
            let at = offset + done as u64;
            match call(self.tmp.file(), &buf[done..], at, false) {
                Ok(0) => return Err(self.zero(at, buf.len() - done)),
                Ok(n) => {
                    c.buffered += n as u64;
                    done += n;
                }
                Err(e) => return Err(self.tmp.error("writing", at, (buf.len() - done) as u64, e)),
            }
        }
        if self.early_writeback && !buf.is_empty() {
            // Best effort: only when the drive starts on these pages.
            let _ = sys::start_writeback(self.tmp.file(), offset, buf.len() as u64);
        }
        Ok(())
    }

    fn zero(&self, at: u64, len: usize) -> StorageError {
        let e = io::Error::new(io::ErrorKind::WriteZero, "the system wrote no byte");
        self.tmp.error("writing", at, len as u64, e)
    }

    /// Sets the length (after a fallback that wrote past it, or where the
    /// space was not reserved) and, when `sync`, flushes data and
    /// metadata to the drive.
    ///
    /// # Errors
    /// [`StorageError::Write`] when `ftruncate` or `fsync` fails (`EIO`,
    /// `ENOSPC` on filesystems that allocate late).
    pub(crate) fn finish(&self, sync: bool) -> Result<(), StorageError> {
        sys::truncate(self.tmp.file(), self.len)
            .map_err(|e| self.tmp.error("setting the length", 0, self.len, e))?;
        if sync {
            #[cfg(test)]
            faults::fsync().map_err(|e| self.tmp.error("fsync", 0, self.len, e))?;
            sys::fsync(self.tmp.file()).map_err(|e| self.tmp.error("fsync", 0, self.len, e))?;
        }
        Ok(())
    }
}

/// Reserves `len` bytes for `tmp` (`fallocate`), or sets its length where
/// the filesystem cannot reserve.
fn reserve(tmp: &TempFile, len: u64) -> Result<(), StorageError> {
    match sys::allocate(tmp.file(), len) {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL)
            ) =>
        {
            sys::truncate(tmp.file(), len).map_err(|e| tmp.error("setting the length", 0, len, e))
        }
        Err(e) => Err(tmp.error("reserving space", 0, len, e)),
    }
}

/// One `pwrite` (with the test's faults).
fn once(f: &File, buf: &[u8], offset: u64, direct: bool) -> io::Result<usize> {
    #[cfg(test)]
    let buf = {
        let len = faults::apply(buf.len(), offset, direct)?;
        &buf[..len]
    };
    #[cfg(not(test))]
    let _ = direct;
    sys::pwrite_once(f, buf, offset)
}

/// `once`, retried on `EINTR`.
fn call(f: &File, buf: &[u8], offset: u64, direct: bool) -> io::Result<usize> {
    loop {
        match once(f, buf, offset, direct) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}
