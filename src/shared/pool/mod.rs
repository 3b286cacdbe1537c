//! [`SlotPool`]: fixed-size slots of shared pinned memory that worker
//! processes fill and a main process copies to a GPU (what
//! `numapin.torch.DataLoader` runs on).
//!
//! The main process makes one memfd: a 64 KiB header (a free-slot bitmap,
//! the process holding each slot, a futex word; [`header`]) and, once the
//! slot size is known, up to `nslots` slots behind it. The slots are made
//! in parts (the first ones, then each growth), each part one of the
//! arena's shared regions ([`Runtime`](crate::Runtime)'s engine: bound to
//! the node [`Runtime::place`](crate::Runtime::place) gives, faulted in on its CPUs, locked, registered
//! with CUDA, its placement checked, counted in the node's budget), so no
//! slot spans two registrations. Worker processes open the same memfd
//! through `/proc/<main pid>/fd/<fd>` (fork and spawn alike), take a free
//! slot, write a batch into it and send only a small descriptor back; the
//! main process copies the slot and frees it when the copy has completed.
//!
//! Taking a slot waits on the shared futex with a timeout, so a full pool
//! never deadlocks a worker.
//!
//! The pool's code, by concern: this file (the pool itself: its memfd and
//! header, what it is made of, attaching), `header` (the shared header's
//! layout and atomics), `provision` (its geometry, the first slots and
//! each growth), `slots` (handing slots to workers and back), `leases`
//! (the main process's leases, and getting slots back between epochs and
//! from an abandoned one's generation) and `waiting` (waiting and waking
//! across processes: ready, growth, requests, failure, closing).

mod header;
mod leases;
mod provision;
mod slots;
#[cfg(test)]
mod tests;
mod waiting;
mod write;

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::SharedError;
use crate::arena::{NodeArena, SharedPart};
use crate::num::usize_from;
use crate::platform::{numa, shm};
use header::{Header, HEADER, MAGIC, STATE_READY};

pub use header::MAX_SLOTS;
pub use leases::SlotLease;

/// Slots are whole multiples of this (the arena's region granule), so each
/// part of the pool is a region of its own with nothing in between.
pub const SLOT_GRANULE: usize = 2 << 20;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn pool_error(problem: impl Into<String>) -> SharedError {
    SharedError::Pool {
        problem: problem.into(),
    }
}

/// Slots `from..to`, made as one region (main process).
#[derive(Debug)]
struct Part {
    from: usize,
    to: usize,
    part: SharedPart,
}

/// Where the main process makes parts: the arena of the pool's node, and
/// whether to register them.
#[derive(Debug, Clone)]
struct Maker {
    arena: Arc<NodeArena>,
    register: bool,
}

/// One process's view of a slot pool (see the module docs).
pub struct SlotPool {
    fd: OwnedFd,
    header: *mut Header,
    /// Whether this process made the pool (and makes its slots).
    owner: bool,
    /// Main process: the parts made so far, in slot order.
    parts: Mutex<Vec<Part>>,
    /// Main process: where growth parts come from, once provisioned.
    maker: Mutex<Option<Maker>>,
    /// Worker: the mapping of every slot `(address, bytes)`, once ready.
    mapped: Mutex<Option<(usize, usize)>>,
    /// Worker: bytes from the start of the slots whose page table entries
    /// this process has filled.
    populated: AtomicUsize,
    /// Main process: slots whose release this process owns, with the count
    /// of live leases over each.
    leased: Mutex<HashMap<u32, usize>>,
}

// SAFETY: the header is only touched through atomics; the mappings'
// addresses are plain data; the rest is behind mutexes.
unsafe impl Send for SlotPool {}
// SAFETY: as above.
unsafe impl Sync for SlotPool {}

impl std::fmt::Debug for SlotPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotPool")
            .field("fd", &self.fd.as_raw_fd())
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl SlotPool {
    fn header(&self) -> &Header {
        // SAFETY: `header` points at the live HEADER-byte mapping of the
        // memfd, unmapped only in Drop; every field is an atomic.
        unsafe { &*self.header }
    }

    fn with_fd(fd: OwnedFd, owner: bool) -> Result<SlotPool, SharedError> {
        let header = numa::map_shared(fd.as_raw_fd(), HEADER, 0)
            .map_err(|e| SharedError::system("mapping the slot pool's header", e))?
            .cast::<Header>();
        Ok(SlotPool {
            fd,
            header,
            owner,
            parts: Mutex::new(Vec::new()),
            maker: Mutex::new(None),
            mapped: Mutex::new(None),
            populated: AtomicUsize::new(0),
            leased: Mutex::new(HashMap::new()),
        })
    }

    /// A new pool, header only (main process).
    ///
    /// # Errors
    ///
    /// [`SharedError::System`] when the memfd cannot be made, sized or
    /// mapped (open-file or address-space limits).
    pub fn create() -> Result<SlotPool, SharedError> {
        let name = format!("{}slots", shm::MEMFD_PREFIX);
        let fd = shm::memfd(&name).map_err(|e| SharedError::system("memfd_create", e))?;
        shm::set_len(fd.as_raw_fd(), HEADER as u64)
            .map_err(|e| SharedError::system("sizing the slot pool (ftruncate)", e))?;
        let pool = SlotPool::with_fd(fd, true)?;
        pool.header().magic.store(MAGIC, Ordering::Release);
        Ok(pool)
    }

    /// The pool another process made, by its path (`/proc/<pid>/fd/<fd>`,
    /// [`SlotPool::path`]).
    ///
    /// # Errors
    ///
    /// [`SharedError::Attach`] when the path cannot be opened or is not a
    /// slot pool; [`SharedError::System`] when it cannot be mapped.
    pub fn attach(path: &Path) -> Result<SlotPool, SharedError> {
        let bad = |problem: &str, source| SharedError::Attach {
            path: path.display().to_string(),
            problem: problem.into(),
            source,
        };
        let fd = shm::open(path).map_err(|e| bad("cannot open the slot pool", Some(e)))?;
        if shm::len(fd.as_raw_fd()).is_ok_and(|l| usize_from(l) < HEADER) {
            return Err(bad("not a numapin slot pool (too short)", None));
        }
        let pool = SlotPool::with_fd(fd, false)?;
        if pool.header().magic.load(Ordering::Acquire) != MAGIC {
            return Err(bad("not a numapin slot pool", None));
        }
        Ok(pool)
    }

    /// The path other processes attach by.
    pub fn path(&self) -> PathBuf {
        shm::proc_path(&self.fd)
    }

    /// Slots the pool may grow to and their size (0, 0 before
    /// provisioning).
    pub fn geometry(&self) -> (usize, usize) {
        let h = self.header();
        (
            h.nslots.load(Ordering::Acquire) as usize,
            usize_from(h.slot_bytes.load(Ordering::Acquire)),
        )
    }

    /// Whether the slots are there to be taken.
    pub fn ready(&self) -> bool {
        self.header().state.load(Ordering::Acquire) == STATE_READY
    }

    /// Slots made so far (at most [`geometry`](Self::geometry)'s count).
    pub fn usable(&self) -> usize {
        self.header().usable.load(Ordering::Acquire) as usize
    }

    /// Whether this process registered the slots with CUDA.
    pub fn registered(&self) -> bool {
        lock(&self.parts)
            .iter()
            .any(|p| p.part.region().registered())
    }

    /// The node the slots are on (main process, once provisioned).
    pub fn node(&self) -> Option<u32> {
        lock(&self.maker).as_ref().map(|m| m.arena.node())
    }
}

impl Drop for SlotPool {
    fn drop(&mut self) {
        // The parts (unregistered, unlocked, unmapped, their budget given
        // back) go with `parts`; a worker's mapping is unmapped here.
        if let Some((p, len)) = *self.mapped.get_mut().unwrap_or_else(|e| e.into_inner()) {
            // SAFETY: this process's mapping of the slots, referenced by
            // nothing any more (every view holds an Arc to the pool).
            let _ = unsafe { numa::unmap(p as *mut u8, len) };
        }
        // SAFETY: the header mapping, referenced by nothing any more.
        let _ = unsafe { numa::unmap(self.header.cast(), HEADER) };
    }
}
