//! Per-thread caches of freed blocks: alloc and free without the arena's
//! lock.
//!
//! Each thread keeps, for each arena it has freed into, a *shelf*: a few
//! bins of freed blocks, one bin per block size (the request rounded up to
//! the alignment), each a LIFO stack. Dropping a buffer with no copy in
//! flight pushes its block onto the dropping thread's shelf; allocating a
//! size whose bin holds a block pops it. Both take only the shelf's own
//! lock, which no other thread takes except to drain the shelf (trim, the
//! budget path, closing the arena), so it is never contended and its cache
//! line stays with the thread.
//!
//! Bounds (per thread and arena, [`CacheLimits`]): at most `max_blocks`
//! blocks and `max_bytes` bytes, only blocks up to `max_block_bytes` (and at
//! most half a region: larger requests get regions of their own, which must
//! not be kept alive by a cache), [`MAX_BINS`] sizes. A push that would
//! break a bound first gives blocks back to the arena under one lock: other
//! sizes first, then the oldest of its own size, down to half the bounds,
//! so a thread that only frees (a consumer of buffers other threads
//! allocated) takes the arena's lock once per `max_blocks / 2` frees.
//!
//! Blocks go back to the arena when the thread exits (the shelf list is a
//! thread-local with a destructor), when
//! [`NodeArena::flush_thread_cache`] or [`NodeArena::flush_all_caches`] is
//! called, on [`NodeArena::trim`], before the arena grows or refuses a
//! request for its budget, and when the arena is closed
//! ([`NodeArena::close_thread_caches`], which the runtime's drop calls).
//! While a thread waits for the budget, frees bypass the caches.
//!
//! A cached block holds the [`Arc`] of its arena that its buffer held (it
//! moves from buffer to cache and back, so the hot path does no shared
//! reference counting): an arena with cached blocks stays alive until they
//! are given back.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use super::{lock, Lease, NodeArena, PinnedBuf, Region};

/// Most distinct block sizes one shelf holds at once.
pub(crate) const MAX_BINS: usize = 8;

/// Bounds of one thread's cache for one arena (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimits {
    /// Most blocks a thread keeps for one arena; 0 turns caching off.
    pub max_blocks: usize,
    /// Most bytes a thread keeps for one arena.
    pub max_bytes: u64,
    /// Largest block kept (larger ones always go back to the arena).
    pub max_block_bytes: u64,
}

impl Default for CacheLimits {
    /// 64 blocks, 16 MiB, blocks up to 4 MiB.
    fn default() -> Self {
        CacheLimits {
            max_blocks: 64,
            max_bytes: 16 << 20,
            max_block_bytes: 4 << 20,
        }
    }
}

impl CacheLimits {
    /// No caching: every alloc and free takes the arena's lock.
    pub fn off() -> Self {
        CacheLimits {
            max_blocks: 0,
            max_bytes: 0,
            max_block_bytes: 0,
        }
    }

    /// The largest block size that may be cached by an arena with regions
    /// of `region_bytes` (0: none).
    pub(super) fn largest_cached(&self, region_bytes: u64) -> u64 {
        if self.max_blocks == 0 {
            return 0;
        }
        self.max_block_bytes
            .min(self.max_bytes)
            .min(region_bytes / 2)
    }
}

/// A freed block on a shelf, with everything a buffer needs.
pub(super) struct Cached {
    pub(super) ptr: *mut u8,
    pub(super) lease: Lease,
    pub(super) registered: bool,
    pub(super) arena: Arc<NodeArena>,
}

// SAFETY: a Cached owns its block exclusively (taken from one PinnedBuf,
// handed to one PinnedBuf or back to the arena); the pointer is only an
// address into the arena's region, kept alive by the Arc beside it.
unsafe impl Send for Cached {}

struct Bin {
    size: u64,
    blocks: Vec<Cached>,
}

/// One thread's cache for one arena (behind the shelf's lock).
#[derive(Default)]
pub(super) struct ShelfState {
    bins: Vec<Bin>,
    blocks: usize,
    bytes: u64,
    /// Allocations served from this shelf, not yet counted by the arena.
    pub(super) hits: u64,
    /// Buffers taken back into this shelf, not yet counted by the arena.
    pub(super) frees: u64,
}

impl ShelfState {
    /// Blocks held.
    pub(super) fn blocks(&self) -> usize {
        self.blocks
    }

    /// Bytes held.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    #[inline]
    fn pop(&mut self, size: u64) -> Option<Cached> {
        let bin = self.bins.iter_mut().find(|b| b.size == size)?;
        let c = bin.blocks.pop()?;
        self.blocks -= 1;
        self.bytes -= size;
        Some(c)
    }

    /// Takes blocks out until one more of `size` fits in `lim` with room
    /// to spare (half the bounds), other sizes first, then the oldest of
    /// its own size; and until there is a bin for `size`.
    fn evict_for(&mut self, size: u64, lim: &CacheLimits, out: &mut Vec<Cached>) {
        let over = |s: &ShelfState| {
            s.blocks > 0
                && (s.blocks + 1 > lim.max_blocks
                    || s.bytes + size > lim.max_bytes
                    || s.blocks > lim.max_blocks / 2
                    || s.bytes > lim.max_bytes / 2)
        };
        let must = self.blocks + 1 > lim.max_blocks || self.bytes + size > lim.max_bytes;
        if must {
            for i in 0..self.bins.len() {
                if !over(self) {
                    break;
                }
                if self.bins[i].size == size {
                    continue;
                }
                while over(self) {
                    let Some(c) = self.bins[i].blocks.pop() else {
                        break;
                    };
                    self.blocks -= 1;
                    self.bytes -= c.lease.size;
                    out.push(c);
                }
            }
            if let Some(i) = self.bins.iter().position(|b| b.size == size) {
                let mut k = 0;
                while over(self) && k < self.bins[i].blocks.len() {
                    self.blocks -= 1;
                    self.bytes -= size;
                    k += 1;
                }
                out.extend(self.bins[i].blocks.drain(..k));
            }
        }
        if self.bins.iter().all(|b| b.size != size) && self.bins.len() >= MAX_BINS {
            // No bin for this size and no room for one: empty the bin with
            // the fewest bytes and give it to this size.
            let i = (0..self.bins.len())
                .min_by_key(|&i| self.bins[i].blocks.len() as u64 * self.bins[i].size)
                .expect("MAX_BINS > 0");
            let bin = &mut self.bins[i];
            self.blocks -= bin.blocks.len();
            self.bytes -= bin.blocks.len() as u64 * bin.size;
            out.append(&mut bin.blocks);
            bin.size = size;
        }
    }

    fn insert(&mut self, c: Cached) {
        let size = c.lease.size;
        let i = match self.bins.iter().position(|b| b.size == size) {
            Some(i) => i,
            None => match self.bins.iter().position(|b| b.blocks.is_empty()) {
                Some(i) => {
                    self.bins[i].size = size;
                    i
                }
                None => {
                    self.bins.push(Bin {
                        size,
                        blocks: Vec::new(),
                    });
                    self.bins.len() - 1
                }
            },
        };
        self.bins[i].blocks.push(c);
        self.blocks += 1;
        self.bytes += size;
    }

    /// Takes every block out.
    fn take_all(&mut self, out: &mut Vec<Cached>) {
        for b in &mut self.bins {
            out.append(&mut b.blocks);
        }
        self.blocks = 0;
        self.bytes = 0;
    }
}

/// A shelf: one thread's cache for one arena, reachable from the arena (to
/// drain it) as well as from its thread. On cache lines of its own: its
/// thread writes it on every cached alloc and free.
#[repr(align(128))]
pub(super) struct Shelf {
    pub(super) state: Mutex<ShelfState>,
    arena: Weak<NodeArena>,
}

/// This thread's shelves, by arena id; given back when the thread exits.
struct ThreadShelves(Vec<(u64, Arc<Shelf>)>);

impl ThreadShelves {
    #[inline]
    fn find(&self, id: u64) -> Option<&Arc<Shelf>> {
        self.0.iter().find(|(i, _)| *i == id).map(|(_, s)| s)
    }
}

impl Drop for ThreadShelves {
    fn drop(&mut self) {
        for (_, shelf) in self.0.drain(..) {
            // An arena that is gone has no cached block (each holds it).
            if let Some(arena) = shelf.arena.upgrade() {
                arena.drain_shelf(&shelf, true);
            }
        }
    }
}

thread_local! {
    static SHELVES: RefCell<ThreadShelves> = const { RefCell::new(ThreadShelves(Vec::new())) };
}

impl NodeArena {
    /// A block of `size` bytes from this thread's cache, lent as a buffer
    /// of `len` bytes.
    #[inline]
    pub(super) fn cache_pop(&self, size: u64, len: usize) -> Option<PinnedBuf> {
        SHELVES
            .try_with(|t| {
                let t = t.try_borrow().ok()?;
                let mut st = lock(&t.find(self.id)?.state);
                let c = st.pop(size)?;
                st.hits += 1;
                drop(st);
                Some(PinnedBuf::new(c.ptr, len, c.registered, c.lease, c.arena))
            })
            .ok()
            .flatten()
    }

    /// Puts a freed block (no copy in flight, at most the arena's
    /// largest cached size) on this thread's shelf, giving blocks back to
    /// the arena first when a bound would be broken. Returns the block when
    /// it cannot be cached (the thread is exiting, the caches are closed).
    #[inline]
    pub(super) fn cache_push(c: Cached) -> Result<(), Cached> {
        let mut slot = Some(c);
        let _ = SHELVES.try_with(|t| {
            if let Some(c) = slot.take() {
                slot = Self::push_here(t, c).err();
            }
        });
        match slot {
            None => Ok(()),
            Some(c) => Err(c),
        }
    }

    #[inline]
    fn push_here(t: &RefCell<ThreadShelves>, c: Cached) -> Result<(), Cached> {
        // The block's own handle keeps the arena alive until it is
        // inserted, the last step.
        let arena = &*c.arena;
        let Ok(mut t) = t.try_borrow_mut() else {
            return Err(c);
        };
        // The borrow is held throughout: nothing below drops a buffer or
        // comes back here.
        let i = match t.0.iter().position(|(id, _)| *id == arena.id) {
            Some(i) => i,
            None => arena.new_shelf(&mut t, &c.arena),
        };
        let mut st = lock(&t.0[i].1.state);
        // Checked under the shelf's lock: a close that drained this shelf
        // has set it before, so nothing is left behind.
        if !arena.caching.load(Ordering::Relaxed) {
            drop(st);
            return Err(c);
        }
        let size = c.lease.size;
        let lim = arena.cfg.cache;
        if st.blocks + 1 > lim.max_blocks
            || st.bytes + size > lim.max_bytes
            || (st.bins.len() >= MAX_BINS && st.bins.iter().all(|b| b.size != size))
        {
            let mut out = Vec::new();
            st.evict_for(size, &lim, &mut out);
            arena.take_back(out, &mut st);
        }
        st.frees += 1;
        st.insert(c);
        Ok(())
    }

    #[cold]
    fn new_shelf(&self, t: &mut ThreadShelves, arena: &Arc<NodeArena>) -> usize {
        // Shelves of arenas that are gone are empty: drop them.
        t.0.retain(|(_, s)| s.arena.strong_count() > 0);
        let shelf = Arc::new(Shelf {
            state: Mutex::new(ShelfState::default()),
            arena: Arc::downgrade(arena),
        });
        {
            let mut all = lock(&self.shelves);
            all.retain(|s| s.strong_count() > 0);
            all.push(Arc::downgrade(&shelf));
        }
        t.0.push((self.id, shelf));
        t.0.len() - 1
    }

    /// Frees cached blocks into the bookkeeping (the shelf's lock held by
    /// the caller, so the stats never see a block both cached and free).
    fn take_back(&self, out: Vec<Cached>, _shelf: &mut ShelfState) {
        if out.is_empty() {
            return;
        }
        let mut released: Vec<Region> = Vec::new();
        {
            let mut st = lock(&self.state);
            for c in &out {
                released.extend(Self::free_locked(&mut st, c.lease, false));
            }
        }
        self.notify_waiters();
        // Outside the lock: region teardown and the arena handles.
        drop(released);
        drop(out);
    }

    /// Gives every block of `shelf` back; with `retire`, also hands its
    /// counters to the arena (the thread is going away). Returns the
    /// blocks given back.
    pub(super) fn drain_shelf(&self, shelf: &Shelf, retire: bool) -> usize {
        let mut st = lock(&shelf.state);
        let mut out = Vec::new();
        st.take_all(&mut out);
        let n = out.len();
        if retire && (st.hits > 0 || st.frees > 0) {
            let mut a = lock(&self.state);
            a.counters.allocations += st.hits;
            a.counters.cache_hits += std::mem::take(&mut st.hits);
            a.counters.frees += std::mem::take(&mut st.frees);
        }
        self.take_back(out, &mut st);
        n
    }

    /// The shelves of every thread that may hold blocks of this arena.
    pub(super) fn live_shelves(&self) -> Vec<Arc<Shelf>> {
        lock(&self.shelves)
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Gives the blocks the calling thread has cached for this arena back
    /// to it; returns how many there were (a test hook).
    #[cfg(feature = "internals")]
    pub(crate) fn flush_thread_cache(&self) -> usize {
        let shelf = SHELVES
            .try_with(|t| t.try_borrow().ok()?.find(self.id).cloned())
            .ok()
            .flatten();
        shelf.map_or(0, |s| self.drain_shelf(&s, false))
    }

    /// Gives the blocks every thread has cached for this arena back to it
    /// (each thread's cache is locked briefly, one at a time); returns how
    /// many there were.
    pub(crate) fn flush_all_caches(&self) -> usize {
        self.live_shelves()
            .iter()
            .map(|s| self.drain_shelf(s, false))
            .sum()
    }

    /// Stops caching for this arena and gives every cached block back, so
    /// that dropping the last handle of the arena frees its memory at once
    /// (the runtime does this when dropped). Allocation and free keep
    /// working, through the arena's lock.
    pub(crate) fn close_thread_caches(&self) {
        self.caching.store(false, Ordering::Relaxed);
        self.flush_all_caches();
    }
}
