//! The destinations of a read to a GPU: known from the start, or made by
//! the caller one by one while the workers read, a worker waiting for
//! those its next read needs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use super::plan::Segment;

/// Each range's device address, and how many (from the first) are known.
#[derive(Debug)]
pub(super) struct Dests {
    base: Vec<AtomicU64>,
    ready: Mutex<usize>,
    more: Condvar,
}

impl Dests {
    /// Every destination known now.
    pub(super) fn all(ptrs: impl IntoIterator<Item = u64>) -> Dests {
        let base: Vec<AtomicU64> = ptrs.into_iter().map(AtomicU64::new).collect();
        let n = base.len();
        Dests {
            base,
            ready: Mutex::new(n),
            more: Condvar::new(),
        }
    }

    /// `n` destinations to come, in order, through [`Dests::set`].
    pub(super) fn pending(n: usize) -> Dests {
        Dests {
            base: (0..n).map(|_| AtomicU64::new(0)).collect(),
            ready: Mutex::new(0),
            more: Condvar::new(),
        }
    }

    /// Range `i`'s destination, which must be the next one to come.
    pub(super) fn set(&self, i: usize, ptr: u64) {
        let mut ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        debug_assert_eq!(*ready, i, "destinations come in order");
        self.base[i].store(ptr, Ordering::Relaxed);
        *ready = i + 1;
        drop(ready);
        self.more.notify_all();
    }

    /// Waits until range `i`'s destination is known: how many are known
    /// then, or `None` once `stop` is set (whoever sets it then calls
    /// [`Dests::wake`]).
    pub(super) fn wait_for(&self, i: usize, stop: &AtomicBool) -> Option<usize> {
        let mut ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if stop.load(Ordering::SeqCst) {
                return None;
            }
            if *ready > i {
                return Some(*ready);
            }
            ready = self.more.wait(ready).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The destinations known now, with their ranges' indexes.
    pub(super) fn known(&self) -> Vec<(usize, u64)> {
        let n = *self.ready.lock().unwrap_or_else(|p| p.into_inner());
        (0..n)
            .map(|i| (i, self.base[i].load(Ordering::Relaxed)))
            .collect()
    }

    /// Wakes every waiting worker, to see `stop`.
    pub(super) fn wake(&self) {
        // Taking the lock orders this after a waiter's look at `stop`.
        drop(self.ready.lock().unwrap_or_else(|p| p.into_inner()));
        self.more.notify_all();
    }

    /// Where `seg`'s bytes go (its range's destination known: after
    /// [`Dests::wait_for`] its range).
    pub(super) fn of(&self, seg: &Segment) -> u64 {
        self.base[seg.req].load(Ordering::Relaxed) + seg.dst
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn seg(req: usize, dst: u64) -> Segment {
        Segment {
            slot_off: 0,
            len: 1,
            dst,
            req,
        }
    }

    #[test]
    fn known_destinations_need_no_wait() {
        let d = Dests::all([100, 200]);
        let stop = AtomicBool::new(false);
        assert_eq!(d.wait_for(1, &stop), Some(2));
        assert_eq!(d.of(&seg(1, 5)), 205);
    }

    #[test]
    fn a_worker_waits_for_its_range_and_sees_its_address() {
        let d = Dests::pending(3);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let w = s.spawn(|| {
                let r = d.wait_for(1, &stop);
                (r, d.of(&seg(1, 7)))
            });
            d.set(0, 1000);
            std::thread::sleep(Duration::from_millis(20));
            assert!(!w.is_finished(), "range 1 is not known yet");
            d.set(1, 2000);
            assert_eq!(w.join().unwrap(), (Some(2), 2007));
        });
    }

    #[test]
    fn a_stop_wakes_the_waiting_workers() {
        let d = Dests::pending(2);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let w = s.spawn(|| d.wait_for(0, &stop));
            std::thread::sleep(Duration::from_millis(20));
            stop.store(true, Ordering::SeqCst);
            d.wake();
            assert_eq!(w.join().unwrap(), None);
        });
    }
}
