//! [`SlotPool`]: fixed-size slots of shared pinned memory that worker
//! processes fill and a main process copies to a GPU (what
//! `numapin.torch.DataLoader` runs on).
//!
//! The main process makes one memfd: a 64 KiB header (a free-slot bitmap,
//! the process holding each slot, a futex word; [`header`]) and, once the
//! slot size is known, up to `nslots` slots behind it. The slots are made
//! in parts (the first ones, then each growth), each part one of the
//! arena's shared regions ([`Runtime`]'s engine: bound to the node
//! [`Runtime::place`] gives, faulted in on its CPUs, locked, registered
//! with CUDA, its placement checked, counted in the node's budget), so no
//! slot spans two registrations. Worker processes open the same memfd
//! through `/proc/<main pid>/fd/<fd>` (fork and spawn alike), take a free
//! slot, write a batch into it and send only a small descriptor back; the
//! main process copies the slot and frees it when the copy has completed.
//!
//! Taking a slot waits on the shared futex with a timeout, so a full pool
//! never deadlocks a worker.

mod header;
#[cfg(test)]
mod tests;
mod write;

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::SharedError;
use crate::arena::{NodeArena, SharedFile, SharedPart};
use crate::platform::{numa, shm};
use crate::runtime::{Runtime, Target};
use header::{Header, HEADER, MAGIC, STATE_CLOSED, STATE_FAILED, STATE_PROVISIONING, STATE_READY};

pub use header::MAX_SLOTS;

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
        if shm::len(fd.as_raw_fd()).is_ok_and(|l| (l as usize) < HEADER) {
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
            h.slot_bytes.load(Ordering::Acquire) as usize,
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

    /// Sizes the pool for up to `nslots` slots of `slot_bytes` (rounded up
    /// to [`SLOT_GRANULE`]) where [`Runtime::place`] puts `target`'s memory,
    /// makes the first `first` of them now (registered with CUDA when
    /// `register` and the runtime's configuration ask for it), and marks
    /// the pool ready. The rest come with [`grow`](Self::grow). Main
    /// process only, once; a failure leaves the pool unprovisioned (a
    /// later call may try again).
    ///
    /// # Errors
    ///
    /// [`SharedError::Pool`] for a second call, a call from a worker, or a
    /// size out of range; the placement's and the arena's errors
    /// (budget, memlock, placement) as [`SharedError::Arena`];
    /// [`SharedError::System`] when the memfd cannot grow.
    pub fn provision(
        &self,
        rt: &Runtime,
        target: Target,
        (nslots, slot_bytes): (usize, usize),
        first: usize,
        register: bool,
    ) -> Result<(), SharedError> {
        if !self.owner || nslots == 0 || nslots > MAX_SLOTS || slot_bytes == 0 {
            return Err(pool_error(format!(
                "a slot pool is provisioned by the process that made it, with 1 to {MAX_SLOTS} slots of at least 1 byte"
            )));
        }
        let b = slot_bytes
            .checked_next_multiple_of(SLOT_GRANULE)
            .filter(|b| {
                b.checked_mul(nslots)
                    .is_some_and(|l| l <= isize::MAX as usize / 2)
            })
            .ok_or_else(|| {
                pool_error(format!(
                    "{nslots} slots of {slot_bytes} bytes are larger than the address space"
                ))
            })?;
        let h = self.header();
        if h.state
            .compare_exchange(0, STATE_PROVISIONING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(pool_error(
                "the slot pool is provisioned already (or closed)",
            ));
        }
        let r = self.provision_now(rt, target, (nslots, b), first.clamp(1, nslots), register);
        if r.is_err() {
            lock(&self.parts).clear();
            *lock(&self.maker) = None;
            // Back to "not provisioned": a later batch may try again.
            let _ = h.state.compare_exchange(
                STATE_PROVISIONING,
                0,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            h.wake();
        }
        r
    }

    fn provision_now(
        &self,
        rt: &Runtime,
        target: Target,
        (nslots, b): (usize, usize),
        first: usize,
        register: bool,
    ) -> Result<(), SharedError> {
        shm::set_len(self.fd.as_raw_fd(), (HEADER + nslots * b) as u64)
            .map_err(|e| SharedError::system("sizing the slot pool (ftruncate)", e))?;
        let site = rt.place(target)?;
        *lock(&self.maker) = Some(Maker {
            arena: rt.arena(site.node)?.clone(),
            register,
        });
        let h = self.header();
        h.slot_bytes.store(b as u64, Ordering::Release);
        self.make_part(0, first)?;
        h.nslots.store(nslots as u32, Ordering::Release);
        h.usable.store(first as u32, Ordering::Release);
        h.set_free(0, first);
        // Closed meanwhile: stays closed.
        let _ = h.state.compare_exchange(
            STATE_PROVISIONING,
            STATE_READY,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        h.wake();
        Ok(())
    }

    /// Makes slots `from..to` as one shared region of the arena.
    fn make_part(&self, from: usize, to: usize) -> Result<(), SharedError> {
        let maker = lock(&self.maker)
            .clone()
            .ok_or_else(|| pool_error("the slot pool is not provisioned"))?;
        let b = self.header().slot_bytes.load(Ordering::Acquire) as usize;
        let file = SharedFile {
            fd: self.fd.as_raw_fd(),
            offset: (HEADER + from * b) as u64,
        };
        let part = maker
            .arena
            .shared_region(file, (to - from) * b, maker.register)?;
        lock(&self.parts).push(Part { from, to, part });
        Ok(())
    }

    /// Makes up to `more` further slots (main process), as a part of their
    /// own. Returns the slots usable now.
    ///
    /// # Errors
    ///
    /// The arena's errors when the part cannot be made (the slots made
    /// before stay).
    pub fn grow(&self, more: usize) -> Result<usize, SharedError> {
        let (n, _) = self.geometry();
        let from = self.usable();
        let to = (from + more.max(1)).min(n);
        if !self.owner || !self.ready() || from >= to {
            return Ok(from);
        }
        self.make_part(from, to)?;
        let h = self.header();
        h.usable.store(to as u32, Ordering::Release);
        h.set_free(from, to);
        h.wake();
        Ok(to)
    }

    /// The provisioning thread, once the pool is ready: waits until a
    /// worker asks for more slots (`true`), or the pool is closed or `stop`
    /// is set (`false`).
    pub fn wait_grow(&self, stop: &AtomicBool) -> bool {
        let h = self.header();
        loop {
            let seq = h.seq.load(Ordering::Acquire);
            if stop.load(Ordering::Acquire) || h.state.load(Ordering::Acquire) != STATE_READY {
                return false;
            }
            if h.grow.load(Ordering::Acquire) == 1 {
                return true;
            }
            h.sleep(seq, Duration::from_secs(1));
        }
    }

    /// Ends a growth request: `can_grow` false when the pool cannot grow
    /// any more (workers stop asking).
    pub fn grown(&self, can_grow: bool) {
        let h = self.header();
        h.grow
            .store(if can_grow { 0 } else { 2 }, Ordering::Release);
        h.wake();
    }

    /// Asks for slots of at least `bytes` (a worker that found the pool not
    /// provisioned yet; the first request wins) and wakes the main
    /// process's provisioning thread.
    pub fn request(&self, bytes: u64) {
        let h = self.header();
        let _ = h
            .wanted
            .compare_exchange(0, bytes.max(1), Ordering::AcqRel, Ordering::Acquire);
        h.wake();
    }

    /// Waits up to `timeout` for the pool to be ready; whether it is. Gives
    /// up at once when it is closed or its provisioning failed.
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        let h = self.header();
        let deadline = Instant::now() + timeout;
        loop {
            let seq = h.seq.load(Ordering::Acquire);
            match h.state.load(Ordering::Acquire) {
                STATE_READY => return true,
                STATE_CLOSED | STATE_FAILED => return false,
                _ => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            h.sleep(seq, (deadline - now).min(Duration::from_millis(50)));
        }
    }

    /// The main process's provisioning thread: waits until a worker asks
    /// for slots (`Some(bytes)`), or until the pool is provisioned or closed
    /// by other means, or `stop` is set (`None`).
    pub fn wait_request(&self, stop: &AtomicBool) -> Option<u64> {
        let h = self.header();
        loop {
            let seq = h.seq.load(Ordering::Acquire);
            if stop.load(Ordering::Acquire) || h.state.load(Ordering::Acquire) != 0 {
                return None;
            }
            let w = h.wanted.load(Ordering::Acquire);
            if w != 0 {
                return Some(w);
            }
            h.sleep(seq, Duration::from_secs(1));
        }
    }

    /// Wakes every process and thread waiting on the pool, to look again.
    pub fn wake(&self) {
        self.header().wake();
    }

    /// Marks provisioning failed (the pool was not provisioned): workers
    /// waiting for it give up at once.
    pub fn fail(&self) {
        let h = self.header();
        if h.state
            .compare_exchange(0, STATE_FAILED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            h.wake();
        }
    }

    /// Marks the pool closed: waiting workers give up at once.
    pub fn close(&self) {
        let h = self.header();
        h.state.store(STATE_CLOSED, Ordering::Release);
        h.wake();
    }

    /// The first byte of slot `slot`, a slot made already. A worker maps
    /// the slots when it first needs one, and fills the page table entries
    /// of the slots made so far in one call the first time it reaches one
    /// it has not touched (touching page by page cost one write fault per
    /// 4 KiB per slot per worker).
    ///
    /// # Errors
    ///
    /// [`SharedError::Pool`] for a slot not made (or a pool not ready);
    /// [`SharedError::System`] when a worker cannot map the slots.
    pub fn slot_ptr(&self, slot: u32) -> Result<*mut u8, SharedError> {
        let usable = self.usable();
        if slot as usize >= usable {
            return Err(pool_error(format!("slot {slot} of {usable}")));
        }
        let (_, b) = self.geometry();
        if self.owner {
            let parts = lock(&self.parts);
            let p = parts
                .iter()
                .find(|p| (p.from..p.to).contains(&(slot as usize)))
                .ok_or_else(|| pool_error(format!("slot {slot} is in no part")))?;
            return Ok(p
                .part
                .region()
                .ptr()
                .wrapping_add((slot as usize - p.from) * b));
        }
        let (base, _) = self.worker_mapping()?;
        let end = (slot as usize + 1) * b;
        let done = self.populated.load(Ordering::Acquire);
        if end > done {
            let upto = usable * b;
            // SAFETY: done..upto lies in this process's mapping of the
            // slots, all of them made (faulted in) by the main process;
            // populating maps their pages, changing no data.
            let r = unsafe { numa::populate_write((base + done) as *mut u8, upto - done) };
            if r.is_ok() {
                self.populated.fetch_max(upto, Ordering::AcqRel);
            }
        }
        Ok((base + slot as usize * b) as *mut u8)
    }

    /// A worker's mapping of every slot, made now if the pool became ready
    /// since.
    fn worker_mapping(&self) -> Result<(usize, usize), SharedError> {
        let mut g = lock(&self.mapped);
        if let Some(s) = *g {
            return Ok(s);
        }
        if !self.ready() {
            return Err(pool_error("the slot pool is not ready"));
        }
        let (n, b) = self.geometry();
        let len = n * b;
        let p = numa::map_shared(self.fd.as_raw_fd(), len, HEADER as u64)
            .map_err(|e| SharedError::system("mapping the slot pool's slots", e))?;
        *g = Some((p as usize, len));
        Ok((p as usize, len))
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

    /// Takes a free slot, waiting up to `timeout` for one (and asking the
    /// main process to grow the pool meanwhile); `None` when none came
    /// free in time or the pool is not ready or closed.
    pub fn acquire(&self, timeout: Duration) -> Option<u32> {
        let h = self.header();
        let deadline = Instant::now() + timeout;
        let me = std::process::id() as i32;
        loop {
            let seq = h.seq.load(Ordering::Acquire);
            if h.state.load(Ordering::Acquire) != STATE_READY {
                return None;
            }
            if let Some(slot) = h.take(me) {
                return Some(slot);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            // None free: ask the main process for more, if there can be.
            let (n, _) = self.geometry();
            if self.usable() < n
                && h.grow
                    .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                h.wake();
            }
            h.sleep(seq, (deadline - now).min(Duration::from_millis(50)));
        }
    }

    /// Gives slot `slot` back and wakes the processes waiting for one.
    pub fn release(&self, slot: u32) {
        if (slot as usize) < MAX_SLOTS {
            let h = self.header();
            h.free_slot(slot as usize);
            h.wake();
        }
    }

    /// Frees every slot no live lease in this process holds (the main
    /// process, between epochs and when an epoch is abandoned). Returns how
    /// many slots stay held by leases.
    pub fn reset(&self) -> usize {
        let h = self.header();
        let leased = lock(&self.leased);
        for slot in 0..self.usable() {
            if !leased.contains_key(&(slot as u32)) {
                h.free_slot(slot);
            }
        }
        h.wake();
        leased.len()
    }

    /// Starts a new generation (before an epoch's workers produce): slots
    /// taken from now on belong to it. Returns it.
    pub fn begin_generation(&self) -> u32 {
        self.header().generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Frees the slots taken before generation `generation` that no lease
    /// holds: batches of an abandoned epoch that were never delivered.
    /// Slots of the current generation, which workers may be filling, are
    /// left alone. Returns how many came back.
    pub fn reclaim_before(&self, generation: u32) -> usize {
        let h = self.header();
        let leased = lock(&self.leased);
        let mut back = 0;
        for slot in 0..self.usable() {
            if h.is_free(slot) || leased.contains_key(&(slot as u32)) {
                continue;
            }
            if h.taken_in[slot].load(Ordering::Acquire) < generation {
                h.free_slot(slot);
                back += 1;
            }
        }
        drop(leased);
        if back > 0 {
            h.wake();
        }
        back
    }

    /// Free slots now.
    pub fn free_slots(&self) -> usize {
        let h = self.header();
        (0..self.usable()).filter(|&s| h.is_free(s)).count()
    }

    /// Slots this process holds leases on.
    pub fn leased_slots(&self) -> usize {
        lock(&self.leased).len()
    }

    fn add_lease(&self, slot: u32) {
        *lock(&self.leased).entry(slot).or_insert(0) += 1;
    }

    fn drop_lease(&self, slot: u32) {
        let mut g = lock(&self.leased);
        let gone = match g.get_mut(&slot) {
            Some(c) => {
                *c -= 1;
                *c == 0
            }
            None => false,
        };
        if gone {
            g.remove(&slot);
            drop(g);
            self.release(slot);
        }
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

/// The main process's hold on one filled slot: the slot goes back to the
/// pool when the last lease over it (and every view made through one) is
/// gone.
#[derive(Debug)]
pub struct SlotLease {
    pool: Arc<SlotPool>,
    slot: u32,
}

impl SlotLease {
    /// Takes over giving `slot` of `pool` back.
    ///
    /// # Errors
    ///
    /// [`SharedError::Pool`] for a slot the pool does not have.
    pub fn new(pool: Arc<SlotPool>, slot: u32) -> Result<SlotLease, SharedError> {
        let (n, _) = pool.geometry();
        if slot as usize >= n {
            return Err(pool_error(format!("slot {slot} of {n}")));
        }
        pool.add_lease(slot);
        Ok(SlotLease { pool, slot })
    }

    /// The slot.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<SlotPool> {
        &self.pool
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        self.pool.drop_lease(self.slot);
    }
}
