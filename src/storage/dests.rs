//! The destinations of a read to a GPU: known from the start, or made by
//! the caller one by one while the workers read, a worker waiting for
//! those its next read needs.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use super::plan::Segment;

/// Each range's device address, and how many (from the first) are known.
#[derive(Debug)]
pub(super) struct Dests {
    base: Vec<AtomicU64>,
    state: Mutex<State>,
    more: Condvar,
    /// `State::want`, readable without the lock (a hint for the maker).
    want: AtomicUsize,
    /// Wake-ups sent, for the tests.
    #[cfg(test)]
    wakes: std::sync::atomic::AtomicUsize,
}

/// How many destinations are known, and the least range a waiting worker
/// needs (`usize::MAX`: none waits).
#[derive(Debug)]
struct State {
    ready: usize,
    want: usize,
}

impl Dests {
    /// Every destination known now.
    pub(super) fn all(ptrs: impl IntoIterator<Item = u64>) -> Dests {
        let base: Vec<AtomicU64> = ptrs.into_iter().map(AtomicU64::new).collect();
        let n = base.len();
        Dests::with(base, n)
    }

    fn with(base: Vec<AtomicU64>, ready: usize) -> Dests {
        Dests {
            base,
            state: Mutex::new(State {
                ready,
                want: usize::MAX,
            }),
            more: Condvar::new(),
            want: AtomicUsize::new(usize::MAX),
            #[cfg(test)]
            wakes: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// `n` destinations to come, in order, through [`Dests::publish`].
    pub(super) fn pending(n: usize) -> Dests {
        Dests::with((0..n).map(|_| AtomicU64::new(0)).collect(), 0)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The destinations of ranges `start..start + ptrs.len()`, known to
    /// the workers from now on; `start` must be the number known so far.
    /// The waiting workers are woken only when one of them needs one of
    /// these (each then looks again, and those still short say what they
    /// need anew): many small ranges need not wake every worker each.
    pub(super) fn publish(&self, start: usize, ptrs: &[u64]) {
        let mut st = self.state();
        assert_eq!(st.ready, start, "destinations come in order");
        let n = start + ptrs.len();
        for (slot, &p) in self.base[start..n].iter().zip(ptrs) {
            slot.store(p, Ordering::Relaxed);
        }
        st.ready = n;
        let wake = st.want < n;
        if wake {
            st.want = usize::MAX;
            self.want.store(usize::MAX, Ordering::Relaxed);
        }
        drop(st);
        if wake {
            self.woke();
        }
    }

    /// The least range a waiting worker needs (`usize::MAX`: none waits,
    /// as far as this lock-free look can tell), for [`Batch::add`].
    pub(super) fn wanted(&self) -> usize {
        self.want.load(Ordering::Relaxed)
    }

    fn woke(&self) {
        #[cfg(test)]
        self.wakes.fetch_add(1, Ordering::Relaxed);
        self.more.notify_all();
    }

    /// Waits until range `i`'s destination is known: how many are known
    /// then, or `None` once `stop` is set (whoever sets it then calls
    /// [`Dests::wake`]).
    pub(super) fn wait_for(&self, i: usize, stop: &AtomicBool) -> Option<usize> {
        let mut st = self.state();
        loop {
            if stop.load(Ordering::SeqCst) {
                return None;
            }
            if st.ready > i {
                return Some(st.ready);
            }
            st.want = st.want.min(i);
            self.want.store(st.want, Ordering::Relaxed);
            st = self.more.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The destinations known now, with their ranges' indexes.
    pub(super) fn known(&self) -> Vec<(usize, u64)> {
        let n = self.state().ready;
        (0..n)
            .map(|i| (i, self.base[i].load(Ordering::Relaxed)))
            .collect()
    }

    /// Wakes every waiting worker, to see `stop`.
    pub(super) fn wake(&self) {
        // Taking the lock orders this after a waiter's look at `stop`.
        drop(self.state());
        self.woke();
    }

    /// Where `seg`'s bytes go (its range's destination known: after
    /// [`Dests::wait_for`] its range).
    pub(super) fn of(&self, seg: &Segment) -> u64 {
        self.base[seg.req].load(Ordering::Relaxed) + seg.at as u64
    }
}

/// A batch of destinations holds at most this many ranges (or
/// [`PUBLISH_BYTES`] of them) before it goes to the workers.
pub(super) const PUBLISH_EVERY: usize = 64;

/// See [`PUBLISH_EVERY`].
pub(super) const PUBLISH_BYTES: usize = 4 << 20;

/// Destinations made but not yet published: the maker publishes them
/// together (after one event record on the caller's stream for all of
/// them, not one a tensor, for checkpoints of many small tensors).
#[derive(Debug, Default)]
pub(super) struct Batch {
    start: usize,
    ptrs: Vec<u64>,
    bytes: usize,
}

impl Batch {
    /// Adds the next range's destination (`len` bytes); whether the batch
    /// is due: [`PUBLISH_EVERY`] ranges or [`PUBLISH_BYTES`] in it, a
    /// worker waiting for one of them (`wanted`: [`Dests::wanted`], looked
    /// at after making this one; a worker that starts waiting later is
    /// served at the next destination made), or `last`.
    pub(super) fn add(&mut self, ptr: u64, len: usize, wanted: usize, last: bool) -> bool {
        self.ptrs.push(ptr);
        self.bytes = self.bytes.saturating_add(len);
        last || self.ptrs.len() >= PUBLISH_EVERY
            || self.bytes >= PUBLISH_BYTES
            || wanted < self.start + self.ptrs.len()
    }

    /// Publishes the batch to `dests` and starts the next one.
    pub(super) fn publish(&mut self, dests: &Dests) {
        dests.publish(self.start, &self.ptrs);
        self.start += self.ptrs.len();
        self.ptrs.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    impl Dests {
        /// Range `i`'s destination, published at once.
        fn set(&self, i: usize, ptr: u64) {
            self.publish(i, &[ptr]);
        }
    }

    /// Waits (at most 10 s, then fails) until `ok`.
    fn until(what: &str, ok: impl Fn() -> bool) {
        let t = std::time::Instant::now();
        while !ok() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "timed out waiting: {what}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn seg(req: usize, at: usize) -> Segment {
        Segment {
            slot_off: 0,
            len: 1,
            at,
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
    fn a_waiting_workers_need_is_seen_and_met_by_a_batch() {
        let d = Dests::pending(4);
        let stop = AtomicBool::new(false);
        assert_eq!(d.wanted(), usize::MAX, "no one waits yet");
        std::thread::scope(|s| {
            let w = s.spawn(|| d.wait_for(2, &stop));
            until("the worker's need", || d.wanted() != usize::MAX);
            assert_eq!(d.wanted(), 2, "the maker sees what the worker needs");
            d.publish(0, &[0, 10]);
            std::thread::sleep(Duration::from_millis(20));
            assert!(!w.is_finished(), "ranges 0-1 do not meet a need of 2");
            d.publish(2, &[20]);
            assert_eq!(w.join().unwrap(), Some(3));
        });
        assert_eq!(d.wanted(), usize::MAX, "the need was met");
        assert_eq!(d.of(&seg(2, 1)), 21);
        assert_eq!(d.known(), vec![(0, 0), (1, 10), (2, 20)]);
    }

    #[test]
    #[should_panic(expected = "destinations come in order")]
    fn a_batch_out_of_order_is_refused() {
        let d = Dests::pending(4);
        d.publish(1, &[5]);
    }

    #[test]
    fn a_batch_is_due_at_its_count_its_bytes_a_need_or_the_end() {
        let idle = usize::MAX;
        let mut b = Batch::default();
        let due: Vec<bool> = (0..PUBLISH_EVERY)
            .map(|_| b.add(1, 10, idle, false))
            .collect();
        assert!(
            due[..PUBLISH_EVERY - 1].iter().all(|d| !d),
            "small ranges wait for company"
        );
        assert!(due[PUBLISH_EVERY - 1], "due at {PUBLISH_EVERY} ranges");
        let d = Dests::pending(PUBLISH_EVERY + 8);
        b.publish(&d);
        assert_eq!(d.known().len(), PUBLISH_EVERY);
        // The next batch counts from where the last ended.
        assert!(!b.add(7, PUBLISH_BYTES - 1, idle, false));
        assert!(b.add(8, 1, idle, false), "due at {PUBLISH_BYTES} bytes");
        b.publish(&d);
        assert_eq!(d.known()[PUBLISH_EVERY + 1], (PUBLISH_EVERY + 1, 8));
        // A worker waiting for a range in the batch, or one before it.
        let n = PUBLISH_EVERY + 2;
        assert!(
            !b.add(9, 1, n + 1, false),
            "the worker needs a range not made yet"
        );
        assert!(
            b.add(9, 1, n + 1, false),
            "the worker needs the range just made"
        );
        b.publish(&d);
        assert!(
            b.add(9, 1, 0, false),
            "a need already met is no reason to wait"
        );
        assert!(b.add(9, 1, idle, true), "the last range");
    }

    #[test]
    fn destinations_no_worker_waits_for_wake_none() {
        let d = Dests::pending(300);
        let stop = AtomicBool::new(false);
        let ready = AtomicUsize::new(0);
        std::thread::scope(|s| {
            let waiters: Vec<_> = (0..4)
                .map(|k| {
                    let (d, stop) = (&d, &stop);
                    let ready = &ready;
                    s.spawn(move || {
                        ready.fetch_add(1, Ordering::SeqCst);
                        d.wait_for(100 + 50 * k, stop)
                    })
                })
                .collect();
            until("a waiter's need", || {
                ready.load(Ordering::SeqCst) == 4 && d.state().want != usize::MAX
            });
            // At least one waiter has said what it needs; the pause makes it
            // likely that all four have (the test holds either way).
            std::thread::sleep(Duration::from_millis(20));
            for i in 0..100 {
                d.set(i, i as u64);
            }
            assert_eq!(d.wakes.load(Ordering::Relaxed), 0, "no waiter needs 0-99");
            for i in 100..300 {
                d.set(i, i as u64);
            }
            let got: Vec<_> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
            assert!(got.iter().all(Option::is_some), "{got:?}");
            // One wake-up each time the least need was met (at 100, 150,
            // 200, 250), not one a destination.
            let wakes = d.wakes.load(Ordering::Relaxed);
            assert!((1..=4).contains(&wakes), "{wakes} wake-ups");
        });
    }

    /// A profile, not a goal: the cost of a destination with 16 workers
    /// waiting, each for the next unmet one (`step` 1) or every
    /// thousandth (`step` 1000), printed; it asserts only the wake-ups
    /// (`cargo test --release --lib dests_profile -- --ignored --nocapture`).
    #[test]
    #[ignore = "a profile: run it by name"]
    fn dests_profile_wakes_with_16_waiting() {
        for step in [1usize, 1000] {
            let n = 20_000;
            let d = Dests::pending(n);
            let stop = AtomicBool::new(false);
            let next = AtomicUsize::new(0);
            let mut t = std::time::Instant::now();
            std::thread::scope(|s| {
                for _ in 0..16 {
                    s.spawn(|| loop {
                        let k = next.fetch_add(step, Ordering::Relaxed) + step - 1;
                        if k >= n {
                            break;
                        }
                        d.wait_for(k, &stop);
                    });
                }
                // The workers waiting before the first destination comes.
                while d.state().want == usize::MAX {
                    std::thread::yield_now();
                }
                std::thread::sleep(Duration::from_millis(20));
                t = std::time::Instant::now();
                for i in 0..n {
                    d.set(i, i as u64);
                }
            });
            let wakes = d.wakes.load(Ordering::Relaxed);
            eprintln!(
                "16 waiting, a need every {step}: {:.2} us a destination, {wakes} wake-ups",
                t.elapsed().as_secs_f64() * 1e6 / 20_000.0
            );
            // At most one wake-up a need met.
            assert!(wakes <= n / step, "{wakes} wake-ups for {} needs", n / step);
        }
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
