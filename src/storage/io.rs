//! Reading one range of a file into memory, whatever the kernel does. With
//! [`IoMode::Auto`], a range the page cache holds whole (`cachestat`, which
//! reads nothing) is copied from it (`preadv2(RWF_NOWAIT)`, which never
//! waits for the drive); any other range is read with `O_DIRECT` where the
//! file allows it and the memory lines up with the file (no copy through
//! the page cache, no readahead of what is read anyway), the rest with
//! plain buffered reads. A file whose page cache state the kernel will not
//! give (`cachestat` before Linux 6.5, or refused for another user's file)
//! is read buffered: a probe with `RWF_NOWAIT` alone would not do, since
//! on the kernels measured a refused `RWF_NOWAIT` read still starts
//! readahead of what it was refused, which then competes with the direct
//! read of the same bytes. Every loop retries `EINTR`, advances over short reads,
//! and turns an early end of file into [`StorageError::Truncated`]; every
//! system error names the file and the offset.

use std::io;

use crate::num::usize_from;
use crate::platform::file::{self as sys, NoWait};

#[cfg(test)]
use super::faults;
use super::{IoMode, Source, StorageError};

/// Bytes read each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// From the page cache without waiting (`RWF_NOWAIT`).
    pub cached: u64,
    /// With `O_DIRECT`.
    pub direct: u64,
    /// Through the page cache, from the drive.
    pub buffered: u64,
}

impl Counts {
    pub(crate) fn add(&mut self, o: Counts) {
        self.cached += o.cached;
        self.direct += o.direct;
        self.buffered += o.buffered;
    }
}

/// How a read goes to the kernel (one call each).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Call {
    NoWait,
    Direct,
    Buffered,
}

/// One system call reading `buf.len()` bytes at `offset` the `call` way.
fn once(src: &Source, call: Call, buf: &mut [u8], offset: u64) -> io::Result<NoWait> {
    #[cfg(test)]
    let buf = {
        let len = faults::apply(buf.len(), offset, call == Call::Direct)?;
        &mut buf[..len]
    };
    match call {
        Call::NoWait => sys::pread_nowait_once(src.buffered(), buf, offset),
        Call::Buffered => sys::pread_once(src.buffered(), buf, offset).map(NoWait::Read),
        Call::Direct => {
            let f = src
                .direct_file()
                .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
            sys::pread_once(f, buf, offset).map(NoWait::Read)
        }
    }
}

/// `once`, retried on `EINTR`.
fn call(src: &Source, call: Call, buf: &mut [u8], offset: u64) -> io::Result<NoWait> {
    loop {
        match once(src, call, buf, offset) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

fn read_error(src: &Source, offset: u64, len: usize, e: io::Error) -> StorageError {
    StorageError::Read {
        path: src.path().to_path_buf(),
        offset,
        len,
        source: e,
    }
}

/// Reads the `need` bytes at `offset` into `room[..need]`. Direct reads
/// may also write the rest of `room` (up to its end, with bytes that
/// follow in the file), so a caller that can spare the room lets whole
/// aligned blocks land in place. `bounce` is an aligned scratch block of
/// at least the file's alignment for the unaligned ends of a direct read
/// (without one they are read buffered).
///
/// # Errors
/// [`StorageError::Read`] naming the file and offset of a failed call;
/// [`StorageError::Truncated`] when the file ends first.
pub(crate) fn read_exact_at(
    src: &Source,
    offset: u64,
    room: &mut [u8],
    need: usize,
    mode: IoMode,
    bounce: Option<&mut [u8]>,
) -> Result<Counts, StorageError> {
    debug_assert!(need <= room.len());
    let mut c = Counts::default();
    let mut got = 0;
    let mut use_direct = mode != IoMode::Buffered;
    if mode == IoMode::Auto {
        match all_cached(src, offset, need) {
            Some(true) if src.nowait() => got = cached(src, offset, &mut room[..need], &mut c)?,
            Some(_) => {}
            // Hot or cold cannot be told apart: the page cache serves both
            // (at memory speed when hot, with the kernel's readahead when
            // cold).
            None => use_direct = false,
        }
    }
    if got < need && use_direct {
        got = direct(src, offset, room, need, got, bounce, &mut c)?;
    }
    if got < need {
        if mode == IoMode::Direct {
            if let Some(why) = src.why_buffered() {
                return Err(StorageError::request(
                    format!(
                        "{}: O_DIRECT was asked for, but {why}",
                        src.path().display()
                    ),
                    "read it with IoMode::Auto or IoMode::Buffered",
                ));
            }
        }
        buffered(src, offset, &mut room[..need], got, &mut c)?;
    }
    Ok(c)
}

/// Whether the page cache holds every page of `need` bytes at `offset`
/// (`cachestat`); `None` when the kernel will not say.
fn all_cached(src: &Source, offset: u64, need: usize) -> Option<bool> {
    if !src.residency_known() {
        return None;
    }
    let page = sys::page_size();
    let first = offset / page * page;
    let span = (offset + need as u64).div_ceil(page) * page - first;
    match sys::cached_pages(src.buffered(), first, span) {
        Ok(n) => Some(n >= span / page),
        Err(e) => {
            src.refuse_residency(&e);
            None
        }
    }
}

/// What the page cache holds from `offset` on, read without waiting
/// (`RWF_NOWAIT`: pages evicted since `all_cached` looked end it); returns
/// the bytes read.
fn cached(
    src: &Source,
    offset: u64,
    buf: &mut [u8],
    c: &mut Counts,
) -> Result<usize, StorageError> {
    let mut got = 0;
    while got < buf.len() {
        let at = offset + got as u64;
        match call(src, Call::NoWait, &mut buf[got..], at) {
            Ok(NoWait::Read(0)) | Ok(NoWait::WouldBlock) => break,
            Ok(NoWait::Read(n)) => got += n,
            Ok(NoWait::Unsupported) => {
                src.refuse_nowait();
                break;
            }
            Err(e) => return Err(read_error(src, at, buf.len() - got, e)),
        }
    }
    c.cached += got as u64;
    Ok(got)
}

/// The rest with `O_DIRECT`, when the file allows it and `room` lines up
/// with the file (its address and `offset` agree modulo the alignment);
/// returns the bytes now in place (at most `need`).
fn direct(
    src: &Source,
    offset: u64,
    room: &mut [u8],
    need: usize,
    mut got: usize,
    mut bounce: Option<&mut [u8]>,
    c: &mut Counts,
) -> Result<usize, StorageError> {
    let a = usize_from(src.alignment());
    if src.direct_file().is_none() || (room.as_ptr() as usize) % a != usize_from(offset % a as u64)
    {
        return Ok(got);
    }
    let bounce_ok = bounce
        .as_deref()
        .is_some_and(|b| b.len() >= a && (b.as_ptr() as usize) % a == 0);
    while got < need {
        let at = offset + got as u64;
        let fits = room.len() - got >= a;
        if at % a as u64 == 0 && fits {
            // Whole blocks straight into place, as far as the room allows.
            let want = (need - got).div_ceil(a) * a;
            let len = want.min((room.len() - got) / a * a);
            match call(src, Call::Direct, &mut room[got..got + len], at) {
                Ok(NoWait::Read(0)) => break,
                Ok(NoWait::Read(n)) => {
                    c.direct += n.min(need - got) as u64;
                    got = (got + n).min(need);
                    if n % a != 0 {
                        break; // the end of the file
                    }
                }
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    src.refuse_direct();
                    break;
                }
                Err(e) => return Err(read_error(src, at, len, e)),
            }
        } else if bounce_ok {
            // An unaligned end: its block into the bounce, then the part
            // that belongs here.
            let b = bounce.as_deref_mut().expect("checked above");
            let block = at / a as u64 * a as u64;
            let skip = usize_from(at - block);
            let n = match call(src, Call::Direct, &mut b[..a], block) {
                Ok(NoWait::Read(n)) => n,
                Ok(_) => 0,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    src.refuse_direct();
                    break;
                }
                Err(e) => return Err(read_error(src, block, a, e)),
            };
            let take = n.saturating_sub(skip).min(need - got);
            if take == 0 {
                break;
            }
            room[got..got + take].copy_from_slice(&b[skip..skip + take]);
            c.direct += take as u64;
            got += take;
            if n < a {
                break;
            }
        } else {
            break;
        }
    }
    Ok(got)
}

/// The rest through the page cache, to the last byte.
fn buffered(
    src: &Source,
    offset: u64,
    buf: &mut [u8],
    mut got: usize,
    c: &mut Counts,
) -> Result<(), StorageError> {
    while got < buf.len() {
        let at = offset + got as u64;
        match call(src, Call::Buffered, &mut buf[got..], at) {
            Ok(NoWait::Read(0)) | Ok(NoWait::WouldBlock) | Ok(NoWait::Unsupported) => {
                return Err(StorageError::Truncated {
                    path: src.path().to_path_buf(),
                    file_len: sys::len_now(src.buffered()).unwrap_or(at),
                    wanted_end: offset + buf.len() as u64,
                })
            }
            Ok(NoWait::Read(n)) => {
                c.buffered += n as u64;
                got += n;
            }
            Err(e) => return Err(read_error(src, at, buf.len() - got, e)),
        }
    }
    Ok(())
}
