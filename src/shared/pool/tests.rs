#![allow(clippy::unwrap_used)] // tests fail loudly

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::{SlotLease, SlotPool, SLOT_GRANULE};
use crate::runtime::{Runtime, RuntimeConfig, Target};
use crate::topology::{ProbeOptions, Topology};

const MIB: usize = 1 << 20;

/// One runtime of this machine for every test (no CUDA registration: the
/// tests run without a GPU).
fn rt() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        let t = Topology::probe(&ProbeOptions::from_process()).unwrap();
        Runtime::new(t, RuntimeConfig::default().with_register(false)).unwrap()
    })
}

fn pool(n: usize) -> Arc<SlotPool> {
    let s = SlotPool::create().unwrap();
    s.provision(rt(), Target::Host, (n, 4096), n, false)
        .unwrap();
    Arc::new(s)
}

/// A runtime of a test's own (the other tests' pools come and go in the
/// shared one meanwhile).
fn own_rt() -> Runtime {
    let t = Topology::probe(&ProbeOptions::from_process()).unwrap();
    Runtime::new(t, RuntimeConfig::default().with_register(false)).unwrap()
}

/// Bytes of shared regions over every node of `rt`.
fn shared_bytes(rt: &Runtime) -> u64 {
    rt.stats().iter().map(|s| s.bytes_shared).sum()
}

#[test]
fn slots_are_taken_once_and_come_back() {
    let p = pool(3);
    assert_eq!(p.geometry(), (3, SLOT_GRANULE), "slots are whole 2 MiB");
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
    let owner = Arc::new(SlotPool::create().unwrap());
    let worker = Arc::new(SlotPool::attach(&owner.path()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let (o, st) = (owner.clone(), stop.clone());
    let provisioner = std::thread::spawn(move || {
        let bytes = o.wait_request(&st)?;
        o.provision(
            rt(),
            Target::Host,
            (2, crate::num::usize_from(bytes)),
            2,
            false,
        )
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
    assert_eq!(worker.geometry(), (2, SLOT_GRANULE));
    assert!(worker.acquire(Duration::ZERO).is_some());
    // Provisioned once: a second provisioning is refused, as is one by a
    // worker.
    let again = owner.provision(rt(), Target::Host, (2, 4096), 2, false);
    assert!(matches!(again, Err(super::SharedError::Pool { .. })));
    assert!(worker
        .provision(rt(), Target::Host, (2, 4096), 2, false)
        .is_err());
}

#[test]
fn a_failed_provisioning_stops_the_waiting_and_a_stopped_provisioner_returns() {
    let owner = SlotPool::create().unwrap();
    // Over the node's budget: the pool stays unprovisioned, to try again,
    // with nothing made.
    let own = own_rt();
    let budget = crate::num::usize_from(own.stats()[0].budget);
    let r = owner.provision(&own, Target::Host, (4, budget / 2), 4, false);
    assert!(matches!(r, Err(super::SharedError::Runtime(_))), "{r:?}");
    assert!(!owner.ready() && owner.parts.lock().unwrap().is_empty());
    assert_eq!(shared_bytes(&own), 0);
    owner.fail();
    let start = Instant::now();
    assert!(!owner.wait_ready(Duration::from_secs(10)));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "failure ends the wait"
    );
    let stop = AtomicBool::new(true);
    assert_eq!(owner.wait_request(&stop), None);
    let fresh = SlotPool::create().unwrap();
    fresh.close();
    assert_eq!(fresh.wait_request(&AtomicBool::new(false)), None, "closed");
}

#[test]
fn a_pool_grows_when_a_worker_finds_no_slot_free_and_stops_at_its_bound() {
    let owner = Arc::new(SlotPool::create().unwrap());
    owner
        .provision(rt(), Target::Host, (5, 4096), 2, false)
        .unwrap();
    assert_eq!((owner.usable(), owner.free_slots()), (2, 2));
    let worker = Arc::new(SlotPool::attach(&owner.path()).unwrap());
    let a = worker.acquire(Duration::ZERO).unwrap();
    let b = worker.acquire(Duration::ZERO).unwrap();
    assert_eq!(owner.geometry().0, 5);
    assert!(worker.slot_ptr(4).is_err(), "slot 4 is not made yet");
    let stop = Arc::new(AtomicBool::new(false));
    let (o, st) = (owner.clone(), stop.clone());
    let grower = std::thread::spawn(move || {
        while o.wait_grow(&st) {
            let usable = o.grow(2).unwrap();
            o.grown(usable < 5);
        }
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
    grower.join().unwrap();
    // Each growth is a part (a region) of its own: 2 + 2 + 1 slots.
    let parts: Vec<(usize, usize)> = owner
        .parts
        .lock()
        .unwrap()
        .iter()
        .map(|p| (p.from, p.to))
        .collect();
    assert_eq!(parts, vec![(0, 2), (2, 4), (4, 5)]);
}

#[test]
fn the_pool_is_counted_in_its_nodes_budget_until_dropped() {
    let own = own_rt();
    let shared = || shared_bytes(&own);
    assert_eq!(shared(), 0);
    let p = SlotPool::create().unwrap();
    p.provision(&own, Target::Host, (5, 4096), 3, false)
        .unwrap();
    let node = p.node().unwrap();
    assert_eq!(
        shared(),
        3 * SLOT_GRANULE as u64,
        "the slots made, not the bound"
    );
    let s = own.stats().into_iter().find(|s| s.node == node).unwrap();
    assert_eq!(s.shared_regions, 1);
    assert_eq!(s.regions, 0, "no buffer region");
    drop(p);
    assert_eq!(shared(), 0);
    assert_eq!(own.trim(), 0);
}

#[test]
fn a_waiter_wakes_when_another_process_releases() {
    let p = pool(1);
    let s = p.acquire(Duration::ZERO).unwrap();
    let other = Arc::new(SlotPool::attach(&p.path()).unwrap());
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
    let l1 = SlotLease::new(p.clone(), s).unwrap();
    let l2 = SlotLease::new(p.clone(), s).unwrap();
    assert!(SlotLease::new(p.clone(), 4).is_err(), "no slot 4");
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
    let _old = p.acquire(Duration::ZERO).unwrap(); // a drained batch
    let held = p.acquire(Duration::ZERO).unwrap();
    let lease = SlotLease::new(p.clone(), held).unwrap(); // the consumer's
    let g = p.begin_generation();
    let filling = p.acquire(Duration::ZERO).unwrap(); // a new-epoch worker
    assert_eq!(p.reclaim_before(g), 1);
    assert_eq!(p.free_slots(), 2, "old came back; held and filling did not");
    assert_ne!(p.acquire(Duration::ZERO), Some(filling));
    drop(lease);
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
    let w = SlotPool::attach(&p.path()).unwrap();
    let ptr = w.slot_ptr(1).unwrap();
    // SAFETY: slot 1 is 2 MiB of the shared mapping.
    unsafe { std::ptr::write_bytes(ptr, 9, MIB) };
    let main = p.slot_ptr(1).unwrap();
    // SAFETY: the same slot through the main process's part.
    assert_eq!(unsafe { *main.add(MIB - 1) }, 9);
    assert!(SlotPool::attach(std::path::Path::new("/proc/self/status")).is_err());
    assert!(SlotPool::attach(std::path::Path::new("/nonexistent")).is_err());
}
