//! A pool of batch slots in shared memory, for `numapin.torch.DataLoader`.
//!
//! The main process makes one memfd: a 64 KiB header (a free-slot bitmap,
//! the pid holding each slot, a futex word) and, once the slot size is
//! known, `nslots` slots behind it, bound to the GPU's NUMA node, faulted in
//! once by threads on the node's CPUs and registered with CUDA. Worker
//! processes open the same memfd through `/proc/<main pid>/fd/<fd>` (fork
//! and spawn alike), take a free slot, write a batch into it and send only
//! a small descriptor back. The main process copies the slot to the GPU
//! and frees it when the copy has completed (or, for CPU batches, when the
//! last tensor over it is gone).
//!
//! Taking a slot waits on a shared futex with a timeout, so a full pool
//! never deadlocks a worker: after the timeout the batch takes torch's
//! ordinary path.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `"numapin1"`: the header's first word.
const MAGIC: u64 = 0x6e75_6d61_7069_6e31;
/// Header bytes, before the first slot (page-aligned, 2 MiB-friendly).
const HEADER: usize = 64 << 10;
/// Most slots a pool holds (the bitmap's size).
pub(crate) const MAX_SLOTS: usize = 4096;

/// The states after "not yet provisioned" (0): slots ready, closed,
/// being provisioned, provisioning failed (workers stop waiting for it).
const STATE_READY: u32 = 1;
const STATE_CLOSED: u32 = 2;
const STATE_PROVISIONING: u32 = 3;
const STATE_FAILED: u32 = 4;

/// The shared header, at the start of the memfd.
#[repr(C)]
struct Header {
    magic: AtomicU64,
    state: AtomicU32,
    /// Bumped on every release and state change; waiters sleep on it.
    seq: AtomicU32,
    nslots: AtomicU32,
    _pad: AtomicU32,
    slot_bytes: AtomicU64,
    /// The epoch slots are taken in (bumped by the main process before it
    /// starts an epoch).
    generation: AtomicU32,
    _pad2: AtomicU32,
    /// Slot bytes a worker asked for before the pool was provisioned (0:
    /// none yet; the first request wins).
    wanted: AtomicU64,
    /// Slots made so far (faulted in, registered, takeable); the pool grows
    /// up to `nslots` when workers find none free.
    usable: AtomicU32,
    /// 1 while a worker that found no free slot waits for the pool to grow;
    /// 2 when it cannot grow any more (a failure: workers stop asking).
    grow: AtomicU32,
    free: [AtomicU64; MAX_SLOTS / 64],
    holder: [AtomicI32; MAX_SLOTS],
    /// The generation each slot was last taken in.
    taken_in: [AtomicU32; MAX_SLOTS],
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER);

/// A mapping of the pool in this process.
pub(crate) struct Shm {
    fd: OwnedFd,
    header: *mut Header,
    /// The slots' mapping (address, bytes), once provisioned here.
    slots: Mutex<Option<(usize, usize)>>,
    /// Whether this process made the pool (and registered it).
    owner: bool,
    /// The parts of the slots' mapping this process registered with CUDA
    /// (address, bytes): the first slots, then each growth.
    registered: Mutex<Vec<(usize, usize)>>,
    /// Bytes from the start of the slots' mapping whose page table entries
    /// this (worker) process has filled.
    populated: AtomicUsize,
    /// Slots whose release this process owns, with the count of live
    /// leases over each (main process only).
    leased: Mutex<HashMap<u32, usize>>,
}

// SAFETY: the header is only touched through atomics; the slot mapping's
// address is plain data; the rest is behind mutexes.
unsafe impl Send for Shm {}
// SAFETY: as above.
unsafe impl Sync for Shm {}

fn os_err(what: &str) -> std::io::Error {
    let e = std::io::Error::last_os_error();
    std::io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Maps `len` bytes of the memfd at `offset`; with `populate`, the page
/// table entries of pages already in the memfd are made now, in one call
/// (`MAP_POPULATE`), instead of one write fault per 4 KiB page the first
/// time this process touches each.
fn map_shared(fd: i32, len: usize, offset: usize, populate: bool) -> std::io::Result<*mut u8> {
    let flags = if populate {
        libc::MAP_SHARED | libc::MAP_POPULATE
    } else {
        libc::MAP_SHARED
    };
    // SAFETY: a shared mapping of our own memfd at a kernel-chosen address
    // touches no existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        Err(os_err("mmap of the slot pool"))
    } else {
        Ok(p.cast())
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live AtomicU32 in a shared mapping; FUTEX_WAIT
    // (not PRIVATE: other processes wake it) only reads it and sleeps at
    // most `timeout`.
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

fn futex_wake(word: &AtomicU32) {
    // SAFETY: as in futex_wait; FUTEX_WAKE only wakes sleepers.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

impl Shm {
    fn header(&self) -> &Header {
        // SAFETY: `header` points at the live HEADER-byte mapping of the
        // memfd, unmapped only in Drop; every field is an atomic.
        unsafe { &*self.header }
    }

    /// A new pool, header only (main process).
    pub(crate) fn create() -> std::io::Result<Shm> {
        // SAFETY: the name is a NUL-terminated literal.
        let fd = unsafe { libc::memfd_create(c"numapin-loader-slots".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(os_err("memfd_create"));
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on our own memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), HEADER as libc::off_t) } != 0 {
            return Err(os_err("ftruncate of the slot pool"));
        }
        let header = map_shared(fd.as_raw_fd(), HEADER, 0, false)?.cast::<Header>();
        let shm = Shm {
            fd,
            header,
            slots: Mutex::new(None),
            owner: true,
            registered: Mutex::new(Vec::new()),
            populated: AtomicUsize::new(0),
            leased: Mutex::new(HashMap::new()),
        };
        shm.header().magic.store(MAGIC, Ordering::Release);
        Ok(shm)
    }

    /// The pool another process made, by its path
    /// (`/proc/<pid>/fd/<fd>`).
    pub(crate) fn attach(path: &str) -> std::io::Result<Shm> {
        let c = std::ffi::CString::new(path)
            .map_err(|_| std::io::Error::other("the pool's path holds a NUL byte"))?;
        // SAFETY: a NUL-terminated path; open creates nothing.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(os_err(&format!("opening the slot pool {path}")));
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let header = map_shared(fd.as_raw_fd(), HEADER, 0, false)?.cast::<Header>();
        let shm = Shm {
            fd,
            header,
            slots: Mutex::new(None),
            owner: false,
            registered: Mutex::new(Vec::new()),
            populated: AtomicUsize::new(0),
            leased: Mutex::new(HashMap::new()),
        };
        if shm.header().magic.load(Ordering::Acquire) != MAGIC {
            return Err(std::io::Error::other(format!(
                "{path} is not a numapin slot pool"
            )));
        }
        Ok(shm)
    }

    /// The path other processes open the pool by.
    pub(crate) fn path(&self) -> String {
        format!("/proc/{}/fd/{}", std::process::id(), self.fd.as_raw_fd())
    }

    /// Slots and their size (0, 0 before provisioning).
    pub(crate) fn geometry(&self) -> (usize, usize) {
        let h = self.header();
        (
            h.nslots.load(Ordering::Acquire) as usize,
            h.slot_bytes.load(Ordering::Acquire) as usize,
        )
    }

    /// Whether the slots are there to be taken.
    pub(crate) fn ready(&self) -> bool {
        self.header().state.load(Ordering::Acquire) == STATE_READY
    }

    /// Grows the memfd to `nslots` slots of `slot_bytes` and maps them
    /// (main process); `place` binds and faults in the first `first` of
    /// them, `register` registers those; the rest are made by
    /// [`grow`](Self::grow). Then marks the pool ready.
    pub(crate) fn provision(
        &self,
        nslots: usize,
        slot_bytes: usize,
        first: usize,
        place: impl FnOnce(*mut u8, usize) -> std::io::Result<()>,
        register: impl FnOnce(*mut u8, usize) -> bool,
    ) -> std::io::Result<()> {
        let first = first.clamp(1, nslots.max(1));
        if !self.owner || nslots == 0 || nslots > MAX_SLOTS || slot_bytes == 0 {
            return Err(std::io::Error::other(
                "a slot pool is provisioned once, by the process that made it, with 1 to 4096 slots",
            ));
        }
        let len = nslots.checked_mul(slot_bytes).ok_or_else(|| {
            std::io::Error::other("the slot pool is larger than the address space")
        })?;
        let h = self.header();
        if h.state
            .compare_exchange(0, STATE_PROVISIONING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(std::io::Error::other(
                "the slot pool is provisioned already (or closed)",
            ));
        }
        let r = self.provision_now(nslots, slot_bytes, first, len, place, register);
        if r.is_err() {
            let mapped = self.slots.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some((p, len)) = mapped {
                // SAFETY: the mapping provision_now made, not registered
                // (registration is its last step, and cannot fail it) and
                // not yet handed out (the pool never became ready).
                unsafe { libc::munmap(p as *mut _, len) };
            }
            // Back to "not provisioned": a later batch may try again.
            let _ = h.state.compare_exchange(
                STATE_PROVISIONING,
                0,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            h.seq.fetch_add(1, Ordering::AcqRel);
            futex_wake(&h.seq);
        }
        r
    }

    fn provision_now(
        &self,
        nslots: usize,
        slot_bytes: usize,
        first: usize,
        len: usize,
        place: impl FnOnce(*mut u8, usize) -> std::io::Result<()>,
        register: impl FnOnce(*mut u8, usize) -> bool,
    ) -> std::io::Result<()> {
        // SAFETY: ftruncate on our own memfd.
        if unsafe { libc::ftruncate(self.fd.as_raw_fd(), (HEADER + len) as libc::off_t) } != 0 {
            return Err(os_err("ftruncate of the slot pool"));
        }
        // Not populated here: `place` binds the range to the node first,
        // then faults it in on the node's CPUs.
        let p = map_shared(self.fd.as_raw_fd(), len, HEADER, false)?;
        *self.slots.lock().unwrap_or_else(|e| e.into_inner()) = Some((p as usize, len));
        self.make_part(p, first * slot_bytes, place, register)?;
        let h = self.header();
        h.nslots.store(nslots as u32, Ordering::Release);
        h.slot_bytes.store(slot_bytes as u64, Ordering::Release);
        h.usable.store(first as u32, Ordering::Release);
        self.set_free(0, first);
        // Closed meanwhile: stays closed.
        let _ = h.state.compare_exchange(
            STATE_PROVISIONING,
            STATE_READY,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        h.seq.fetch_add(1, Ordering::AcqRel);
        futex_wake(&h.seq);
        Ok(())
    }

    /// Places `len` bytes of the slots' mapping at `p` and registers them
    /// as a part of their own (kept for Drop to unregister).
    fn make_part(
        &self,
        p: *mut u8,
        len: usize,
        place: impl FnOnce(*mut u8, usize) -> std::io::Result<()>,
        register: impl FnOnce(*mut u8, usize) -> bool,
    ) -> std::io::Result<()> {
        place(p, len)?;
        if register(p, len) {
            self.registered
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((p as usize, len));
        }
        Ok(())
    }

    /// Marks slots `from..to` free.
    fn set_free(&self, from: usize, to: usize) {
        let h = self.header();
        for slot in from..to {
            h.free[slot / 64].fetch_or(1u64 << (slot % 64), Ordering::AcqRel);
        }
    }

    /// Slots made so far (at most `nslots`).
    pub(crate) fn usable(&self) -> usize {
        self.header().usable.load(Ordering::Acquire) as usize
    }

    /// Makes up to `more` further slots (main process): `place` binds and
    /// faults them in, `register` registers them as a part of their own
    /// (a slot never spans two parts). Returns the slots usable now.
    pub(crate) fn grow(
        &self,
        more: usize,
        place: impl FnOnce(*mut u8, usize) -> std::io::Result<()>,
        register: impl FnOnce(*mut u8, usize) -> bool,
    ) -> std::io::Result<usize> {
        let h = self.header();
        let (n, b) = self.geometry();
        let from = self.usable();
        let to = (from + more.max(1)).min(n);
        if !self.owner || !self.ready() || from >= to {
            return Ok(from);
        }
        let (base, _) = self.slots()?;
        let p = (base + from * b) as *mut u8;
        self.make_part(p, (to - from) * b, place, register)?;
        h.usable.store(to as u32, Ordering::Release);
        self.set_free(from, to);
        h.seq.fetch_add(1, Ordering::AcqRel);
        futex_wake(&h.seq);
        Ok(to)
    }

    /// The provisioning thread, once the pool is ready: waits until a
    /// worker asks for more slots (`true`), or the pool is closed or `stop`
    /// is set (`false`).
    pub(crate) fn wait_grow(&self, stop: &std::sync::atomic::AtomicBool) -> bool {
        let h = self.header();
        loop {
            let seq = h.seq.load(Ordering::Acquire);
            if stop.load(Ordering::Acquire) || h.state.load(Ordering::Acquire) != STATE_READY {
                return false;
            }
            if h.grow.load(Ordering::Acquire) == 1 {
                return true;
            }
            futex_wait(&h.seq, seq, Duration::from_secs(1));
        }
    }

    /// Ends a growth request: `can_grow` false when the pool cannot grow
    /// any more (workers stop asking).
    pub(crate) fn grown(&self, can_grow: bool) {
        let h = self.header();
        h.grow
            .store(if can_grow { 0 } else { 2 }, Ordering::Release);
        h.seq.fetch_add(1, Ordering::AcqRel);
        futex_wake(&h.seq);
    }

    /// Asks for slots of at least `bytes` (a worker that found the pool not
    /// provisioned yet; the first request wins) and wakes the main
    /// process's provisioning thread.
    pub(crate) fn request(&self, bytes: u64) {
        let h = self.header();
        let _ = h
            .wanted
            .compare_exchange(0, bytes.max(1), Ordering::AcqRel, Ordering::Acquire);
        h.seq.fetch_add(1, Ordering::AcqRel);
        futex_wake(&h.seq);
    }

    /// Waits up to `timeout` for the pool to be ready; whether it is. Gives
    /// up at once when it is closed or its provisioning failed.
    pub(crate) fn wait_ready(&self, timeout: Duration) -> bool {
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
            futex_wait(&h.seq, seq, (deadline - now).min(Duration::from_millis(50)));
        }
    }

    /// The main process's provisioning thread: waits until a worker asks
    /// for slots (`Some(bytes)`), or until the pool is provisioned or closed
    /// by other means, or `stop` is set (`None`).
    pub(crate) fn wait_request(&self, stop: &std::sync::atomic::AtomicBool) -> Option<u64> {
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
            futex_wait(&h.seq, seq, Duration::from_secs(1));
        }
    }

    /// Wakes every process and thread waiting on the pool, to look again.
    pub(crate) fn wake(&self) {
        let h = self.header();
        h.seq.fetch_add(1, Ordering::AcqRel);
        futex_wake(&h.seq);
    }

    /// Marks provisioning failed (the pool was not provisioned): workers
    /// waiting for it take torch's path at once.
    pub(crate) fn fail(&self) {
        let h = self.header();
        if h.state
            .compare_exchange(0, STATE_FAILED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            h.seq.fetch_add(1, Ordering::AcqRel);
            futex_wake(&h.seq);
        }
    }

    /// The slots' mapping in this process, mapped now if the pool became
    /// ready since (worker processes).
    fn slots(&self) -> std::io::Result<(usize, usize)> {
        let mut g = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = *g {
            return Ok(s);
        }
        if !self.ready() {
            return Err(std::io::Error::other("the slot pool is not ready"));
        }
        let (n, b) = self.geometry();
        let len = n * b;
        let p = map_shared(self.fd.as_raw_fd(), len, HEADER, false)?;
        *g = Some((p as usize, len));
        Ok((p as usize, len))
    }

    /// The first byte of slot `slot`, a slot made already. A worker fills
    /// the page table entries of the slots made so far in one call the
    /// first time it reaches one it has not touched (touching them page by
    /// page cost one write fault per 4 KiB per slot per worker, which with
    /// 64 MiB batches bounded a worker more than its copies did).
    pub(crate) fn slot_ptr(&self, slot: u32) -> std::io::Result<*mut u8> {
        let (base, _) = self.slots()?;
        let (_, b) = self.geometry();
        let usable = self.usable();
        if slot as usize >= usable {
            return Err(std::io::Error::other(format!("slot {slot} of {usable}")));
        }
        let end = (slot as usize + 1) * b;
        let done = self.populated.load(Ordering::Acquire);
        if !self.owner && end > done {
            let upto = usable * b;
            // SAFETY: done..upto lies in this process's mapping of the
            // slots, all of them made (faulted in) by the main process;
            // populating maps their pages, changing no data.
            let r = unsafe {
                numapin::internals::numa::populate_write((base + done) as *mut u8, upto - done)
            };
            if r.is_ok() {
                self.populated.fetch_max(upto, Ordering::AcqRel);
            }
        }
        Ok((base + slot as usize * b) as *mut u8)
    }

    /// Whether this process registered the slots with CUDA.
    pub(crate) fn registered(&self) -> bool {
        !self
            .registered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Takes a free slot, waiting up to `timeout` for one; `None` when
    /// none came free in time or the pool is not ready or closed.
    pub(crate) fn acquire(&self, timeout: Duration) -> Option<u32> {
        let h = self.header();
        let deadline = Instant::now() + timeout;
        let me = std::process::id() as i32;
        loop {
            let seq = h.seq.load(Ordering::Acquire);
            if h.state.load(Ordering::Acquire) != STATE_READY {
                return None;
            }
            for (w, word) in h.free.iter().enumerate() {
                let mut v = word.load(Ordering::Acquire);
                while v != 0 {
                    let bit = v.trailing_zeros();
                    match word.compare_exchange_weak(
                        v,
                        v & !(1u64 << bit),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => {
                            let slot = (w * 64) as u32 + bit;
                            h.holder[slot as usize].store(me, Ordering::Release);
                            h.taken_in[slot as usize]
                                .store(h.generation.load(Ordering::Acquire), Ordering::Release);
                            return Some(slot);
                        }
                        Err(now) => v = now,
                    }
                }
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
                futex_wake(&h.seq);
            }
            futex_wait(&h.seq, seq, (deadline - now).min(Duration::from_millis(50)));
        }
    }

    /// Gives slot `slot` back and wakes the processes waiting for one.
    pub(crate) fn release(&self, slot: u32) {
        let h = self.header();
        if slot as usize >= MAX_SLOTS {
            return;
        }
        h.holder[slot as usize].store(0, Ordering::Release);
        h.free[slot as usize / 64].fetch_or(1u64 << (slot % 64), Ordering::AcqRel);
        h.seq.fetch_add(1, Ordering::AcqRel);
        futex_wake(&h.seq);
    }

    /// Frees every slot no live lease in this process holds (the main
    /// process, between epochs and when an epoch is abandoned: slots taken
    /// by batches that were never delivered come back). Returns how many
    /// slots stay held by leases.
    pub(crate) fn reset(&self) -> usize {
        let h = self.header();
        let n = self.usable();
        let leased = self.leased.lock().unwrap_or_else(|e| e.into_inner());
        for slot in 0..n as u32 {
            if !leased.contains_key(&slot) {
                h.holder[slot as usize].store(0, Ordering::Release);
                h.free[slot as usize / 64].fetch_or(1u64 << (slot % 64), Ordering::AcqRel);
            }
        }
        h.seq.fetch_add(1, Ordering::AcqRel);
        futex_wake(&h.seq);
        leased.len()
    }

    /// Starts a new generation (before an epoch's workers produce): slots
    /// taken from now on belong to it. Returns it.
    pub(crate) fn begin_generation(&self) -> u32 {
        self.header().generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Frees the slots taken before generation `generation` that no lease
    /// holds: batches of an abandoned epoch that were never delivered (the
    /// workers are past them once torch has drained that epoch). Slots of
    /// the current generation, which workers may be filling, are left alone.
    /// Returns how many came back.
    pub(crate) fn reclaim_before(&self, generation: u32) -> usize {
        let h = self.header();
        let n = self.usable();
        let leased = self.leased.lock().unwrap_or_else(|e| e.into_inner());
        let mut back = 0;
        for slot in 0..n {
            let bit = 1u64 << (slot % 64);
            let free = h.free[slot / 64].load(Ordering::Acquire) & bit != 0;
            if free || leased.contains_key(&(slot as u32)) {
                continue;
            }
            if h.taken_in[slot].load(Ordering::Acquire) < generation {
                h.holder[slot].store(0, Ordering::Release);
                h.free[slot / 64].fetch_or(bit, Ordering::AcqRel);
                back += 1;
            }
        }
        drop(leased);
        if back > 0 {
            h.seq.fetch_add(1, Ordering::AcqRel);
            futex_wake(&h.seq);
        }
        back
    }

    /// Free slots now.
    pub(crate) fn free_slots(&self) -> usize {
        let n = self.usable();
        let h = self.header();
        (0..n)
            .filter(|&s| h.free[s / 64].load(Ordering::Acquire) & (1u64 << (s % 64)) != 0)
            .count()
    }

    /// Slots this process holds leases on.
    pub(crate) fn leased_slots(&self) -> usize {
        self.leased.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Marks the pool closed: waiting workers give up at once.
    pub(crate) fn close(&self) {
        let h = self.header();
        h.state.store(STATE_CLOSED, Ordering::Release);
        h.seq.fetch_add(1, Ordering::AcqRel);
        futex_wake(&h.seq);
    }

    fn add_lease(&self, slot: u32) {
        *self
            .leased
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(slot)
            .or_insert(0) += 1;
    }

    fn drop_lease(&self, slot: u32) {
        let mut g = self.leased.lock().unwrap_or_else(|e| e.into_inner());
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

impl Drop for Shm {
    fn drop(&mut self) {
        let slots = *self.slots.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some((p, len)) = slots {
            for &(part, _) in self
                .registered
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
            {
                // SAFETY: registered by provision or grow at this address;
                // every view (and so every copy from one) is gone, since
                // each holds an Arc to this mapping.
                let _ = unsafe { numapin::internals::cuda::host_unregister(part as *mut _) };
            }
            // SAFETY: our own mapping, referenced by nothing any more.
            unsafe { libc::munmap(p as *mut _, len) };
        }
        // SAFETY: the header mapping, referenced by nothing any more.
        unsafe { libc::munmap(self.header.cast(), HEADER) };
    }
}

/// The main process's responsibility for one filled slot: the slot goes
/// back to the pool when the last lease over it (and every tensor viewing
/// it through one) is gone.
pub(crate) struct SlotLease {
    pub(crate) shm: Arc<Shm>,
    pub(crate) slot: u32,
}

impl SlotLease {
    pub(crate) fn new(shm: Arc<Shm>, slot: u32) -> SlotLease {
        shm.add_lease(slot);
        SlotLease { shm, slot }
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        self.shm.drop_lease(self.slot);
    }
}

impl std::fmt::Debug for SlotLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotLease")
            .field("slot", &self.slot)
            .finish()
    }
}

impl std::fmt::Debug for Shm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shm")
            .field("fd", &self.fd.as_raw_fd())
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> Arc<Shm> {
        let s = Shm::create().unwrap();
        s.provision(n, 4096, n, |_, _| Ok(()), |_, _| false)
            .unwrap();
        Arc::new(s)
    }

    #[test]
    fn slots_are_taken_once_and_come_back() {
        let p = pool(3);
        let a = p.acquire(Duration::ZERO).unwrap();
        let b = p.acquire(Duration::ZERO).unwrap();
        let c = p.acquire(Duration::ZERO).unwrap();
        assert_ne!(a, b);
        assert_ne!(b, c);
        assert_eq!(
            p.acquire(Duration::from_millis(20)),
            None,
            "only three slots"
        );
        p.release(b);
        assert_eq!(p.acquire(Duration::ZERO), Some(b));
        assert_eq!(p.free_slots(), 0);
    }

    #[test]
    fn a_request_reaches_the_provisioner_and_wakes_the_waiting_worker() {
        use std::sync::atomic::AtomicBool;
        let owner = Arc::new(Shm::create().unwrap());
        let worker = Arc::new(Shm::attach(&owner.path()).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let (o, st) = (owner.clone(), stop.clone());
        let provisioner = std::thread::spawn(move || {
            let bytes = o.wait_request(&st)?;
            o.provision(2, bytes as usize, 2, |_, _| Ok(()), |_, _| false)
                .ok()?;
            Some(bytes)
        });
        assert!(
            !worker.wait_ready(Duration::from_millis(20)),
            "nothing asked yet"
        );
        worker.request(8192);
        worker.request(1 << 30); // later requests do not resize it
        assert!(worker.wait_ready(Duration::from_secs(10)));
        assert_eq!(provisioner.join().unwrap(), Some(8192));
        assert_eq!(worker.geometry(), (2, 8192));
        assert!(worker.acquire(Duration::ZERO).is_some());
        // Provisioned once: a second provisioning is refused.
        assert!(owner
            .provision(2, 4096, 2, |_, _| Ok(()), |_, _| false)
            .is_err());
    }

    #[test]
    fn a_failed_provisioning_stops_the_waiting_and_a_stopped_provisioner_returns() {
        use std::sync::atomic::AtomicBool;
        let owner = Shm::create().unwrap();
        // A failing `place` leaves the pool unprovisioned, to try again.
        assert!(owner
            .provision(
                1,
                4096,
                1,
                |_, _| Err(std::io::Error::other("no")),
                |_, _| false
            )
            .is_err());
        assert!(!owner.ready() && owner.slots.lock().unwrap().is_none());
        owner.fail();
        let start = Instant::now();
        assert!(!owner.wait_ready(Duration::from_secs(10)));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "failure ends the wait"
        );
        let stop = AtomicBool::new(true);
        assert_eq!(owner.wait_request(&stop), None);
        let fresh = Shm::create().unwrap();
        fresh.close();
        assert_eq!(fresh.wait_request(&AtomicBool::new(false)), None, "closed");
    }

    #[test]
    fn a_pool_grows_when_a_worker_finds_no_slot_free_and_stops_at_its_bound() {
        use std::sync::atomic::AtomicBool;
        let owner = Arc::new(Shm::create().unwrap());
        owner
            .provision(5, 4096, 2, |_, _| Ok(()), |_, _| false)
            .unwrap();
        assert_eq!((owner.usable(), owner.free_slots()), (2, 2));
        let worker = Arc::new(Shm::attach(&owner.path()).unwrap());
        let a = worker.acquire(Duration::ZERO).unwrap();
        let b = worker.acquire(Duration::ZERO).unwrap();
        assert_eq!(owner.geometry().0, 5);
        assert!(worker.slot_ptr(4).is_err(), "slot 4 is not made yet");
        let stop = Arc::new(AtomicBool::new(false));
        let (o, st) = (owner.clone(), stop.clone());
        let grower = std::thread::spawn(move || {
            let mut placed = Vec::new();
            while o.wait_grow(&st) {
                let usable = o
                    .grow(
                        2,
                        |p, len| {
                            placed.push((p as usize, len));
                            Ok(())
                        },
                        |_, _| false,
                    )
                    .unwrap();
                o.grown(usable < 5);
            }
            placed
        });
        // No slot free: asking grows the pool by two.
        let c = worker.acquire(Duration::from_secs(10)).unwrap();
        let d = worker.acquire(Duration::from_secs(10)).unwrap();
        let e = worker.acquire(Duration::from_secs(10)).unwrap();
        let mut got = vec![a, b, c, d, e];
        got.sort_unstable();
        assert_eq!(got, vec![0, 1, 2, 3, 4]);
        assert_eq!(owner.usable(), 5);
        assert!(worker.slot_ptr(4).is_ok());
        // At its bound: no more, however long one waits.
        assert_eq!(worker.acquire(Duration::from_millis(100)), None);
        worker.release(c);
        assert_eq!(worker.acquire(Duration::ZERO), Some(c));
        // reset frees made slots only.
        owner.reset();
        assert_eq!(owner.free_slots(), 5);
        stop.store(true, Ordering::Release);
        owner.wake();
        let placed = grower.join().unwrap();
        let (base, _) = owner.slots().unwrap();
        assert_eq!(
            placed,
            vec![(base + 2 * 4096, 2 * 4096), (base + 4 * 4096, 4096)],
            "each growth places only its own slots"
        );
    }

    #[test]
    fn a_waiter_wakes_when_another_process_releases() {
        let p = pool(1);
        let s = p.acquire(Duration::ZERO).unwrap();
        let other = Arc::new(Shm::attach(&p.path()).unwrap());
        let t = std::thread::spawn(move || other.acquire(Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(50));
        let start = Instant::now();
        p.release(s);
        assert_eq!(t.join().unwrap(), Some(s));
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn leases_release_when_the_last_goes_and_reset_keeps_leased_slots() {
        let p = pool(4);
        let s = p.acquire(Duration::ZERO).unwrap();
        let l1 = SlotLease::new(p.clone(), s);
        let l2 = SlotLease::new(p.clone(), s);
        let lost = p.acquire(Duration::ZERO).unwrap(); // taken by a "dead worker"
        assert_eq!(p.free_slots(), 2);
        assert_eq!(p.reset(), 1, "the leased slot stays held");
        assert_eq!(p.free_slots(), 3);
        drop(l1);
        assert_eq!(p.free_slots(), 3);
        drop(l2);
        assert_eq!(p.free_slots(), 4);
        let _ = lost;
    }

    #[test]
    fn reclaiming_an_old_generation_leaves_the_current_one_alone() {
        let p = pool(4);
        let old = p.acquire(Duration::ZERO).unwrap(); // a drained batch
        let held = p.acquire(Duration::ZERO).unwrap();
        let lease = SlotLease::new(p.clone(), held); // a batch the consumer holds
        let g = p.begin_generation();
        let filling = p.acquire(Duration::ZERO).unwrap(); // a new-epoch worker
        assert_eq!(p.reclaim_before(g), 1);
        assert_eq!(p.free_slots(), 2, "old came back; held and filling did not");
        assert_ne!(p.acquire(Duration::ZERO), Some(filling));
        drop(lease);
        let _ = (old, filling);
    }

    #[test]
    fn closing_wakes_waiters_empty_handed() {
        let p = pool(1);
        let _s = p.acquire(Duration::ZERO).unwrap();
        let q = p.clone();
        let t = std::thread::spawn(move || q.acquire(Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(30));
        p.close();
        assert_eq!(t.join().unwrap(), None);
    }

    #[test]
    fn a_worker_sees_slot_contents_written_by_another_mapping() {
        let p = pool(2);
        let w = Shm::attach(&p.path()).unwrap();
        let ptr = w.slot_ptr(1).unwrap();
        // SAFETY: slot 1 is 4096 bytes of the shared mapping.
        unsafe { std::ptr::write_bytes(ptr, 9, 4096) };
        let main = p.slot_ptr(1).unwrap();
        // SAFETY: the same slot through the main mapping.
        assert_eq!(unsafe { *main.add(4095) }, 9);
        assert!(Shm::attach("/proc/self/status").is_err());
    }
}
