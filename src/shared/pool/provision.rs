//! Provisioning and growth: the pool's geometry, the first slots and each
//! later part, made by the arena on the node [`Runtime::place`] gives
//! (main process).

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use super::header::STATE_PROVISIONING;
use super::header::STATE_READY;
use super::{lock, pool_error, Maker, Part, SlotPool, HEADER, MAX_SLOTS, SLOT_GRANULE};
use crate::arena::SharedFile;
use crate::num::u32_saturating;
use crate::platform::shm;
use crate::runtime::{Runtime, Target};
use crate::shared::SharedError;

impl SlotPool {
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
    /// (budget, memlock, placement) as [`SharedError::Runtime`];
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
        // Both at most MAX_SLOTS (checked above).
        h.nslots.store(u32_saturating(nslots), Ordering::Release);
        h.usable.store(u32_saturating(first), Ordering::Release);
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
        let b = crate::num::usize_from(self.header().slot_bytes.load(Ordering::Acquire));
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
        h.usable.store(u32_saturating(to), Ordering::Release);
        h.set_free(from, to);
        h.wake();
        Ok(to)
    }
}
