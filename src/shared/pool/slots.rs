//! Handing slots over: a worker takes a free slot (waiting, and asking
//! for growth, when none is free), maps and fills it; the main process
//! gives it back.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::header::STATE_READY;
use super::{lock, pool_error, SlotPool, HEADER, MAX_SLOTS};
use crate::platform::numa;
use crate::shared::SharedError;

impl SlotPool {
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

    /// Takes a free slot, waiting up to `timeout` for one (and asking the
    /// main process to grow the pool meanwhile); `None` when none came
    /// free in time or the pool is not ready or closed.
    pub fn acquire(&self, timeout: Duration) -> Option<u32> {
        let h = self.header();
        let deadline = Instant::now() + timeout;
        let me = nix::unistd::getpid().as_raw();
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

    /// Free slots now.
    pub fn free_slots(&self) -> usize {
        let h = self.header();
        (0..self.usable()).filter(|&s| h.is_free(s)).count()
    }
}
