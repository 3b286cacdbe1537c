//! The pool's header at the start of its memfd: the state, the slots'
//! geometry, the free-slot bitmap and each slot's holder and generation,
//! all atomics, and the futex word every waiter sleeps on.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::platform::shm;

/// `"numapin1"`: the header's first word.
pub(super) const MAGIC: u64 = 0x6e75_6d61_7069_6e31;
/// Header bytes, before the first slot (page-aligned).
pub(super) const HEADER: usize = 64 << 10;
/// Most slots a pool holds (the bitmap's size).
pub const MAX_SLOTS: usize = 4096;

/// The states after "not yet provisioned" (0): slots ready, closed, being
/// provisioned, provisioning failed (workers stop waiting for it).
pub(super) const STATE_READY: u32 = 1;
pub(super) const STATE_CLOSED: u32 = 2;
pub(super) const STATE_PROVISIONING: u32 = 3;
pub(super) const STATE_FAILED: u32 = 4;

/// The shared header, at the start of the memfd.
#[repr(C)]
pub(super) struct Header {
    pub(super) magic: AtomicU64,
    pub(super) state: AtomicU32,
    /// Bumped on every release and state change; waiters sleep on it.
    pub(super) seq: AtomicU32,
    pub(super) nslots: AtomicU32,
    _pad: AtomicU32,
    pub(super) slot_bytes: AtomicU64,
    /// The epoch slots are taken in (bumped by the main process before it
    /// starts an epoch).
    pub(super) generation: AtomicU32,
    _pad2: AtomicU32,
    /// Slot bytes a worker asked for before the pool was provisioned (0:
    /// none yet; the first request wins).
    pub(super) wanted: AtomicU64,
    /// Slots made so far (faulted in, registered, takeable); the pool grows
    /// up to `nslots` when workers find none free.
    pub(super) usable: AtomicU32,
    /// 1 while a worker that found no free slot waits for the pool to grow;
    /// 2 when it cannot grow any more (a failure: workers stop asking).
    pub(super) grow: AtomicU32,
    pub(super) free: [AtomicU64; MAX_SLOTS / 64],
    pub(super) holder: [AtomicI32; MAX_SLOTS],
    /// The generation each slot was last taken in.
    pub(super) taken_in: [AtomicU32; MAX_SLOTS],
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER);

impl Header {
    /// Bumps the sequence word and wakes every waiter, in every process.
    pub(super) fn wake(&self) {
        self.seq.fetch_add(1, Ordering::AcqRel);
        shm::futex_wake(&self.seq);
    }

    /// Sleeps until the sequence word moves past `seq`, at most `timeout`.
    pub(super) fn sleep(&self, seq: u32, timeout: Duration) {
        shm::futex_wait(&self.seq, seq, timeout);
    }

    /// Marks slots `from..to` free.
    pub(super) fn set_free(&self, from: usize, to: usize) {
        for slot in from..to {
            self.free[slot / 64].fetch_or(1u64 << (slot % 64), Ordering::AcqRel);
        }
    }

    /// Whether slot `slot` is free.
    pub(super) fn is_free(&self, slot: usize) -> bool {
        self.free[slot / 64].load(Ordering::Acquire) & (1u64 << (slot % 64)) != 0
    }

    /// Frees `slot` (no holder).
    pub(super) fn free_slot(&self, slot: usize) {
        self.holder[slot].store(0, Ordering::Release);
        self.free[slot / 64].fetch_or(1u64 << (slot % 64), Ordering::AcqRel);
    }

    /// Takes a free slot for process `me`, if one is free.
    pub(super) fn take(&self, me: i32) -> Option<u32> {
        for (w, word) in self.free.iter().enumerate() {
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
                        let slot = crate::num::u32_saturating(w * 64) + bit;
                        self.holder[slot as usize].store(me, Ordering::Release);
                        self.taken_in[slot as usize]
                            .store(self.generation.load(Ordering::Acquire), Ordering::Release);
                        return Some(slot);
                    }
                    Err(now) => v = now,
                }
            }
        }
        None
    }
}
