//! Where the memory numapin lent Python lies: the arena's and shared
//! memory under live tensors and arrays (`MADV_DONTFORK`: not mapped in a
//! forked child), so that `numapin.torch.DataLoader` can refuse a dataset
//! that holds some before it forks workers that would die reading it
//! (`_lent_at`).
//!
//! A forked child inherits the parent's list but none of its memory: the
//! child starts a list of its own on its first buffer, and never waits for
//! the lock a thread of the parent may have held when it forked.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// One lent range: its first byte, its length and what made it.
type Range = (usize, usize, &'static str);

/// The ranges, keyed by the address of the `Memory` that holds each.
static LENT: Mutex<BTreeMap<usize, Range>> = Mutex::new(BTreeMap::new());
/// The process whose list `LENT` is (0: none yet).
static OWNER: AtomicU32 = AtomicU32::new(0);

/// The list of this process, or `None` in a forked child whose inherited
/// lock stays taken (a thread of the parent held it at the fork).
fn list() -> Option<MutexGuard<'static, BTreeMap<usize, Range>>> {
    let me = std::process::id();
    let owner = OWNER.load(Ordering::Acquire);
    if owner == me || owner == 0 {
        let mut g = LENT.lock().unwrap_or_else(PoisonError::into_inner);
        OWNER.store(me, Ordering::Release);
        if owner == 0 {
            g.clear();
        }
        return Some(g);
    }
    // A forked child: another thread of the child may hold the lock for a
    // moment; the parent's thread that held it at the fork never lets go.
    let deadline = Instant::now() + Duration::from_millis(20);
    loop {
        match LENT.try_lock() {
            Ok(mut g) => {
                if OWNER.load(Ordering::Acquire) != me {
                    g.clear();
                    OWNER.store(me, Ordering::Release);
                }
                return Some(g);
            }
            Err(TryLockError::Poisoned(p)) => {
                let mut g = p.into_inner();
                g.clear();
                OWNER.store(me, Ordering::Release);
                return Some(g);
            }
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => std::thread::yield_now(),
            Err(TryLockError::WouldBlock) => return None,
        }
    }
}

/// Notes `len` bytes at `ptr`, held by the memory at `key`, made by
/// `what`.
pub(crate) fn note(key: usize, ptr: usize, len: usize, what: &'static str) {
    if let Some(mut l) = list() {
        l.insert(key, (ptr, len.max(1), what));
    }
}

/// Forgets the range of the memory at `key` (when it goes). In a forked
/// child the parent's ranges are left as they are: the child does not use
/// them, and never waits for the lock.
pub(crate) fn forget(key: usize) {
    if OWNER.load(Ordering::Acquire) != std::process::id() {
        return;
    }
    if let Some(mut l) = list() {
        l.remove(&key);
    }
}

/// The first of `spans` (address, bytes) that overlaps memory numapin lent
/// and that a forked child would not have: its index and what made that
/// memory; `None` when none does.
#[pyfunction]
pub(crate) fn _lent_at(spans: Vec<(usize, usize)>) -> Option<(usize, &'static str)> {
    if OWNER.load(Ordering::Acquire) != std::process::id() {
        return None;
    }
    let mut ranges: Vec<Range> = list()?.values().copied().collect();
    if ranges.is_empty() {
        return None;
    }
    ranges.sort_unstable();
    // The furthest end of the ranges up to each one (they may overlap:
    // views of one shared buffer).
    let mut reach = Vec::with_capacity(ranges.len());
    let mut furthest = (0usize, 0usize);
    for (i, &(start, len, _)) in ranges.iter().enumerate() {
        let end = start.saturating_add(len);
        if end > furthest.0 {
            furthest = (end, i);
        }
        reach.push(furthest);
    }
    spans.iter().enumerate().find_map(|(k, &(ptr, len))| {
        let end = ptr.saturating_add(len.max(1));
        // The ranges starting before the span's end; one of them overlaps
        // it when the furthest of their ends passes its start.
        let before = ranges.partition_point(|r| r.0 < end);
        let (reached, which) = *reach.get(before.checked_sub(1)?)?;
        (reached > ptr).then(|| (k, ranges[which].2))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_overlapping_lent_ranges_are_found_and_forgotten_ones_not() {
        note(1, 1000, 100, "a");
        note(2, 5000, 10, "b");
        note(3, 5002, 2, "c");
        assert_eq!(_lent_at(vec![(0, 10), (1099, 1)]), Some((1, "a")));
        assert_eq!(_lent_at(vec![(1100, 3900)]), None);
        assert_eq!(_lent_at(vec![(1100, 3901)]), Some((0, "b")));
        assert_eq!(_lent_at(vec![(5009, 0)]), Some((0, "b")));
        forget(1);
        assert_eq!(_lent_at(vec![(1050, 1)]), None);
        forget(2);
        forget(3);
        assert_eq!(_lent_at(vec![(5000, 10)]), None);
    }
}
