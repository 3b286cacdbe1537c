//! The main process's leases on filled slots, and getting slots back:
//! between epochs ([`SlotPool::reset`]) and from an abandoned epoch's
//! generation ([`SlotPool::reclaim_before`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{lock, pool_error, SlotPool};
use crate::num::u32_saturating;
use crate::shared::SharedError;

impl SlotPool {
    /// Frees every slot no live lease in this process holds (the main
    /// process, between epochs and when an epoch is abandoned). Returns how
    /// many slots stay held by leases.
    pub fn reset(&self) -> usize {
        let h = self.header();
        let leased = lock(&self.leased);
        for slot in 0..self.usable() {
            if !leased.contains_key(&u32_saturating(slot)) {
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
            if h.is_free(slot) || leased.contains_key(&u32_saturating(slot)) {
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
