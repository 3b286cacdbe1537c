//! Waiting and signalling between the pool's processes over the header's
//! futex word: readiness, growth requests, the first worker's request for
//! slots, failure and closing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::header::{STATE_CLOSED, STATE_FAILED, STATE_READY};
use super::SlotPool;

impl SlotPool {
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
}
