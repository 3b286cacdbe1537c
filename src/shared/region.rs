//! [`SharedRegion`] (made by one process, on a node, counted in its
//! budget) and [`AttachedRegion`] (the same pages mapped by another
//! process, registered with CUDA there).

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::SharedError;
use crate::arena::{RuntimeError, SharedFile, SharedPart};
use crate::num::usize_from;
use crate::platform::{cuda, numa, shm};
use crate::runtime::{Runtime, Target};

/// `"numapsh1"`: the header's first word once the region is ready.
const MAGIC: u64 = 0x6e75_6d61_7073_6831;
/// Bytes before the shared pages: the header's page.
const HEADER: usize = 4096;
/// Regions are whole multiples of this (the arena's region granule).
const GRANULE: usize = 2 << 20;
/// The memfd name of shared memory called `name`.
fn memfd_name(name: &str) -> String {
    format!("{}shared:{name}", shm::MEMFD_PREFIX)
}

/// The first page of the file: what an attaching process needs to know.
#[repr(C)]
struct Header {
    /// [`MAGIC`] once the pages are made (zero before).
    magic: AtomicU64,
    /// Bytes asked for.
    bytes: AtomicU64,
    /// The node the pages are on.
    node: AtomicU64,
}

/// Checks a name: 1 to 64 of `[A-Za-z0-9._-]`.
fn check_name(name: &str) -> Result<(), SharedError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(SharedError::Name {
            name: name.chars().take(80).collect(),
            problem: "not 1 to 64 letters, digits, '.', '_' or '-'".into(),
        })
    }
}

/// Pinned memory on one NUMA node that other processes of the job map too
/// (by name, [`AttachedRegion::attach`]), made by the arena's steps (bound
/// to the node, faulted in on its CPUs, locked, registered with CUDA, its
/// placement checked) and counted once, in this process's budget and
/// [`NodeStats::bytes_shared`](crate::runtime::NodeStats::bytes_shared).
///
/// The pages live while this value or any attached mapping does: a
/// process that exits, crashes included, leaves nothing behind. The name
/// is seen through `/proc/<pid>/fd` links, so attaching needs the same
/// user (the kernel's ptrace access rules).
#[derive(Debug)]
pub struct SharedRegion {
    name: String,
    fd: OwnedFd,
    part: SharedPart,
    bytes: usize,
}

impl SharedRegion {
    /// Makes `bytes` of shared pinned memory called `name` where
    /// [`Runtime::place`] puts `target`'s memory.
    ///
    /// # Errors
    ///
    /// [`SharedError::Name`] for a bad name or one in use by a process
    /// this one can see; the placement's errors; [`SharedError::Runtime`]
    /// when the pages cannot be made (budget, memlock limit, placement,
    /// registration); [`SharedError::System`] when the memfd cannot be
    /// made or sized.
    pub fn create(
        rt: &Runtime,
        target: Target,
        bytes: usize,
        name: &str,
    ) -> Result<SharedRegion, SharedError> {
        check_name(name)?;
        let full = memfd_name(name);
        if let Some(p) = shm::find_memfd(&full).first() {
            return Err(SharedError::Name {
                name: name.into(),
                problem: format!("in use ({})", p.display()),
            });
        }
        let site = rt.place(target)?;
        let arena = rt.arena(site.node)?;
        if bytes == 0 || bytes > isize::MAX as usize / 2 {
            return Err(RuntimeError::BadRequest {
                node: site.node,
                bytes: bytes as u64,
                problem: "shared memory holds 1 byte to the address space".into(),
            }
            .into());
        }
        let len = bytes.next_multiple_of(GRANULE);
        let fd = shm::memfd(&full).map_err(|e| SharedError::system("memfd_create", e))?;
        shm::set_len(fd.as_raw_fd(), (HEADER + len) as u64)
            .map_err(|e| SharedError::system("sizing the shared memory (ftruncate)", e))?;
        let file = SharedFile {
            fd: fd.as_raw_fd(),
            offset: HEADER as u64,
        };
        let part = arena.shared_region(file, bytes, true)?;
        write_header(&fd, bytes, site.node)?;
        Ok(SharedRegion {
            name: name.into(),
            fd,
            part,
            bytes,
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The path another process of the same user opens it by (what
    /// [`AttachedRegion::attach`] finds from the name).
    pub fn path(&self) -> PathBuf {
        shm::proc_path(&self.fd)
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.part.region().ptr()
    }

    /// Bytes asked for (the pages behind them are whole 2 MiB).
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Never true: shared memory holds at least one byte.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The node its pages are on.
    pub fn node(&self) -> u32 {
        self.part.region().node()
    }

    /// Whether it is registered with CUDA in this process.
    pub fn registered(&self) -> bool {
        self.part.region().registered()
    }

    /// The bytes, for reading. Other processes may write them at any time:
    /// the job orders its own accesses.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping holds `bytes` bytes and lives as long as
        // `self`; other processes' writes are plain shared-memory writes.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.bytes) }
    }

    /// The bytes, for writing (see [`as_slice`](Self::as_slice)).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice; `&mut self` makes this process's view
        // unique.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.bytes) }
    }
}

/// Writes the header of a region of `bytes` on `node`, magic last.
fn write_header(fd: &OwnedFd, bytes: usize, node: u32) -> Result<(), SharedError> {
    let p = numa::map_shared(fd.as_raw_fd(), HEADER, 0)
        .map_err(|e| SharedError::system("mapping the shared memory's header", e))?;
    // SAFETY: a fresh mapping of HEADER bytes, zeroed by the kernel;
    // Header is atomics only and fits.
    let h = unsafe { &*p.cast::<Header>() };
    h.bytes.store(bytes as u64, Ordering::Relaxed);
    h.node.store(u64::from(node), Ordering::Relaxed);
    h.magic.store(MAGIC, Ordering::Release);
    // SAFETY: our mapping, referenced by nothing else.
    let _ = unsafe { numa::unmap(p, HEADER) };
    Ok(())
}

/// Another process's [`SharedRegion`], mapped into this one (page tables
/// filled at once) and registered with CUDA when the driver is there:
/// attaching costs a mapping and a registration, no memory.
#[derive(Debug)]
pub struct AttachedRegion {
    path: PathBuf,
    _fd: OwnedFd,
    ptr: *mut u8,
    bytes: usize,
    /// Bytes mapped (whole 2 MiB).
    mapped: usize,
    node: u32,
    registered: bool,
    /// The process that mapped it (`MADV_DONTFORK`: a forked child's copy
    /// unmaps nothing, see `Region`'s).
    pid: u32,
}

// SAFETY: the mapping is owned by the value; the pointer is an address.
unsafe impl Send for AttachedRegion {}
// SAFETY: &AttachedRegion hands out only reads of shared memory.
unsafe impl Sync for AttachedRegion {}

impl AttachedRegion {
    /// Maps the shared memory called `name` (or at `name`, a
    /// `/proc/<pid>/fd/<n>` path from [`SharedRegion::path`]), waiting up
    /// to `wait` for a process to make it.
    ///
    /// # Errors
    ///
    /// [`SharedError::Name`] for a bad name, [`SharedError::NotFound`]
    /// when none appeared in time, [`SharedError::Attach`] for a path that
    /// is not numapin shared memory or cannot be opened,
    /// [`SharedError::System`] when it cannot be mapped, and
    /// [`SharedError::Runtime`] ([`RuntimeError::Register`]) when CUDA refuses
    /// to register it.
    pub fn attach(name: &str, wait: Duration) -> Result<AttachedRegion, SharedError> {
        let deadline = Instant::now() + wait;
        loop {
            match Self::attach_once(name) {
                Err(SharedError::NotFound { .. })
                | Err(SharedError::Attach { source: None, .. })
                    if Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                r => return r,
            }
        }
    }

    fn attach_once(name: &str) -> Result<AttachedRegion, SharedError> {
        let path = if name.starts_with('/') {
            PathBuf::from(name)
        } else {
            check_name(name)?;
            shm::find_memfd(&memfd_name(name))
                .into_iter()
                .next()
                .ok_or_else(|| SharedError::NotFound { name: name.into() })?
        };
        let bad = |problem: &str, source| SharedError::Attach {
            path: path.display().to_string(),
            problem: problem.into(),
            source,
        };
        let fd = shm::open(&path).map_err(|e| bad("cannot open it", Some(e)))?;
        let (bytes, node) = read_header(&fd).ok_or_else(|| {
            bad(
                "not numapin shared memory, or not ready (no header yet)",
                None,
            )
        })?;
        let len = bytes.next_multiple_of(GRANULE);
        let flen = shm::len(fd.as_raw_fd()).map_err(|e| bad("cannot read its length", Some(e)))?;
        if usize_from(flen) < HEADER + len {
            return Err(bad(
                "shorter than its header says: not numapin shared memory",
                Some(std::io::Error::from_raw_os_error(libc::EINVAL)),
            ));
        }
        let ptr = numa::map_shared_populated(fd.as_raw_fd(), len, HEADER as u64, true)
            .map_err(|e| SharedError::system(format!("mapping {}", path.display()), e))?;
        let mut a = AttachedRegion {
            path,
            _fd: fd,
            ptr,
            bytes,
            mapped: len,
            node,
            registered: false,
            pid: std::process::id(),
        };
        // SAFETY: our own fresh mapping; advice changes no data.
        let _ = unsafe { numa::advise(ptr, len, libc::MADV_DONTFORK) };
        a.register()?;
        Ok(a)
    }

    /// Registers the mapping with CUDA when a driver is there.
    fn register(&mut self) -> Result<(), SharedError> {
        if cuda::driver_version().is_err() {
            return Ok(());
        }
        let flags = cuda::HOST_REGISTER_PORTABLE | cuda::HOST_REGISTER_DEVICEMAP;
        // SAFETY: the mapping lives until Drop, which unregisters it first.
        unsafe { cuda::host_register(self.ptr.cast(), self.mapped, flags) }.map_err(|source| {
            RuntimeError::Register {
                node: self.node,
                size: self.mapped as u64,
                source,
            }
        })?;
        self.registered = true;
        Ok(())
    }

    /// The path it was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes the maker asked for.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Never true: shared memory holds at least one byte.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The node the maker put the pages on.
    pub fn node(&self) -> u32 {
        self.node
    }

    /// Whether it is registered with CUDA in this process.
    pub fn registered(&self) -> bool {
        self.registered
    }

    /// The bytes, for reading (see [`SharedRegion::as_slice`]).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping holds at least `bytes` bytes and lives as
        // long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }

    /// The bytes, for writing (see [`SharedRegion::as_slice`]).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice; `&mut self` makes this view unique here.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

/// `(bytes, node)` from a ready header; `None` when there is none yet or
/// it is not numapin's.
fn read_header(fd: &OwnedFd) -> Option<(usize, u32)> {
    if usize_from(shm::len(fd.as_raw_fd()).ok()?) < HEADER {
        return None;
    }
    let p = numa::map_shared(fd.as_raw_fd(), HEADER, 0).ok()?;
    // SAFETY: a mapping of HEADER bytes of the file; Header is atomics.
    let h = unsafe { &*p.cast::<Header>() };
    // A node number past u32 is not numapin's (it was cut to 32 bits).
    let r = (h.magic.load(Ordering::Acquire) == MAGIC)
        .then(|| {
            let node = u32::try_from(h.node.load(Ordering::Relaxed)).ok()?;
            Some((usize_from(h.bytes.load(Ordering::Relaxed)), node))
        })
        .flatten();
    // SAFETY: our mapping, referenced by nothing else.
    let _ = unsafe { numa::unmap(p, HEADER) };
    r.filter(|&(b, _)| b > 0 && b <= isize::MAX as usize / 2)
}

impl Drop for AttachedRegion {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            return;
        }
        if self.registered {
            // SAFETY: registered by attach at this address; nothing of ours
            // copies from it any more (the value is going).
            let _ = unsafe { cuda::host_unregister(self.ptr.cast()) };
        }
        // SAFETY: our own mapping, referenced by nothing any more.
        let _ = unsafe { numa::unmap(self.ptr, self.mapped) };
    }
}
