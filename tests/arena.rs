//! Pinned arenas on this machine: placement, locking, DONTFORK, limits,
//! failure clean-up, budget, concurrency, and (ignored) CUDA.
//!
//! Tests here measure VmLck of the whole process, so they take one lock
//! and run one at a time. Tests that need a fresh process (another user,
//! another memlock limit, a seccomp filter, a memory cgroup) re-run this
//! test binary as a child (`common::run_child`); those child tests are
//! `#[ignore]`d and do nothing unless `NUMAPIN_TEST_CHILD` names them.
// Test data: counts, sizes, indices and byte patterns far inside every type's range.
#![allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

mod common;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use numapin::internals::is_mapped;
use numapin::internals::last_mapped_addr;
use numapin::internals::locked_bytes;
use numapin::runtime::{AllocOptions, Runtime, RuntimeConfig, Target};
use numapin::runtime::{RuntimeError, Step};
use numapin::topology::{CudaMode, ProbeOptions, Topology};
use numapin::Error;

const MIB: usize = 1 << 20;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn topology() -> Topology {
    let opts = ProbeOptions::from_process().with_cuda(CudaMode::Off);
    Topology::probe(&opts).expect("probe this machine")
}

fn runtime(cfg: RuntimeConfig) -> Runtime {
    Runtime::new(topology(), cfg).expect("runtime")
}

fn small() -> RuntimeConfig {
    RuntimeConfig::default().with_region_bytes(16 * MIB)
}

/// The first node the runtime has an arena for.
fn first_node(rt: &Runtime) -> u32 {
    rt.stats().first().expect("a node with memory").node
}

fn arena_err(e: impl Into<Error>) -> RuntimeError {
    match e.into() {
        Error::Runtime(a) => a,
        other => panic!("expected an arena error, got {other}"),
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

use common::{as_nobody, assert_child_passed, in_child, run_child};

#[test]
fn region_is_on_its_node_and_locked() {
    let _g = serial();
    let rt = runtime(small());
    let node = first_node(&rt);
    let before = locked_bytes();
    let mut buf = rt.alloc(Target::HostNode(node), 5 * MIB + 123).unwrap();
    assert_eq!(buf.node(), node);
    assert_eq!(buf.len(), 5 * MIB + 123);
    assert_eq!(buf.as_ptr() as usize % 4096, 0);
    buf.fill(0xa5);
    let s = &rt.stats()[0];
    assert_eq!(s.regions, 1);
    assert_eq!(s.bytes_reserved, 16 * MIB as u64);
    assert_eq!(s.bytes_locked, 16 * MIB as u64);
    // Every 4 KiB page of the region was found on the node.
    assert_eq!(s.pages_on_node, (16 * MIB / 4096) as u64);
    assert_eq!(s.pages_off_node, 0);
    assert_eq!(s.bytes_in_use, (5 * MIB + 4096) as u64);
    assert_eq!(
        locked_bytes() - before,
        16 * MIB as u64,
        "VmLck grows by the region size"
    );
    drop(buf);
    assert_eq!(rt.stats()[0].bytes_in_use, 0);
    drop(rt);
    assert_eq!(
        locked_bytes(),
        before,
        "dropping the runtime unlocks everything"
    );
}

#[test]
fn registration_is_reported_as_skipped_without_a_driver() {
    let _g = serial();
    if numapin::gpu::available() {
        eprintln!("skipped: a CUDA driver is present (see the GPU tests)");
        return;
    }
    let rt = runtime(small());
    let buf = rt.alloc(Target::HostNode(first_node(&rt)), 4096).unwrap();
    assert!(!buf.is_registered());
    assert_eq!(buf.device_ptr(), None);
    let s = &rt.stats()[0];
    assert!(
        s.registration.starts_with("skipped: "),
        "{}",
        s.registration
    );
    assert_eq!(s.bytes_registered, 0);
}

#[test]
fn a_forked_child_does_not_inherit_arena_pages() {
    let _g = serial();
    let rt = runtime(small());
    let mut buf = rt
        .alloc(Target::HostNode(first_node(&rt)), 64 * 1024)
        .unwrap();
    buf.fill(7);
    let arena_page = buf.as_ptr() as usize;
    let heap = vec![1u8; 1 << 16];
    let heap_page = (heap.as_ptr() as usize).next_multiple_of(4096);
    assert!(is_mapped(arena_page) && is_mapped(heap_page));
    // SAFETY: the child makes only system calls (mincore, _exit) before it
    // exits, which is what is allowed after fork in a threaded process.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            // 0: as expected; 1: arena page mapped; 2: control failed.
            let code = if !is_mapped(heap_page) {
                2
            } else if is_mapped(arena_page) {
                1
            } else {
                0
            };
            // SAFETY: leaves the child at once, running no destructors.
            unsafe { libc::_exit(code) };
        }
        nix::unistd::ForkResult::Parent { child } => {
            let status = nix::sys::wait::waitpid(child, None).unwrap();
            assert_eq!(
                status,
                nix::sys::wait::WaitStatus::Exited(child, 0),
                "1 = the child sees the arena's pages (MADV_DONTFORK missing), 2 = the control page is missing"
            );
        }
    }
    assert!(buf.iter().all(|&b| b == 7));
}

/// A forked child that drops an inherited region (a DataLoader worker's
/// garbage collector dropping the parent's pool, say) leaves alone what the
/// child itself has mapped since at those addresses: the region's pages are
/// `MADV_DONTFORK`, so the range is free in the child and may be reused.
#[test]
fn a_forked_child_dropping_an_inherited_region_keeps_its_own_mappings() {
    let _g = serial();
    let node = first_node(&runtime(small()));
    let r = Region::create(&region_options(node, 2 * MIB, node_cpus(node))).unwrap();
    let (addr, len) = (r.ptr() as usize, r.len());
    // SAFETY: the child makes only system calls (mmap, a write and a read
    // of its own mapping, munmap in the region's drop) before _exit.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            // SAFETY: a fresh mapping at addresses free in this child (the
            // region's pages did not come across the fork); nothing else
            // lives there.
            let p = unsafe {
                libc::mmap(
                    addr as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            // 3: the range was not free (the region came across the fork).
            let code = if p as usize != addr {
                3
            } else {
                drop(r);
                // 0: the child's own mapping is still there.
                i32::from(!is_mapped(addr))
            };
            // SAFETY: leaves the child at once, running no destructors.
            unsafe { libc::_exit(code) };
        }
        nix::unistd::ForkResult::Parent { child } => {
            let status = nix::sys::wait::waitpid(child, None).unwrap();
            assert_eq!(
                status,
                nix::sys::wait::WaitStatus::Exited(child, 0),
                "1 = the inherited region's drop unmapped the child's own memory, 3 = the region's range was mapped in the child"
            );
        }
    }
    drop(r);
}

/// Failure at every step of region creation leaves nothing locked or
/// mapped (and so nothing bound or registered).
#[test]
fn a_failed_region_leaves_nothing_behind() {
    let _g = serial();
    for step in [
        Step::Map,
        Step::Advise,
        Step::Bind,
        Step::Populate,
        Step::Lock,
        Step::Register,
        Step::Verify,
    ] {
        let mut cfg = small();
        numapin::internals::fail_after(&mut cfg, Some(step));
        let rt = runtime(cfg);
        let node = first_node(&rt);
        let before = locked_bytes();
        let e = arena_err(rt.alloc(Target::HostNode(node), MIB).unwrap_err());
        assert!(
            matches!(e, RuntimeError::System { step: s, .. } if s == step),
            "{step:?}: {e}"
        );
        assert_eq!(locked_bytes(), before, "{step:?}: VmLck unchanged");
        let addr = last_mapped_addr();
        assert_ne!(addr, 0);
        assert!(!is_mapped(addr), "{step:?}: the region is still mapped");
        let s = &rt.stats()[0];
        assert_eq!(
            (s.regions, s.bytes_reserved, s.failures, s.allocations),
            (0, 0, 1, 0),
            "{step:?}"
        );
    }
}

#[test]
fn unknown_node_and_gpu_are_input_errors() {
    let _g = serial();
    let rt = runtime(small());
    let e = arena_err(rt.alloc(Target::HostNode(999), 4096).unwrap_err());
    assert!(
        matches!(e, RuntimeError::UnknownNode { node: 999, .. }),
        "{e}"
    );
    assert_eq!(e.kind(), numapin::ErrorKind::Input);
    assert!(e.fix().is_some_and(|f| f.contains("numapin topo")));
    let e = rt
        .alloc(Target::Gpu(numapin::CudaOrdinal(999)), 4096)
        .unwrap_err();
    assert_eq!(e.kind(), numapin::ErrorKind::Input);
    assert!(matches!(
        arena_err(e),
        RuntimeError::UnknownGpu {
            gpu: numapin::CudaOrdinal(999),
            ..
        }
    ));
    let e = arena_err(rt.alloc(Target::HostNode(first_node(&rt)), 0).unwrap_err());
    assert!(matches!(e, RuntimeError::BadRequest { .. }), "{e}");
    let bad = Runtime::new(topology(), small().with_alignment(3000)).unwrap_err();
    assert_eq!(bad.kind(), numapin::ErrorKind::Input);
    assert!(bad.to_string().contains("alignment"), "{bad}");
}

#[test]
fn binding_to_a_node_without_memory_fails_cleanly() {
    let _g = serial();
    // A topology that claims a node the kernel does not have: mbind
    // refuses it, and nothing is left behind.
    let mut t = topology();
    let mut ghost = t.numa_nodes[0].clone();
    ghost.os_index = 1000;
    t.numa_nodes.push(ghost);
    let rt = Runtime::new(t, small()).unwrap();
    let before = locked_bytes();
    let e = arena_err(rt.alloc(Target::HostNode(1000), MIB).unwrap_err());
    assert!(
        matches!(e, RuntimeError::NoMemory { node: 1000, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("mbind"), "{e}");
    assert_eq!(locked_bytes(), before);
    assert!(!is_mapped(last_mapped_addr()));
}

#[test]
fn budget_is_enforced_and_waited_for() {
    let _g = serial();
    let rt = Arc::new(runtime(small().with_budget_bytes(Some(64 * MIB as u64))));
    let node = first_node(&rt);
    // 40 MiB > half a region: a region of its own size.
    let a = rt.alloc(Target::HostNode(node), 40 * MIB).unwrap();
    let b = rt.alloc(Target::HostNode(node), 16 * MIB).unwrap();
    assert_eq!(rt.stats()[0].bytes_reserved, 56 * MIB as u64);
    let e = arena_err(rt.alloc(Target::HostNode(node), 30 * MIB).unwrap_err());
    match e {
        RuntimeError::BudgetExceeded {
            node: n,
            requested,
            in_use,
            limit,
        } => {
            assert_eq!(
                (n, requested, in_use, limit),
                (node, 30 * MIB as u64, 56 * MIB as u64, 64 * MIB as u64)
            );
        }
        other => panic!("{other}"),
    }
    // Nothing frees: the wait ends at the timeout with the same error.
    let t = Instant::now();
    let e = arena_err(
        rt.alloc_with(
            Target::HostNode(node),
            30 * MIB,
            &AllocOptions::default().with_wait(Some(Duration::from_millis(100))),
        )
        .unwrap_err(),
    );
    assert!(matches!(e, RuntimeError::BudgetExceeded { .. }));
    assert!(t.elapsed() >= Duration::from_millis(100));
    // Another thread frees `a` a little later: the waiting allocation then
    // succeeds (the empty region is given back to make room).
    let freer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        drop(a);
    });
    let c = rt
        .alloc_with(
            Target::HostNode(node),
            30 * MIB,
            &AllocOptions::default().with_wait(Some(Duration::from_secs(10))),
        )
        .unwrap();
    freer.join().unwrap();
    assert_eq!(c.len(), 30 * MIB);
    let s = &rt.stats()[0];
    assert!(s.bytes_reserved <= 64 * MIB as u64);
    assert_eq!(s.failures, 2);
    drop((b, c));
}

/// `RuntimeConfig::budget_wait` is what `Runtime::alloc` waits; one call's
/// `AllocOptions::wait` overrides it, `Duration::ZERO` failing at once.
#[test]
fn a_call_can_refuse_the_configured_budget_wait() {
    let _g = serial();
    let cfg = small()
        .with_budget_bytes(Some(32 * MIB as u64))
        .with_budget_wait(Some(Duration::from_secs(600)));
    let rt = runtime(cfg);
    let node = first_node(&rt);
    let held = rt.alloc(Target::HostNode(node), 30 * MIB).unwrap();
    // Waiting 600 s would hang the test: the override must not wait.
    let e = arena_err(
        rt.alloc_with(
            Target::HostNode(node),
            30 * MIB,
            &AllocOptions::default().with_wait(Some(Duration::ZERO)),
        )
        .unwrap_err(),
    );
    assert!(matches!(e, RuntimeError::BudgetExceeded { .. }), "{e}");
    let e = arena_err(
        rt.alloc_with(
            Target::HostNode(node),
            30 * MIB,
            &AllocOptions::default()
                .with_staging(true)
                .with_wait(Some(Duration::ZERO)),
        )
        .unwrap_err(),
    );
    assert!(matches!(e, RuntimeError::BudgetExceeded { .. }), "{e}");
    assert_eq!(rt.stats()[0].failures, 2);
    drop(held);
}

/// `Target::Host` lends on the calling thread's node, as `Runtime::place`
/// says.
#[test]
fn a_host_target_lends_on_the_calling_threads_node() {
    let _g = serial();
    let rt = runtime(small());
    let node = first_node(&rt);
    let cpus = rt.place(Target::HostNode(node)).unwrap().cpus;
    let got = std::thread::scope(|s| {
        s.spawn(|| {
            // On the node's CPUs, so that the thread cannot move away.
            numapin::internals::set_thread_cpus(&cpus).unwrap();
            assert_eq!(rt.place(Target::Host).unwrap().node, node);
            rt.alloc(Target::Host, MIB).unwrap().node()
        })
        .join()
        .unwrap()
    });
    assert_eq!(got, node);
}

#[test]
fn a_request_larger_than_a_region_gets_a_dedicated_one() {
    let _g = serial();
    let rt = runtime(small());
    let node = first_node(&rt);
    let before = locked_bytes();
    let big = rt.alloc(Target::HostNode(node), 20 * MIB + 1).unwrap();
    assert_eq!(rt.stats()[0].bytes_reserved, 22 * MIB as u64);
    assert_eq!(locked_bytes() - before, 22 * MIB as u64);
    let first = big.as_ptr() as usize;
    drop(big);
    // The last dedicated region emptied is kept, and the next large
    // request reuses it instead of making one.
    assert_eq!(rt.stats()[0].regions, 1);
    let again = rt.alloc(Target::HostNode(node), 20 * MIB).unwrap();
    assert_eq!(again.as_ptr() as usize, first);
    assert_eq!(rt.stats()[0].regions, 1);
    // Two at once: when both are free, only the last one emptied stays.
    let other = rt.alloc(Target::HostNode(node), 30 * MIB).unwrap();
    assert_eq!(rt.stats()[0].regions, 2);
    drop(again);
    drop(other);
    let s = &rt.stats()[0];
    assert_eq!((s.regions, s.bytes_reserved), (1, 30 * MIB as u64));
    assert_eq!(locked_bytes() - before, 30 * MIB as u64);
    // A small request is served from the kept region (no new region), and
    // trim gives it back.
    drop(rt.alloc(Target::HostNode(node), MIB).unwrap());
    assert_eq!(rt.stats()[0].regions, 1);
    assert_eq!(rt.trim(), 0);
    assert_eq!(locked_bytes(), before);
}

#[test]
fn no_buffer_spans_the_halves_of_a_standard_region() {
    let _g = serial();
    // 16 MiB regions in halves of 8 MiB: 5 MiB buffers take one half each
    // (two per region); a region in one piece holds three.
    for (in_parts, regions) in [(true, 3), (false, 2)] {
        let rt = runtime(small().with_register_in_parts(in_parts));
        let node = first_node(&rt);
        let bufs: Vec<_> = (0..6)
            .map(|_| rt.alloc(Target::HostNode(node), 5 * MIB).unwrap())
            .collect();
        assert_eq!(rt.stats()[0].regions, regions, "in parts: {in_parts}");
        // Every page of every buffer is usable.
        for mut b in bufs {
            b.fill(0xA5);
            assert!(b.iter().all(|&x| x == 0xA5));
        }
        assert_eq!(rt.trim(), 0);
    }
    // A buffer over half a region still fits in a region (of its own).
    let rt = runtime(small());
    let node = first_node(&rt);
    let b = rt.alloc(Target::HostNode(node), 9 * MIB).unwrap();
    assert_eq!(b.len(), 9 * MIB);
    drop(b);
}

/// A standard region larger than two parts is made in parts of
/// `MAX_PART_BYTES`, not halves: no buffer spans a part boundary, a
/// request larger than a part goes to a region in one piece, and every
/// page is on the node and usable.
#[test]
fn a_large_standard_region_is_made_in_parts_no_buffer_spans() {
    let _g = serial();
    let part = numapin::runtime::MAX_PART_BYTES as usize;
    let cfg = RuntimeConfig::default()
        .with_region_bytes(4 * part)
        .with_register_in_parts(true);
    let rt = runtime(cfg);
    let node = first_node(&rt);
    // 3/4 of a part each: one per part (two would fit in one piece).
    let each = part / 4 * 3;
    let bufs: Vec<_> = (0..4)
        .map(|_| rt.alloc(Target::HostNode(node), each).unwrap())
        .collect();
    let s = node_stats(&rt);
    assert_eq!(s.regions, 1, "{s:?}");
    assert_eq!(s.pages_on_node, (4 * part / 4096) as u64, "{s:?}");
    let mut starts: Vec<usize> = bufs.iter().map(|b| b.as_ptr() as usize).collect();
    starts.sort_unstable();
    // Each buffer starts a part of its own (a part is one free block, cut
    // from its start) and, smaller than a part, ends inside it.
    for (i, &a) in starts.iter().enumerate() {
        assert_eq!(a - starts[0], i * part, "buffer {i} does not start a part");
    }
    // Larger than a part: a region of its own (in one piece).
    let big = rt.alloc(Target::HostNode(node), part + 4096).unwrap();
    assert_eq!(node_stats(&rt).regions, 2);
    for mut b in bufs.into_iter().chain(std::iter::once(big)) {
        b.fill(0x5A);
        assert!(b.iter().all(|&x| x == 0x5A));
    }
    assert_eq!(rt.trim(), 0);
}

#[test]
fn typed_views_share_the_bytes() {
    let _g = serial();
    let rt = runtime(small());
    let mut buf = rt
        .alloc(Target::HostNode(first_node(&rt)), 4096 + 6)
        .unwrap();
    assert_eq!(buf.capacity(), 8192);
    buf.as_mut_slice_of::<u32>()
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = i as u32);
    assert_eq!(buf.as_slice_of::<u32>().len(), 1025);
    assert_eq!(buf.as_slice_of::<f64>().len(), 512);
    assert_eq!(&buf[4..8], &1u32.to_ne_bytes());
}

/// Many threads allocating and freeing random sizes, each buffer filled
/// with its own pattern and checked before it is freed: any overlap
/// between live buffers shows as a wrong byte.
#[test]
fn concurrent_stress_keeps_buffers_apart() {
    let _g = serial();
    let rt = Arc::new(runtime(
        RuntimeConfig::default().with_region_bytes(32 * MIB),
    ));
    let node = first_node(&rt);
    let threads = 8;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let rt = rt.clone();
            std::thread::spawn(move || {
                let mut rng = numapin::measure::arena::Rng::new(t + 100);
                let mut live: Vec<(numapin::PinnedBuf, u8)> = Vec::new();
                for i in 0..3000u32 {
                    if live.len() > 12 || (!live.is_empty() && rng.next_u64() % 3 == 0) {
                        let (buf, tag) = live.swap_remove(rng.next_u64() as usize % live.len());
                        assert!(
                            buf.iter().all(|&b| b == tag),
                            "thread {t}: buffer overwritten"
                        );
                        drop(buf);
                    }
                    let size = match rng.next_u64() % 10 {
                        0 => 1 + (rng.next_u64() % (3 * MIB as u64)) as usize,
                        _ => 1 + (rng.next_u64() % (64 << 10)) as usize,
                    };
                    let mut buf = rt.alloc(Target::HostNode(node), size).unwrap();
                    let tag = (t as u32 * 31 + i) as u8;
                    buf.fill(tag);
                    live.push((buf, tag));
                }
                for (buf, tag) in live {
                    assert!(buf.iter().all(|&b| b == tag));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = &rt.stats()[0];
    assert_eq!(s.bytes_in_use, 0);
    assert_eq!(s.allocations, s.frees);
    assert_eq!(s.allocations, threads * 3000);
    assert!(s.bytes_peak > 0 && s.bytes_peak <= s.bytes_reserved);
}

#[test]
fn runtime_is_send_sync_and_buffers_send() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Runtime>();
    send_sync::<Arc<Runtime>>();
    send::<numapin::PinnedBuf>();
}

/// As user `nobody` with an 8 MiB memlock limit: a 64 MiB request fails
/// with the memlock error and its fixes, and VmLck stays unchanged.
#[test]
fn unprivileged_memlock_limit_gives_a_clear_error() {
    let _g = serial();
    run_as_nobody("child_unprivileged", &[], 8 << 20);
}

/// Runs child test `name` as user `nobody` with RLIMIT_MEMLOCK `memlock`
/// and asserts that it passed (skipped with a message unless root).
fn run_as_nobody(name: &str, env: &[(&str, &str)], memlock: u64) {
    if !is_root() {
        common::skip(
            common::Need::Root,
            "needs root to run a child as user nobody",
        );
        return;
    }
    if let Some(out) = run_child(name, env, as_nobody(memlock)) {
        assert_child_passed(&out);
    }
}

/// [`in_child`], and then the memlock limit is `memlock` and CAP_IPC_LOCK
/// is gone.
fn in_child_with_memlock(name: &str, memlock: u64) -> bool {
    if !in_child(name) {
        return false;
    }
    let security = numapin::system::SecurityStatus::read_self();
    assert_ne!(security.has_cap(numapin::system::CAP_IPC_LOCK), Some(true));
    assert_eq!(numapin::system::MemlockLimit::read().unwrap().soft, memlock);
    true
}

#[test]
#[ignore = "runs in a child process as user nobody: started by unprivileged_memlock_limit_gives_a_clear_error"]
fn child_unprivileged() {
    if !in_child_with_memlock("child_unprivileged", 8 << 20) {
        return;
    }
    let rt = runtime(small());
    let node = first_node(&rt);
    let before = locked_bytes();
    // Checked before anything is mapped.
    let e = arena_err(rt.alloc(Target::HostNode(node), 64 * MIB).unwrap_err());
    let msg = format!(
        "{}\n  fix: {}",
        numapin::error::with_causes(&e),
        e.fix().unwrap()
    );
    println!("{msg}");
    assert!(
        matches!(e, RuntimeError::Memlock { node: n, limit, source: None, .. } if n == node && limit == 8 << 20),
        "{e}"
    );
    for fix in [
        "ulimit -l",
        "LimitMEMLOCK=",
        "--ulimit memlock=-1",
        "RLIMIT_MEMLOCK is 8 MiB",
        "64 MiB",
    ] {
        assert!(msg.contains(fix), "message lacks {fix:?}: {msg}");
    }
    assert_ne!(e.kind(), numapin::ErrorKind::Input);
    assert_eq!(locked_bytes(), before);
    assert_eq!(rt.stats()[0].failures, 1);
    assert_eq!(rt.stats()[0].bytes_reserved, 0);

    // Within the limit it works: one 4 MiB region.
    let rt4 = runtime(RuntimeConfig::default().with_region_bytes(4 * MIB));
    let buf = rt4.alloc(Target::HostNode(node), MIB).unwrap();
    assert_eq!(locked_bytes() - before, 4 * MIB as u64);
    drop(buf);
    drop(rt4);
    assert_eq!(locked_bytes(), before);

    // mlock itself failing (the check skipped) is the same error, with the
    // system's reason, and the region is gone: for a region in one piece
    // (64 MiB, its own) and for a standard region made in halves (5 MiB in
    // a 16 MiB region, locked up front with MLOCK_ONFAULT).
    for (in_parts, bytes) in [(false, 64 * MIB), (true, 5 * MIB)] {
        let mut cfg = small().with_register_in_parts(in_parts);
        numapin::internals::skip_memlock_check(&mut cfg, true);
        let rt = runtime(cfg);
        let e = arena_err(rt.alloc(Target::HostNode(node), bytes).unwrap_err());
        println!("in parts: {in_parts}: {e}");
        assert!(
            matches!(
                e,
                RuntimeError::Memlock {
                    source: Some(_),
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(locked_bytes(), before);
        assert!(
            !is_mapped(last_mapped_addr()),
            "the failed region is still mapped (in parts: {in_parts})"
        );
    }
}

// ---- Where users run: seccomp filters, low memlock limits, cgroups ----

use numapin::region::{Region, RegionOptions};
use numapin::runtime::{HugePages, OffNode, PageKind, PinnedBy, PlacedBy, VerifiedBy};

fn region_options(node: u32, size: usize, cpus: numapin::CpuList) -> RegionOptions {
    RegionOptions {
        node,
        size,
        cpus,
        populate_threads: 2,
        register: false,
        off_node: OffNode::Strict,
        pin_by_registration: None,
        backend: numapin::runtime::Backend::Mapped,
        huge_pages: HugePages::Transparent,
        register_part_bytes: 0,
        pool_root: None,
        shared: None,
        fail_after: None,
    }
}

/// The CPUs of `node` this process may use.
fn node_cpus(node: u32) -> numapin::CpuList {
    let t = topology();
    let n = t.node(node).expect("the node");
    n.cpus.intersection(&t.allowed.cpus)
}

/// Two regions made one after the other are VMAs of their own (the guard
/// pages keep the kernel from merging them), so numa_maps counts them
/// exactly, and the counts agree with move_pages page by page.
#[test]
fn regions_are_vmas_of_their_own_and_numa_maps_agrees_with_move_pages() {
    let _g = serial();
    let rt = runtime(small());
    let node = first_node(&rt);
    let opts = region_options(node, 8 * MIB, node_cpus(node));
    let a = Region::create(&opts).unwrap();
    let b = Region::create(&opts).unwrap();
    for r in [&a, &b] {
        let start = r.ptr() as u64;
        let p = numapin::internals::numa_maps_of(start, start + r.len() as u64).unwrap();
        assert_eq!(p.straddling, 0, "merged with a neighbour: {p:?}");
        let counts = r.count_pages().unwrap();
        assert_eq!(counts.by, VerifiedBy::MovePages);
        let from_maps: Vec<(u32, u64)> = p
            .exact_nodes
            .unwrap()
            .into_iter()
            .map(|(n, b)| (n, b / 4096))
            .collect();
        assert_eq!(from_maps, counts.nodes);
        assert_eq!(counts.on(node), (8 * MIB / 4096) as u64);
        assert_eq!(
            r.methods(),
            numapin::runtime::RegionMethods {
                placed: PlacedBy::Mbind,
                pinned: PinnedBy::Mlock,
                verified: VerifiedBy::MovePages,
                pages: if numapin::region::thp_enabled() {
                    PageKind::Transparent
                } else {
                    PageKind::Base
                },
            }
        );
        assert!(r.notes().is_empty(), "{:?}", r.notes());
    }
}

/// The filter a `child_under_filter` run gets (`NUMAPIN_FILTER`): Docker's
/// default profile (all six calls, EPERM), the same answering ENOSYS, or
/// Docker's default with CAP_SYS_NICE (only move_pages and migrate_pages).
fn filter_for(kind: &str) -> Vec<libc::sock_filter> {
    use common::seccomp::{build_filter, docker_default, NUMA_CALLS};
    match kind {
        "enosys" => {
            let all: Vec<&str> = NUMA_CALLS.iter().map(|c| c.0).collect();
            build_filter(&all, libc::ENOSYS as u32)
        }
        "sys_nice" => build_filter(&["move_pages", "migrate_pages"], libc::EPERM as u32),
        _ => docker_default(),
    }
}

/// Under a seccomp filter that refuses the NUMA calls, regions on this
/// machine's node are placed by first touch (or still bound, where only
/// move_pages is refused) and verified through numa_maps, and the stats
/// say so.
#[test]
fn regions_under_a_seccomp_filter_fall_back_and_say_so() {
    let _g = serial();
    for kind in ["eperm", "enosys", "sys_nice"] {
        let prog = filter_for(kind);
        let Some(out) = run_child(
            "child_under_filter",
            &[("NUMAPIN_FILTER", kind)],
            move || common::seccomp::install(&prog),
        ) else {
            return;
        };
        assert_child_passed(&out);
    }
}

#[test]
#[ignore = "runs in a child process under a seccomp filter: started by regions_under_a_seccomp_filter_fall_back_and_say_so"]
fn child_under_filter() {
    if !in_child("child_under_filter") {
        return;
    }
    let kind = std::env::var("NUMAPIN_FILTER").unwrap();
    assert_eq!(
        numapin::internals::proc_status_field("Seccomp").as_deref(),
        Some("2")
    );
    let (placed, errno) = match kind.as_str() {
        "enosys" => (PlacedBy::FirstTouch, "ENOSYS"),
        "sys_nice" => (PlacedBy::Mbind, "EPERM"),
        _ => (PlacedBy::FirstTouch, "EPERM"),
    };
    let before = locked_bytes();
    let node = filtered_regions_say_how_they_were_placed(&kind, placed, errno);
    assert_eq!(locked_bytes(), before, "everything unlocked");
    filtered_region_in_halves_is_counted_the_same(node, placed);
    assert_eq!(locked_bytes(), before, "the region in halves unlocked");
    filtered_region_on_its_own_keeps_the_placement_policy(node, placed);
    if placed == PlacedBy::FirstTouch {
        first_touch_from_a_missing_cpu_is_an_error(node);
    }
}

/// Under the filter `kind`: two regions on this machine's node (a standard
/// one and one of a 12 MiB buffer's own), placed as `placed` says and
/// verified through numa_maps, the stats saying so (refused with `errno`).
/// Returns the node.
fn filtered_regions_say_how_they_were_placed(kind: &str, placed: PlacedBy, errno: &str) -> u32 {
    let rt = runtime(small());
    let node = first_node(&rt);
    let mut a = rt.alloc(Target::HostNode(node), 5 * MIB).unwrap();
    let mut b = rt.alloc(Target::HostNode(node), 12 * MIB).unwrap();
    a.fill(1);
    b.fill(2);
    let s = node_stats(&rt);
    println!("{kind}: {}; {:?}", s.methods(), s.method_notes);
    let first_touch = u64::from(placed == PlacedBy::FirstTouch);
    assert_eq!(s.regions, 2, "{s:?}");
    assert_eq!(
        (s.regions_first_touch, s.regions_bound),
        (2 * first_touch, 2 - 2 * first_touch),
        "{s:?}"
    );
    assert_eq!(s.regions_verified_numa_maps, 2, "{s:?}");
    assert_eq!(
        (s.regions_mlocked, s.bytes_locked),
        (2, 28 * MIB as u64),
        "{s:?}"
    );
    assert_eq!(s.pages_on_node, (28 * MIB / 4096) as u64, "{s:?}");
    assert_eq!(s.pages_off_node, 0, "{s:?}");
    assert!(
        s.methods()
            .contains("verified through /proc/self/numa_maps"),
        "{}",
        s.methods()
    );
    if placed == PlacedBy::FirstTouch {
        let note = format!(
            "mbind refused ({errno}): touched first from CPUs {}",
            node_cpus(node)
        );
        assert_eq!(s.method_notes, [note], "{s:?}");
    } else {
        assert!(s.method_notes.is_empty(), "{s:?}");
    }
    drop((a, b));
    drop(rt);
    node
}

/// A standard region made in halves, placed and counted the same way (the
/// per-part move_pages count refused, numa_maps after).
fn filtered_region_in_halves_is_counted_the_same(node: u32, placed: PlacedBy) {
    let first_touch = u64::from(placed == PlacedBy::FirstTouch);
    let rt = runtime(small().with_register_in_parts(true));
    let mut a = rt.alloc(Target::HostNode(node), 5 * MIB).unwrap();
    a.fill(3);
    let s = node_stats(&rt);
    assert_eq!(
        (
            s.regions,
            s.regions_first_touch,
            s.regions_verified_numa_maps
        ),
        (1, first_touch, 1),
        "{s:?}"
    );
    assert_eq!(
        (s.bytes_locked, s.pages_off_node),
        (16 * MIB as u64, 0),
        "{s:?}"
    );
    assert_eq!(s.pages_on_node, (16 * MIB / 4096) as u64, "{s:?}");
    drop(a);
    drop(rt);
}

/// A region on its own: each is its own VMAs, with the policy the
/// placement left (first touch: none of its own).
fn filtered_region_on_its_own_keeps_the_placement_policy(node: u32, placed: PlacedBy) {
    let r = Region::create(&region_options(node, 4 * MIB, node_cpus(node))).unwrap();
    let start = r.ptr() as u64;
    let p = numapin::internals::numa_maps_of(start, start + r.len() as u64).unwrap();
    assert_eq!((p.straddling, p.exact_nodes.is_some()), (0, true), "{p:?}");
    let policy = numapin::internals::numa_maps_line(start)
        .unwrap()
        .policy
        .unwrap();
    let expect = if placed == PlacedBy::Mbind {
        format!("bind:{node}")
    } else {
        "default".to_string()
    };
    assert_eq!(policy, expect);
    assert_eq!(r.count_pages().unwrap().by, VerifiedBy::NumaMaps);
    let mapped = r.ptr() as usize;
    drop(r);
    assert!(!is_mapped(mapped), "the region and its guards are unmapped");
    assert!(!is_mapped(mapped - 4096), "the front guard is unmapped");
}

/// First touch needs its threads bound: a CPU that is not there is an
/// error, and nothing stays mapped.
fn first_touch_from_a_missing_cpu_is_an_error(node: u32) {
    let bad = numapin::CpuList::from_iter_unsorted([4000]);
    let e = Region::create(&region_options(node, 2 * MIB, bad)).unwrap_err();
    let msg = numapin::error::with_causes(&e);
    assert!(
        matches!(
            e,
            RuntimeError::System {
                step: Step::Populate,
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("binding a first-touch thread to CPUs 4000"),
        "{msg}"
    );
    assert!(!is_mapped(last_mapped_addr()));
}

/// As user `nobody` with a 64 KiB memlock limit (Docker's default) and no
/// CUDA driver: nothing else would pin the pages, so the clear memlock
/// error, before anything is mapped.
#[test]
fn nobody_with_a_64_kib_memlock_limit_and_no_cuda_gets_the_memlock_error() {
    let _g = serial();
    run_as_nobody("child_nobody_64k", &[("NUMAPIN_NO_CUDA", "1")], 64 << 10);
}

#[test]
#[ignore = "runs in a child process as user nobody: started by nobody_with_a_64_kib_memlock_limit_and_no_cuda_gets_the_memlock_error"]
fn child_nobody_64k() {
    if !in_child_with_memlock("child_nobody_64k", 64 << 10) {
        return;
    }
    assert!(!numapin::gpu::available());
    let rt = runtime(small());
    let node = first_node(&rt);
    let mapped_before = last_mapped_addr();
    let e = arena_err(rt.alloc(Target::HostNode(node), MIB).unwrap_err());
    let msg = format!(
        "{}\n  fix: {}",
        numapin::error::with_causes(&e),
        e.fix().unwrap()
    );
    println!("{msg}");
    assert!(
        matches!(e, RuntimeError::Memlock { limit, source: None, .. } if limit == 64 << 10),
        "{msg}"
    );
    for part in [
        "RLIMIT_MEMLOCK is 64 KiB",
        "ulimit -l",
        "--ulimit memlock=-1",
    ] {
        assert!(msg.contains(part), "{part}: {msg}");
    }
    assert_eq!(last_mapped_addr(), mapped_before, "nothing was mapped");
    assert_eq!(node_stats(&rt).regions, 0);
}

/// A memory cgroup limit caps the default budget at half of it (the
/// default fraction), and the error says where the cap comes from; an
/// explicit budget is taken as given.
#[test]
fn a_memory_cgroup_limit_caps_the_default_budget() {
    let _g = serial();
    let root = common::cgroup_v2_root(64 * MIB as u64);
    let mut cfg = small();
    numapin::internals::cgroup_root(&mut cfg, Some(root.path().to_path_buf()));
    let rt = runtime(cfg.clone());
    let node = first_node(&rt);
    assert_eq!(node_stats(&rt).budget, 32 * MIB as u64);
    let a = rt.alloc(Target::HostNode(node), 16 * MIB).unwrap();
    let b = rt.alloc(Target::HostNode(node), 16 * MIB).unwrap();
    let e = arena_err(rt.alloc(Target::HostNode(node), 2 * MIB).unwrap_err());
    let msg = numapin::error::with_causes(&e);
    assert!(
        matches!(e, RuntimeError::CgroupBudget { limit, in_use, .. } if limit == 32 * MIB as u64 && in_use == limit),
        "{msg}"
    );
    assert!(msg.contains("memory.max"), "{msg}");
    assert_eq!(e.kind(), numapin::ErrorKind::Budget);
    assert!(e.fix().unwrap().contains("docker run --memory"));
    // Freed room is room again.
    drop(a);
    assert_eq!(rt.trim(), 16 * MIB as u64);
    drop(rt.alloc(Target::HostNode(node), 8 * MIB).unwrap());
    drop((b, rt));
    // budget_bytes set: the cgroup is not consulted.
    let rt = runtime(cfg.with_budget_bytes(Some(48 * MIB as u64)));
    assert_eq!(node_stats(&rt).budget, 48 * MIB as u64);
    // No limit: half the node's memory.
    let t = topology();
    let half = t.node(node).unwrap().memory_bytes / 2;
    let mut cfg = small();
    numapin::internals::cgroup_root(&mut cfg, Some("/nonexistent-root".into()));
    assert_eq!(node_stats(&runtime(cfg)).budget, half);
}

/// A memory cgroup this test makes (v1 `memory.limit_in_bytes` or v2
/// `memory.max`), removed on drop.
struct TestCgroup(std::path::PathBuf);

impl TestCgroup {
    /// A cgroup limited to `limit` bytes, or why one cannot be made here.
    fn new(limit: u64) -> Result<TestCgroup, String> {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| e.to_string())?;
        let name = format!("numapin-test-{}", std::process::id());
        for l in mounts.lines() {
            let Some((pre, post)) = l.split_once(" - ") else {
                continue;
            };
            let point = std::path::PathBuf::from(pre.split(' ').nth(4).unwrap_or(""));
            let mut post = post.split(' ');
            let (fstype, opts) = (post.next().unwrap_or(""), post.nth(1).unwrap_or(""));
            let file = match fstype {
                "cgroup" if opts.split(',').any(|o| o == "memory") => "memory.limit_in_bytes",
                "cgroup2"
                    if std::fs::read_to_string(point.join("cgroup.subtree_control"))
                        .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory")) =>
                {
                    "memory.max"
                }
                _ => continue,
            };
            let dir = point.join(&name);
            std::fs::create_dir(&dir)
                .map_err(|e| format!("{} is not writable: {e}", point.display()))?;
            let cg = TestCgroup(dir);
            std::fs::write(cg.0.join(file), limit.to_string())
                .map_err(|e| format!("cannot set {file}: {e}"))?;
            return Ok(cg);
        }
        Err("no memory cgroup hierarchy (v1 memory controller, or v2 with memory in the root's subtree_control)".into())
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir(&self.0) {
            eprintln!("cannot remove {}: {e}", self.0.display());
        }
    }
}

/// In a real memory cgroup of 256 MiB (where the hierarchy is writable):
/// the budget is half of it, and pinning up to it works while the next
/// region is refused with the cgroup's error, instead of the OOM killer
/// ending the process. The child runs in the cgroup; this process does not.
#[test]
fn a_real_memory_cgroup_caps_what_is_pinned() {
    let _g = serial();
    let cg = match TestCgroup::new(256 * MIB as u64) {
        Ok(cg) => cg,
        Err(why) => {
            common::skip(
                common::Need::Kernel,
                &format!("cannot make a memory cgroup here: {why}"),
            );
            return;
        }
    };
    let procs = cg.0.join("cgroup.procs");
    let Some(out) = run_child(
        "child_in_memory_cgroup",
        // Without CUDA: a driver's context would take much of the 256 MiB.
        &[
            ("NUMAPIN_CGROUP_PROCS", procs.to_str().unwrap()),
            ("NUMAPIN_NO_CUDA", "1"),
        ],
        || Ok(()),
    ) else {
        return;
    };
    assert_child_passed(&out);
    drop(cg);
}

#[test]
#[ignore = "runs in a child process in a memory cgroup: started by a_real_memory_cgroup_caps_what_is_pinned"]
fn child_in_memory_cgroup() {
    if !in_child("child_in_memory_cgroup") {
        return;
    }
    let procs = std::env::var("NUMAPIN_CGROUP_PROCS").unwrap();
    std::fs::write(&procs, std::process::id().to_string()).unwrap();
    let limits = numapin::system::memory_limits();
    let t = limits.tightest().expect("the test cgroup's limit");
    assert_eq!(t.bytes, 256 * MIB as u64, "{limits:?}");
    let rt = runtime(RuntimeConfig::default().with_region_bytes(32 * MIB));
    let node = first_node(&rt);
    assert_eq!(node_stats(&rt).budget, 128 * MIB as u64);
    let bufs: Vec<_> = (0..4)
        .map(|_| {
            let mut b = rt.alloc(Target::HostNode(node), 32 * MIB).unwrap();
            b.fill(3);
            b
        })
        .collect();
    let e = arena_err(rt.alloc(Target::HostNode(node), 32 * MIB).unwrap_err());
    println!("{}", numapin::error::with_causes(&e));
    assert!(
        matches!(e, RuntimeError::CgroupBudget { limit, .. } if limit == 128 * MIB as u64),
        "{e}"
    );
    let usage = std::fs::read_to_string(std::path::Path::new(&procs).with_file_name(
        if t.kind.file() == "memory.max" {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        },
    ))
    .unwrap();
    let usage: u64 = usage.trim().parse().unwrap();
    println!("cgroup usage with 128 MiB pinned: {usage} bytes");
    assert!(
        usage >= 128 * MIB as u64 && usage < 256 * MIB as u64,
        "{usage}"
    );
    drop(bufs);
}

// ---- GPU tests: run with --ignored on a machine with a CUDA GPU. ----

fn gpu_runtime() -> Option<(Runtime, numapin::CudaOrdinal)> {
    if !numapin::gpu::available() {
        common::skip(common::Need::Gpu, "no CUDA driver");
        return None;
    }
    let t = Topology::probe(&ProbeOptions::from_process()).unwrap();
    let ordinal = t.gpus.iter().find_map(|g| g.cuda_ordinal)?;
    numapin::gpu::set_device(ordinal.get()).unwrap();
    Some((Runtime::new(t, RuntimeConfig::default()).unwrap(), ordinal))
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU machine"]
fn gpu_registration_agrees_with_the_driver() {
    let _g = serial();
    let Some((rt, gpu)) = gpu_runtime() else {
        return;
    };
    let buf = rt.alloc(Target::Gpu(gpu), 8 * MIB).unwrap();
    assert!(buf.is_registered());
    let flags = numapin::gpu::host_get_flags(buf.as_ptr().cast()).unwrap();
    assert_ne!(
        flags & numapin::gpu::HOST_REGISTER_PORTABLE,
        0,
        "flags {flags:#x}"
    );
    assert_eq!(
        numapin::gpu::host_device_pointer(buf.as_ptr().cast()).unwrap(),
        buf.device_ptr().unwrap()
    );
    let s = rt
        .stats()
        .into_iter()
        .find(|s| s.node == buf.node())
        .unwrap();
    assert_eq!(s.registration, "registered");
    assert_eq!(s.bytes_registered, s.bytes_reserved);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU machine"]
fn gpu_async_round_trip() {
    let _g = serial();
    let Some((rt, gpu)) = gpu_runtime() else {
        return;
    };
    let n = 16 * MIB;
    let stream = numapin::gpu::Stream::new().unwrap();
    let dev = numapin::gpu::DeviceBuffer::new(n).unwrap();
    let mut src = rt.alloc(Target::Gpu(gpu), n).unwrap();
    src.as_mut_slice_of::<u32>()
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = (i as u32).wrapping_mul(2654435761));
    let mut dst = rt.alloc(Target::Gpu(gpu), n).unwrap();
    dst.fill(0);
    // SAFETY: dev holds n bytes in the current context; neither buffer is
    // touched before the stream is synchronised.
    unsafe {
        src.copy_to_device_async(dev.ptr(), stream.raw()).unwrap();
        dst.copy_from_device_async(dev.ptr(), stream.raw()).unwrap();
    }
    let src_addr = src.as_ptr() as usize;
    // Dropped with its copy possibly in flight: deferred, not reused.
    drop(src);
    let other = rt.alloc(Target::Gpu(gpu), n).unwrap();
    if rt.stats().iter().any(|s| s.deferred > 0) {
        assert_ne!(
            other.as_ptr() as usize,
            src_addr,
            "memory reused while a copy may read it"
        );
    }
    stream.synchronize().unwrap();
    assert!(dst.copies_done());
    assert!(dst
        .as_slice_of::<u32>()
        .iter()
        .enumerate()
        .all(|(i, &x)| x == (i as u32).wrapping_mul(2654435761)));
    drop(other);
    assert_eq!(rt.reclaim(), 0);
    drop(dst);
    assert!(rt
        .stats()
        .iter()
        .all(|s| s.bytes_in_use == 0 && s.deferred == 0));
}

/// H2D rates of 256 MiB from an arena buffer on the GPU's node and from
/// `cuMemAllocHost` memory (`numapin::measure::copy`, timed with CUDA
/// events), each the best of three interleaved rounds of 10 copies (to
/// share any drift in clocks or link state): `(arena, driver)` in GB/s.
fn arena_and_driver_h2d(rt: &Runtime, gpu: numapin::CudaOrdinal) -> (f64, f64) {
    use numapin::measure::copy::{copy_gbps_from, Source};
    let n = 256 * MIB;
    let node = rt.node_for_gpu(gpu).unwrap();
    let best = |src| copy_gbps_from(rt, gpu, src, n, 1, 10).unwrap().0.max;
    let (mut arena_gbs, mut host_gbs) = (0.0f64, 0.0f64);
    for _ in 0..3 {
        arena_gbs = arena_gbs.max(best(Source::Arena(node)));
        host_gbs = host_gbs.max(best(Source::DriverPinned));
    }
    eprintln!(
        "H2D 256 MiB: arena {arena_gbs:.2} GB/s, cuMemAllocHost {host_gbs:.2} GB/s (node {node})"
    );
    (arena_gbs, host_gbs)
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU machine"]
fn gpu_h2d_bandwidth_matches_cuda_pinned_memory() {
    let _g = serial();
    let Some((rt, gpu)) = gpu_runtime() else {
        return;
    };
    let (arena_gbs, host_gbs) = arena_and_driver_h2d(&rt, gpu);
    assert!(
        arena_gbs >= 0.97 * host_gbs,
        "arena {arena_gbs:.2} GB/s vs cuMemAllocHost {host_gbs:.2} GB/s"
    );
}

/// As user `nobody` with a 64 KiB memlock limit (Docker's default) on a
/// GPU machine: regions are pinned by CUDA registration instead of mlock,
/// stay on their node, and copy at the rate the privileged run (this
/// process, same run) gets.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU machine (as root: the child runs as nobody)"]
fn gpu_registration_pins_regions_when_memlock_is_too_low() {
    let _g = serial();
    let Some((rt, gpu)) = gpu_runtime() else {
        return;
    };
    let (privileged, _) = arena_and_driver_h2d(&rt, gpu);
    drop(rt);
    let rate = privileged.to_string();
    run_as_nobody(
        "child_gpu_registration_pinned",
        &[("NUMAPIN_PRIVILEGED_GBS", &rate)],
        64 << 10,
    );
}

#[test]
#[ignore = "runs in a child process as user nobody: started by gpu_registration_pins_regions_when_memlock_is_too_low"]
fn child_gpu_registration_pinned() {
    if !in_child_with_memlock("child_gpu_registration_pinned", 64 << 10) {
        return;
    }
    let (rt, gpu) = gpu_runtime().expect("a GPU, as in the parent");
    let (arena_gbs, host_gbs) = arena_and_driver_h2d(&rt, gpu);
    let buf = rt.alloc(Target::Gpu(gpu), 64 * MIB).unwrap();
    assert!(buf.is_registered());
    let s = rt
        .stats()
        .into_iter()
        .find(|s| s.node == buf.node())
        .unwrap();
    assert!(s.regions >= 1, "{s:?}");
    assert_eq!(
        (
            s.regions_registration_pinned,
            s.regions_mlocked,
            s.bytes_locked
        ),
        (s.regions, 0, 0),
        "{s:?}"
    );
    assert_eq!(s.bytes_registered, s.bytes_reserved, "{s:?}");
    assert_eq!(locked_bytes(), 0, "nothing mlocked");
    assert!(
        s.method_notes
            .iter()
            .any(|n| n.contains("RLIMIT_MEMLOCK is 64 KiB")),
        "{s:?}"
    );
    // The pages stayed where they were put, after the copies.
    let mut elsewhere = 0usize;
    // SAFETY: the buffer's memory stays mapped for the call.
    elsewhere += numapin::internals::page_nodes(&buf)
        .unwrap()
        .iter()
        .filter(|&&n| n != buf.node() as i32)
        .count();
    assert_eq!(elsewhere, 0, "pages left node {}", buf.node());
    let privileged: f64 = std::env::var("NUMAPIN_PRIVILEGED_GBS")
        .unwrap()
        .parse()
        .unwrap();
    println!(
        "registration-pinned arena {arena_gbs:.2} GB/s, cuMemAllocHost {host_gbs:.2} GB/s, privileged arena {privileged:.2} GB/s"
    );
    assert!(
        arena_gbs >= 0.97 * host_gbs,
        "arena {arena_gbs:.2} vs cuMemAllocHost {host_gbs:.2} GB/s"
    );
    // Another process, a little later: a looser bound than in-process.
    assert!(
        arena_gbs >= 0.95 * privileged,
        "as nobody {arena_gbs:.2} GB/s vs privileged {privileged:.2} GB/s"
    );
}

// ---- Thread caches -------------------------------------------------------

use numapin::measure::arena::Rng;
use numapin::runtime::{CacheLimits, NodeStats};
use numapin::PinnedBuf;

fn with_cache(limits: CacheLimits) -> RuntimeConfig {
    small().with_thread_cache(limits)
}

fn node_stats(rt: &Runtime) -> NodeStats {
    rt.stats().into_iter().next().expect("a node with memory")
}

/// Bytes of the live buffers (what `bytes_in_use` must say).
fn capacity_of(live: &[(PinnedBuf, u8)]) -> u64 {
    live.iter().map(|(b, _)| b.capacity() as u64).sum()
}

fn fill(mut buf: PinnedBuf, tag: u8) -> (PinnedBuf, u8) {
    buf.fill(tag);
    (buf, tag)
}

fn check_tag((buf, tag): &(PinnedBuf, u8)) {
    assert!(
        buf.iter().all(|b| b == tag),
        "a buffer of {} bytes at {:p} was overwritten",
        buf.len(),
        buf.as_ptr()
    );
}

/// One thread allocating and freeing a dozen sizes (more than a cache has
/// bins, some over its block cap): the cache never holds more blocks or
/// bytes than its bounds, bytes in use are exactly the live buffers', and
/// it is used (hits) at all.
#[test]
fn a_thread_cache_stays_within_its_bounds() {
    let _g = serial();
    let lim = CacheLimits {
        max_blocks: 8,
        max_bytes: 256 << 10,
        max_block_bytes: 64 << 10,
    };
    let rt = runtime(with_cache(lim));
    let node = first_node(&rt);
    let mut rng = Rng::new(11);
    let mut live = Vec::new();
    let mut most_cached = 0;
    for round in 0..300u32 {
        for _ in 0..rng.next_u64() % 12 {
            // 20 sizes in 4 KiB steps: 4..80 KiB, 16 of them cached (more
            // than a cache has bins), the last four over the cap.
            let size = (1 + rng.next_u64() % 20) as usize * 4096 - (rng.next_u64() % 3000) as usize;
            let buf = rt.alloc(Target::HostNode(node), size).unwrap();
            live.push(fill(buf, round as u8));
        }
        let keep = (rng.next_u64() % 6) as usize;
        while live.len() > keep {
            let b = live.swap_remove(rng.next_u64() as usize % live.len());
            check_tag(&b);
            drop(b);
            let s = node_stats(&rt);
            assert!(s.blocks_cached <= 8, "{s:?}");
            assert!(s.bytes_cached <= 256 << 10, "{s:?}");
            assert_eq!(s.bytes_in_use, capacity_of(&live), "{s:?}");
            most_cached = most_cached.max(s.blocks_cached);
        }
    }
    live.iter().for_each(check_tag);
    drop(live);
    let s = node_stats(&rt);
    assert_eq!(s.bytes_in_use, 0);
    assert_eq!(s.allocations, s.frees);
    assert!(most_cached >= 4, "the cache was barely used: {most_cached}");
    assert!(s.cache_hits > s.allocations / 10, "{s:?}");
}

/// With the cache off, nothing is ever cached.
#[test]
fn a_cache_can_be_turned_off() {
    let _g = serial();
    let rt = runtime(with_cache(CacheLimits::off()));
    let node = first_node(&rt);
    for _ in 0..10 {
        drop(rt.alloc(Target::HostNode(node), 4096).unwrap());
    }
    let s = node_stats(&rt);
    assert_eq!((s.blocks_cached, s.cache_hits, s.frees), (0, 0, 10));
}

/// The loader's pattern: buffers allocated on one thread, dropped on
/// another. The freeing thread's cache stays bounded while it runs, and its
/// exit gives everything back.
#[test]
fn buffers_freed_on_another_thread_and_thread_exit() {
    let _g = serial();
    let lim = CacheLimits {
        max_blocks: 6,
        ..CacheLimits::default()
    };
    let rt = Arc::new(runtime(with_cache(lim)));
    let node = first_node(&rt);
    let (to_consumer, inbox) = std::sync::mpsc::channel::<Option<(PinnedBuf, u8)>>();
    let (to_main, from_consumer) = std::sync::mpsc::channel::<()>();
    let consumer = {
        let rt = rt.clone();
        std::thread::spawn(move || {
            while let Some(b) = inbox.recv().unwrap() {
                check_tag(&b);
                drop(b);
                let s = node_stats(&rt);
                assert!(s.blocks_cached <= 6, "{s:?}");
                to_main.send(()).unwrap();
            }
            // Parked with a full cache until told to go.
            assert!(node_stats(&rt).blocks_cached > 0);
            to_main.send(()).unwrap();
            assert!(inbox.recv().unwrap().is_none());
        })
    };
    for i in 0..100u32 {
        let buf = rt.alloc(Target::HostNode(node), 64 << 10).unwrap();
        to_consumer.send(Some(fill(buf, i as u8))).unwrap();
        from_consumer.recv().unwrap();
    }
    to_consumer.send(None).unwrap();
    from_consumer.recv().unwrap();
    let s = node_stats(&rt);
    assert!((1..=6).contains(&s.blocks_cached), "{s:?}");
    assert_eq!(s.bytes_in_use, 0);
    assert_eq!(s.bytes_cached, s.blocks_cached * (64 << 10));
    // This thread's cache is empty: none of them is its.
    assert_eq!(numapin::internals::flush_thread_cache(&rt, node), 0);
    to_consumer.send(None).unwrap();
    consumer.join().unwrap();
    let s = node_stats(&rt);
    assert_eq!((s.blocks_cached, s.bytes_cached, s.bytes_in_use), (0, 0, 0));
    assert_eq!((s.allocations, s.frees), (100, 100));
    assert_eq!(rt.trim(), 0, "no block is left in the region");
}

/// flush_thread_cache gives back the caller's blocks; trim gives back every
/// thread's, even one that is alive and idle, then the empty region.
#[test]
fn flush_and_trim_return_cached_blocks() {
    let _g = serial();
    let rt = Arc::new(runtime(small()));
    let node = first_node(&rt);
    let bufs: Vec<_> = (0..5)
        .map(|_| rt.alloc(Target::HostNode(node), 8192).unwrap())
        .collect();
    drop(bufs);
    assert_eq!(node_stats(&rt).blocks_cached, 5);
    assert_eq!(numapin::internals::flush_thread_cache(&rt, node), 5);
    let s = node_stats(&rt);
    assert_eq!((s.blocks_cached, s.bytes_cached, s.bytes_in_use), (0, 0, 0));
    // Reused from the cache: the same block again.
    let a = rt.alloc(Target::HostNode(node), 8192).unwrap();
    let p = a.as_ptr();
    drop(a);
    let b = rt.alloc(Target::HostNode(node), 8000).unwrap();
    assert_eq!(b.as_ptr(), p);
    assert_eq!(node_stats(&rt).cache_hits, 1);
    drop(b);
    // Another thread caches blocks and stays alive.
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (done, cached) = std::sync::mpsc::channel::<()>();
    let other = {
        let rt = rt.clone();
        std::thread::spawn(move || {
            let bufs: Vec<_> = (0..3)
                .map(|_| rt.alloc(Target::HostNode(node), 1 << 20).unwrap())
                .collect();
            drop(bufs);
            done.send(()).unwrap();
            wait.recv().unwrap();
            // Its cache was emptied under it; it still works.
            drop(rt.alloc(Target::HostNode(node), 1 << 20).unwrap());
        })
    };
    cached.recv().unwrap();
    let s = node_stats(&rt);
    assert_eq!(s.blocks_cached, 4, "{s:?}");
    assert_eq!(s.bytes_cached, 3 << 20 | 8192);
    assert_eq!(rt.trim(), 0, "every region given back");
    let s = node_stats(&rt);
    assert_eq!((s.blocks_cached, s.regions), (0, 0), "{s:?}");
    go.send(()).unwrap();
    other.join().unwrap();
    let s = node_stats(&rt);
    assert_eq!((s.bytes_in_use, s.blocks_cached), (0, 0));
    assert_eq!(s.allocations, s.frees);
}

/// The budget: blocks sitting in threads' caches (the allocating thread's
/// own, or another's) are given back before a request is refused or waits.
#[test]
fn budget_counts_on_cached_blocks() {
    let _g = serial();
    let rt = Arc::new(runtime(small().with_budget_bytes(Some(16 * MIB as u64))));
    let node = first_node(&rt);
    // The one region the budget allows, filled with 4 MiB buffers.
    let mut bufs: Vec<_> = (0..4)
        .map(|_| rt.alloc(Target::HostNode(node), 4 * MIB).unwrap())
        .collect();
    assert!(rt.alloc(Target::HostNode(node), 4096).is_err());
    // One goes to this thread's cache; a 3 MiB request (another size)
    // waits for the budget and is served from it.
    drop(bufs.pop());
    assert_eq!(node_stats(&rt).blocks_cached, 1);
    let c = rt
        .alloc_with(
            Target::HostNode(node),
            3 * MIB,
            &AllocOptions::default().with_wait(Some(Duration::from_secs(10))),
        )
        .unwrap();
    let s = node_stats(&rt);
    assert_eq!((s.blocks_cached, s.regions), (0, 1), "{s:?}");
    drop(c);
    drop(bufs.pop());
    // Without waiting, too.
    let d = rt.alloc(Target::HostNode(node), 6 * MIB).unwrap();
    // Another thread's cache: an idle thread caches a block, the request
    // is served at once.
    let b = bufs.pop().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        drop(b);
        tx.send(()).unwrap();
        wait.recv().unwrap();
    });
    rx.recv().unwrap();
    assert!(node_stats(&rt).blocks_cached >= 1);
    let e = rt.alloc(Target::HostNode(node), 3 * MIB).unwrap();
    go.send(()).unwrap();
    other.join().unwrap();
    // A free while a thread waits wakes it (not cached): the last 4 MiB
    // buffer is dropped by another thread while this one waits for 4 MiB
    // (no other hole is that large).
    let last = bufs.pop().unwrap();
    let freer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        drop(last);
    });
    let t = Instant::now();
    let f = rt
        .alloc_with(
            Target::HostNode(node),
            4 * MIB,
            &AllocOptions::default().with_wait(Some(Duration::from_secs(10))),
        )
        .unwrap();
    freer.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    drop((d, e, f));
    let s = node_stats(&rt);
    assert_eq!(s.bytes_in_use, 0);
    assert!(s.bytes_reserved <= 16 * MIB as u64);
}

/// Dropping the runtime frees its memory at once, even when an idle
/// thread still holds cached blocks of it.
#[test]
fn dropping_the_runtime_takes_back_every_cache() {
    let _g = serial();
    let before = locked_bytes();
    let rt = Arc::new(runtime(small()));
    let node = first_node(&rt);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let other = {
        let rt = rt.clone();
        std::thread::spawn(move || {
            let bufs: Vec<_> = (0..4)
                .map(|_| rt.alloc(Target::HostNode(node), 4096).unwrap())
                .collect();
            drop(bufs);
            drop(rt);
            tx.send(()).unwrap();
            wait.recv().unwrap();
        })
    };
    rx.recv().unwrap();
    assert_eq!(node_stats(&rt).blocks_cached, 4);
    drop(Arc::into_inner(rt).expect("the other thread dropped its handle"));
    assert_eq!(locked_bytes(), before, "the arena was freed");
    go.send(()).unwrap();
    other.join().unwrap();
}

/// Threads allocating a few sizes (so most come from caches), handing some
/// buffers to a neighbour to drop, while trims drain the caches under them:
/// no block is ever lent twice (a set of live addresses, and each buffer's
/// pattern checked before it is dropped), and the counts add up.
#[test]
fn concurrent_cache_stress_never_lends_a_block_twice() {
    let _g = serial();
    let lim = CacheLimits {
        max_blocks: 6,
        max_bytes: 512 << 10,
        max_block_bytes: 256 << 10,
    };
    let rt = Arc::new(runtime(with_cache(lim).with_region_bytes(32 * MIB)));
    let node = first_node(&rt);
    let live = Arc::new(Mutex::new(std::collections::HashSet::<usize>::new()));
    let threads = 6u64;
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..threads)
        .map(|_| std::sync::mpsc::channel::<(PinnedBuf, u8)>())
        .unzip();
    let handles: Vec<_> = receivers
        .into_iter()
        .enumerate()
        .map(|(t, inbox)| {
            let rt = rt.clone();
            let live = live.clone();
            let neighbour = senders[(t + 1) % threads as usize].clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(t as u64 + 7);
                let mut mine: Vec<(PinnedBuf, u8)> = Vec::new();
                let release = |b: (PinnedBuf, u8)| {
                    check_tag(&b);
                    assert!(live.lock().unwrap().remove(&(b.0.as_ptr() as usize)));
                    drop(b);
                };
                for i in 0..4000u32 {
                    while let Ok(b) = inbox.try_recv() {
                        release(b);
                    }
                    if mine.len() > 8 || (!mine.is_empty() && rng.next_u64() % 2 == 0) {
                        let b = mine.swap_remove(rng.next_u64() as usize % mine.len());
                        if rng.next_u64() % 4 == 0 {
                            check_tag(&b);
                            // The receiver may have exited: drop it here then.
                            if let Err(e) = neighbour.send(b) {
                                release(e.0);
                            }
                        } else {
                            release(b);
                        }
                    }
                    let size =
                        [4096, 8192, 60_000, 65_536, 200_000, 300_000][rng.next_u64() as usize % 6];
                    let buf = rt.alloc(Target::HostNode(node), size).unwrap();
                    assert!(
                        live.lock().unwrap().insert(buf.as_ptr() as usize),
                        "block {:p} lent twice",
                        buf.as_ptr()
                    );
                    mine.push(fill(buf, (t as u32 * 37 + i) as u8));
                    if t == 0 && i % 500 == 0 {
                        rt.trim();
                    }
                }
                drop(neighbour);
                mine.into_iter().for_each(&release);
                while let Ok(b) = inbox.recv() {
                    release(b);
                }
            })
        })
        .collect();
    drop(senders);
    for h in handles {
        h.join().unwrap();
    }
    assert!(live.lock().unwrap().is_empty());
    let s = node_stats(&rt);
    assert_eq!((s.bytes_in_use, s.blocks_cached), (0, 0), "{s:?}");
    assert_eq!(s.allocations, threads * 4000);
    assert_eq!(s.allocations, s.frees);
    assert!(s.cache_hits > 0);
    assert_eq!(rt.trim(), 0);
}

mod cache_model {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(usize),
        Drop(usize),
        Flush,
        Trim,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => (1usize..160_000).prop_map(Op::Alloc),
            4 => any::<usize>().prop_map(Op::Drop),
            1 => Just(Op::Flush),
            1 => Just(Op::Trim),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Against a model: live buffers never overlap and keep their
        /// bytes, bytes in use are exactly theirs, the cache stays within
        /// its bounds, and flush/trim empty it.
        #[test]
        fn cache_behaves_like_the_model(ops in proptest::collection::vec(op(), 1..120)) {
            let _g = serial();
            let lim = CacheLimits { max_blocks: 5, max_bytes: 200 << 10, max_block_bytes: 100 << 10 };
            let rt = runtime(with_cache(lim));
            let node = first_node(&rt);
            let mut live: Vec<(PinnedBuf, u8)> = Vec::new();
            for (i, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Alloc(n) => {
                        let b = fill(rt.alloc(Target::HostNode(node), n).unwrap(), i as u8);
                        let (p, c) = (b.0.as_ptr() as usize, b.0.capacity());
                        for (o, _) in &live {
                            let q = o.as_ptr() as usize;
                            prop_assert!(p + c <= q || q + o.capacity() <= p, "overlap");
                        }
                        live.push(b);
                    }
                    Op::Drop(k) if !live.is_empty() => {
                        let b = live.swap_remove(k % live.len());
                        check_tag(&b);
                    }
                    Op::Drop(_) => {}
                    Op::Flush => {
                        numapin::internals::flush_thread_cache(&rt, node);
                        prop_assert_eq!(node_stats(&rt).blocks_cached, 0);
                    }
                    Op::Trim => {
                        rt.trim();
                        prop_assert_eq!(node_stats(&rt).blocks_cached, 0);
                    }
                }
                let s = node_stats(&rt);
                prop_assert_eq!(s.bytes_in_use, capacity_of(&live));
                prop_assert!(s.blocks_cached <= 5 && s.bytes_cached <= 200 << 10, "{:?}", s);
                prop_assert!(s.bytes_in_use + s.bytes_cached <= s.bytes_reserved);
            }
            live.iter().for_each(check_tag);
            drop(live);
            let s = node_stats(&rt);
            prop_assert_eq!((s.bytes_in_use, s.allocations), (0, s.frees));
        }
    }
}

// ---- Huge pages: regions from the hugetlb pool ----

use common::{smaps_of, HugePool};

const HUGE_2M: u64 = 2 << 20;

/// Reserves `pages` 2 MiB pages on `node`, or prints why the test skips.
fn pool_or_skip(node: u32, pages: u64) -> Option<HugePool> {
    match HugePool::reserve(node, HUGE_2M, pages) {
        Ok(p) => Some(p),
        Err(why) => {
            eprintln!("skipped: {why}");
            None
        }
    }
}

fn hugetlb_2m(region: usize) -> RuntimeConfig {
    RuntimeConfig::default()
        .with_region_bytes(region)
        .with_huge_pages(HugePages::Hugetlb2M)
}

/// A region of 2 MiB hugetlb pages comes from the node's pool, is counted
/// exactly (in 4 KiB units, by move_pages one address per huge page, and
/// numa_maps agrees), is not locked (VmLck unchanged) and gives its pages
/// back to the pool when dropped.
#[test]
fn hugetlb_regions_come_from_the_nodes_pool_and_count_exactly() {
    let _g = serial();
    let rt = runtime(hugetlb_2m(8 * MIB));
    let node = first_node(&rt);
    let Some(pool) = pool_or_skip(node, 8) else {
        return;
    };
    let free = pool.free();
    let before = locked_bytes();
    let mut buf = rt.alloc(Target::HostNode(node), 3 * MIB).unwrap();
    buf.fill(0x5a);
    assert!(buf.iter().all(|&b| b == 0x5a));
    assert_eq!(
        pool.free(),
        free - 4,
        "one 8 MiB region: 4 pages of the pool"
    );
    let s = node_stats(&rt);
    assert_eq!(
        (
            s.regions,
            s.regions_hugetlb_2m,
            s.regions_thp,
            s.regions_mlocked
        ),
        (1, 1, 0, 0),
        "{s:?}"
    );
    assert_eq!(s.pages_on_node, (8 * MIB / 4096) as u64, "{s:?}");
    assert_eq!(s.pages_off_node, 0, "{s:?}");
    assert_eq!(s.bytes_locked, 0, "hugetlb regions are not locked: {s:?}");
    assert_eq!(locked_bytes(), before, "VmLck does not count hugetlb pages");
    let m = s.methods();
    assert!(
        m.contains("hugetlb (never swapped, no mlock)") && m.ends_with("2 MiB hugetlb pages"),
        "{m}"
    );
    let shared = s.shared_methods().unwrap();
    assert_eq!(
        (shared.pinned, shared.pages),
        (PinnedBy::Hugetlb, PageKind::Hugetlb2M)
    );
    assert!(s.method_notes.is_empty(), "{s:?}");
    drop(buf);
    drop(rt);
    assert_eq!(pool.free(), free, "the pages went back to the pool");

    // The region itself: its own VMA (hugetlb, 2 MiB kernel pages, not
    // copied to a forked child), counted the same by numa_maps.
    let mut o = region_options(node, 6 * MIB, node_cpus(node));
    o.huge_pages = HugePages::Hugetlb2M;
    let r = Region::create(&o).unwrap();
    assert_eq!(r.len(), 6 * MIB);
    assert_eq!(r.ptr() as usize % (2 * MIB), 0);
    assert_eq!(r.page_kind(), PageKind::Hugetlb2M);
    let smaps = smaps_of(r.ptr() as usize);
    assert!(smaps.contains("KernelPageSize:     2048 kB"), "{smaps}");
    let flags = smaps.lines().find(|l| l.starts_with("VmFlags:")).unwrap();
    assert!(
        flags.contains(" ht") && flags.contains(" dc") && !flags.contains(" lo"),
        "hugetlb, MADV_DONTFORK, not locked: {flags}"
    );
    let counts = r.count_pages().unwrap();
    assert_eq!(counts.by, VerifiedBy::MovePages);
    assert_eq!(counts.pages, (6 * MIB / 4096) as u64);
    assert_eq!(counts.nodes, [(node, (6 * MIB / 4096) as u64)]);
    assert_eq!(counts.missing, 0);
    let start = r.ptr() as u64;
    let p = numapin::internals::numa_maps_of(start, start + r.len() as u64).unwrap();
    assert_eq!((p.vmas, p.straddling), (1, 0), "{p:?}");
    let from_maps: Vec<(u32, u64)> = p
        .exact_nodes
        .unwrap()
        .into_iter()
        .map(|(n, b)| (n, b / 4096))
        .collect();
    assert_eq!(from_maps, counts.nodes);
    let parsed = numapin::internals::numa_maps_line(start).unwrap();
    assert!(parsed.hugetlb, "{parsed:?}");
    assert_eq!(parsed.page_bytes, Some(HUGE_2M));
    assert_eq!(parsed.nodes, [(node, 3)], "counted in huge pages");
    let addr = r.ptr() as usize;
    drop(r);
    assert!(!is_mapped(addr));
    assert_eq!(pool.free(), free);
}

/// A node's pool too small for a region: an explicit choice fails before
/// anything is mapped, with the pool's figures and the fix; Auto uses
/// transparent huge pages and says why, and takes the pool when the region
/// fits in it.
#[test]
fn a_pool_too_small_fails_cleanly_and_auto_falls_back_to_thp() {
    let _g = serial();
    let rt = runtime(hugetlb_2m(8 * MIB));
    let node = first_node(&rt);
    let Some(pool) = pool_or_skip(node, 2) else {
        return;
    };
    let free = pool.free();
    let before = locked_bytes();
    let mapped = last_mapped_addr();
    let e = arena_err(rt.alloc(Target::HostNode(node), MIB).unwrap_err());
    let msg = numapin::error::with_causes(&e);
    assert!(
        matches!(e, RuntimeError::HugePages { needed: 4, usable: Some(u), .. } if u == free),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("node {node}'s 2 MiB pool has {free} free page(s)")),
        "{msg}"
    );
    assert_eq!(e.kind(), numapin::ErrorKind::Budget);
    assert!(e.fix().unwrap().contains("nr_hugepages"), "{:?}", e.fix());
    assert_eq!(last_mapped_addr(), mapped, "nothing was mapped");
    assert_eq!((locked_bytes(), pool.free()), (before, free));
    let s = node_stats(&rt);
    assert_eq!((s.regions, s.failures), (0, 1), "{s:?}");
    drop(rt);

    // Auto: a 6 MiB region does not fit, a 4 MiB one does.
    let rt = runtime(small().with_region_bytes(4 * MIB));
    assert_eq!(rt.config().huge_pages, HugePages::Auto, "the default");
    let a = rt.alloc(Target::HostNode(node), 6 * MIB).unwrap();
    let s = node_stats(&rt);
    let thp = if numapin::region::thp_enabled() {
        s.regions_thp
    } else {
        s.regions_base_pages
    };
    assert_eq!((s.regions, thp, s.regions_hugetlb_2m), (1, 1, 0), "{s:?}");
    assert_eq!(s.method_notes.len(), 1, "{s:?}");
    let note = &s.method_notes[0];
    assert!(
        note.starts_with(&format!(
            "huge pages auto: node {node}'s 2 MiB pool has {free} free page(s)"
        )) && note.contains("3 needed"),
        "{note}"
    );
    assert_eq!(pool.free(), free);
    if numapin::internals::populate_write_supported() {
        let b = rt.alloc(Target::HostNode(node), MIB).unwrap();
        let s = node_stats(&rt);
        assert_eq!((s.regions, s.regions_hugetlb_2m), (2, 1), "{s:?}");
        assert!(s.method_notes.is_empty(), "{s:?}");
        assert_eq!(s.pages_on_node, (10 * MIB / 4096) as u64, "{s:?}");
        assert_eq!(s.bytes_locked, 6 * MIB as u64, "only the THP region: {s:?}");
        assert_eq!(pool.free(), free - 2);
        drop(b);
    }
    drop(a);
    drop(rt);
    assert_eq!(pool.free(), free);
}

/// When the kernel cannot supply hugetlb pages the check of the pool
/// promised (here: a pool file that overstates, the real pool empty), the
/// failure is an error naming the call, never SIGBUS, and nothing stays
/// mapped. Needs no root.
#[test]
fn hugetlb_pages_the_kernel_refuses_after_the_check_fail_cleanly() {
    let _g = serial();
    let pool = |file: &str| -> Option<u64> {
        std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/hugepages-2048kB/{file}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let (Some(free), Some(overcommit)) = (pool("free_hugepages"), pool("nr_overcommit_hugepages"))
    else {
        common::skip(common::Need::Kernel, "no 2 MiB hugetlb pool on this kernel");
        return;
    };
    let node = 0;
    // More pages than the machine has free, none of which it can overcommit.
    if overcommit > 0 {
        eprintln!("skipped: hugetlb overcommit is on");
        return;
    }
    let want = free + 1;
    let d = tempfile::tempdir().unwrap();
    for (dir, files) in [
        (
            format!("sys/devices/system/node/node{node}/hugepages/hugepages-2048kB"),
            vec!["nr_hugepages", "free_hugepages", "surplus_hugepages"],
        ),
        (
            "sys/kernel/mm/hugepages/hugepages-2048kB".to_string(),
            vec![
                "nr_hugepages",
                "free_hugepages",
                "resv_hugepages",
                "surplus_hugepages",
                "nr_overcommit_hugepages",
            ],
        ),
    ] {
        std::fs::create_dir_all(d.path().join(&dir)).unwrap();
        for f in files {
            let v = match f {
                "nr_hugepages" | "free_hugepages" => want,
                _ => 0,
            };
            std::fs::write(d.path().join(&dir).join(f), format!("{v}\n")).unwrap();
        }
    }
    let mut cfg = hugetlb_2m(want as usize * 2 * MIB);
    numapin::internals::pool_root(&mut cfg, Some(d.path().to_path_buf()));
    let rt = runtime(cfg);
    if !rt.arena_nodes().any(|n| n == node) {
        eprintln!("skipped: node 0 has no arena here");
        return;
    }
    let mapped = last_mapped_addr();
    let before = locked_bytes();
    let e = arena_err(rt.alloc(Target::HostNode(node), MIB).unwrap_err());
    let msg = numapin::error::with_causes(&e);
    assert!(
        matches!(&e, RuntimeError::HugePages { usable: None, source: Some(s), .. } if s.raw_os_error() == Some(libc::ENOMEM)),
        "{msg}"
    );
    assert!(msg.contains("mmap(MAP_HUGETLB) failed (ENOMEM)"), "{msg}");
    assert_eq!(e.kind(), numapin::ErrorKind::System);
    assert_eq!(last_mapped_addr(), mapped, "nothing was mapped");
    assert_eq!(locked_bytes(), before);
    // An explicit 1 GiB choice on a kernel or node without such a pool
    // names what is missing.
    let one_g = HugePool::dir(node, 1 << 30);
    let rt = runtime(small().with_huge_pages(HugePages::Hugetlb1G));
    if !one_g.exists() {
        let e = arena_err(rt.alloc(Target::HostNode(node), MIB).unwrap_err());
        assert!(
            e.to_string().contains("offers no 1 GiB hugetlb pages"),
            "{e}"
        );
    }
}

/// A failure at every step of a hugetlb region's creation leaves nothing
/// mapped and every page back in the pool.
#[test]
fn a_failed_hugetlb_region_leaves_nothing_behind() {
    let _g = serial();
    let rt = runtime(hugetlb_2m(4 * MIB));
    let node = first_node(&rt);
    drop(rt);
    let Some(pool) = pool_or_skip(node, 2) else {
        return;
    };
    let free = pool.free();
    for step in [
        Step::Map,
        Step::Advise,
        Step::Bind,
        Step::Populate,
        Step::Lock,
        Step::Register,
        Step::Verify,
    ] {
        let mut cfg = hugetlb_2m(4 * MIB);
        numapin::internals::fail_after(&mut cfg, Some(step));
        let rt = runtime(cfg);
        let e = arena_err(rt.alloc(Target::HostNode(node), MIB).unwrap_err());
        assert!(
            matches!(e, RuntimeError::System { step: s, .. } if s == step),
            "{step:?}: {e}"
        );
        let addr = last_mapped_addr();
        assert_eq!(addr % (2 * MIB), 0);
        assert!(!is_mapped(addr), "{step:?}: the region is still mapped");
        assert_eq!(pool.free(), free, "{step:?}: pages back in the pool");
    }
}

/// hugetlb pages are for the mapped backend: asking for them with a driver
/// backend is a configuration error naming both.
#[test]
fn hugetlb_pages_with_a_driver_backend_are_a_config_error() {
    let _g = serial();
    let cfg = small()
        .with_backend(numapin::runtime::Backend::DriverNuma)
        .with_huge_pages(HugePages::Hugetlb2M);
    let e = Runtime::new(topology(), cfg).unwrap_err();
    assert!(
        matches!(
            e,
            RuntimeError::Config {
                setting: "huge_pages",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.kind(), numapin::ErrorKind::Input);
    assert!(e.to_string().contains("driver_numa"), "{e}");
    // Auto stays allowed (the driver's pages, whatever the pools).
    let cfg = small().with_backend(numapin::runtime::Backend::DriverNuma);
    assert!(Runtime::new(topology(), cfg).is_ok());
}

/// 1 GiB pages: a region rounded up to one page, counted exactly.
#[test]
fn a_1_gib_hugetlb_region_is_one_page_on_the_node() {
    let _g = serial();
    let rt = runtime(small().with_huge_pages(HugePages::Hugetlb1G));
    let node = first_node(&rt);
    let pool = match HugePool::reserve(node, 1 << 30, 1) {
        Ok(p) => p,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let buf = rt.alloc(Target::HostNode(node), 3 * MIB).unwrap();
    assert_eq!(pool.free(), 0);
    let s = node_stats(&rt);
    assert_eq!(
        (s.regions_hugetlb_1g, s.bytes_reserved),
        (1, 1 << 30),
        "{s:?}"
    );
    assert_eq!(s.pages_on_node, (1 << 30) / 4096, "{s:?}");
    let smaps = smaps_of(buf.as_ptr() as usize);
    assert!(smaps.contains("KernelPageSize:  1048576 kB"), "{smaps}");
    drop(buf);
    drop(rt);
    assert_eq!(pool.free(), 1);
}

/// As user `nobody` with Docker's 64 KiB memlock limit and no CUDA driver,
/// hugetlb regions still work (they are not locked, so the limit does not
/// apply), where THP regions get the memlock error; under a seccomp filter
/// refusing the NUMA calls they are placed by first touch and counted
/// through numa_maps, exactly.
#[test]
fn hugetlb_regions_need_no_memlock_and_survive_a_seccomp_filter() {
    let _g = serial();
    let rt = runtime(small());
    let node = first_node(&rt);
    drop(rt);
    let Some(_pool) = pool_or_skip(node, 8) else {
        return;
    };
    run_as_nobody(
        "child_hugetlb_nobody",
        &[("NUMAPIN_NO_CUDA", "1")],
        64 << 10,
    );
    let prog = common::seccomp::docker_default();
    if let Some(out) = run_child("child_hugetlb_filtered", &[], move || {
        common::seccomp::install(&prog)
    }) {
        assert_child_passed(&out);
    }
}

#[test]
#[ignore = "runs in a child process as user nobody: started by hugetlb_regions_need_no_memlock_and_survive_a_seccomp_filter"]
fn child_hugetlb_nobody() {
    if !in_child_with_memlock("child_hugetlb_nobody", 64 << 10) {
        return;
    }
    let rt = runtime(hugetlb_2m(4 * MIB));
    let node = first_node(&rt);
    let mut buf = rt.alloc(Target::HostNode(node), 3 * MIB).unwrap();
    buf.fill(3);
    let s = node_stats(&rt);
    assert_eq!((s.regions_hugetlb_2m, s.bytes_locked), (1, 0), "{s:?}");
    assert_eq!(s.pages_on_node, (4 * MIB / 4096) as u64, "{s:?}");
    let thp = runtime(small().with_huge_pages(HugePages::Transparent));
    let e = arena_err(thp.alloc(Target::HostNode(node), MIB).unwrap_err());
    assert!(matches!(e, RuntimeError::Memlock { .. }), "{e}");
}

#[test]
#[ignore = "runs in a child process under a seccomp filter: started by hugetlb_regions_need_no_memlock_and_survive_a_seccomp_filter"]
fn child_hugetlb_filtered() {
    if !in_child("child_hugetlb_filtered") {
        return;
    }
    let rt = runtime(hugetlb_2m(8 * MIB));
    let node = first_node(&rt);
    let buf = rt.alloc(Target::HostNode(node), 3 * MIB).unwrap();
    let s = node_stats(&rt);
    assert_eq!(
        (
            s.regions_hugetlb_2m,
            s.regions_first_touch,
            s.regions_verified_numa_maps
        ),
        (1, 1, 1),
        "{s:?}"
    );
    assert_eq!(
        (s.pages_on_node, s.pages_off_node),
        ((8 * MIB / 4096) as u64, 0),
        "{s:?}"
    );
    println!("{}; {:?}", s.methods(), s.method_notes);
    drop(buf);
}

/// A staging buffer makes a region of its own size (rounded to 2 MiB) where
/// an ordinary buffer makes a standard region; both are regions of the
/// arena (budget, stats, trim), and a later staging buffer that fits in
/// free room takes it instead of a new region.
#[test]
fn staging_buffers_pin_no_more_than_they_hold() {
    let _g = serial();
    let rt = runtime(RuntimeConfig::default().with_region_bytes(64 * MIB));
    let node = first_node(&rt);
    let reserved = |rt: &Runtime| {
        rt.stats()
            .into_iter()
            .find(|s| s.node == node)
            .unwrap()
            .bytes_reserved
    };
    let s = rt
        .alloc_with(
            Target::HostNode(node),
            5 * MIB + 1,
            &AllocOptions::default().with_staging(true),
        )
        .unwrap();
    assert_eq!(reserved(&rt), 6 * MIB as u64, "one fitted region");
    assert!(s.len() > 5 * MIB);
    let b = rt.alloc(Target::HostNode(node), MIB).unwrap();
    assert_eq!(reserved(&rt), (6 + 64) * MIB as u64, "a standard region");
    let t = rt
        .alloc_with(
            Target::HostNode(node),
            2 * MIB,
            &AllocOptions::default().with_staging(true),
        )
        .unwrap();
    assert_eq!(
        reserved(&rt),
        (6 + 64) * MIB as u64,
        "room in the standard one"
    );
    drop((s, b, t));
    assert_eq!(rt.trim(), 0);
    let e = rt
        .alloc_with(
            Target::HostNode(node),
            0,
            &AllocOptions::default().with_staging(true),
        )
        .unwrap_err();
    assert_eq!(e.kind(), numapin::ErrorKind::Input);
}

/// Under an address-space or data limit a few MiB above what the process
/// maps (`ulimit -v`, `ulimit -d`), a region that does not fit is a
/// permission-kind error naming the limit and its fix, never a crash.
#[test]
fn an_address_space_limit_gives_a_clear_error() {
    let _g = serial();
    if let Some(out) = run_child("child_address_limit", &[], || Ok(())) {
        assert_child_passed(&out);
    }
}

#[test]
#[ignore = "runs in a child process: started by an_address_space_limit_gives_a_clear_error"]
fn child_address_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if !in_child("child_address_limit") {
        return;
    }
    let rt = runtime(small());
    let node = first_node(&rt);
    // The address-space limit counts every mapping; the data limit,
    // private writable ones.
    for (res, name, flag, field) in [
        (Resource::RLIMIT_AS, "RLIMIT_AS", "ulimit -v", "VmSize:"),
        (Resource::RLIMIT_DATA, "RLIMIT_DATA", "ulimit -d", "VmData:"),
    ] {
        let vm_kib: u64 = std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap();
        let (soft, hard) = getrlimit(res).unwrap();
        setrlimit(res, (vm_kib << 10) + 4 * MIB as u64, hard).unwrap();
        let r = rt.alloc(Target::HostNode(node), MIB);
        setrlimit(res, soft, hard).unwrap();
        let e = arena_err(r.unwrap_err());
        let msg = format!("{e}\n  fix: {}", e.fix().unwrap());
        println!("{name}: {msg}");
        assert!(
            matches!(e, RuntimeError::AddressLimit { limit, .. } if limit == name),
            "{e:?}"
        );
        assert_eq!(e.kind(), numapin::ErrorKind::Permission, "{msg}");
        for part in [name, flag, "region_bytes", "16 MiB region"] {
            assert!(msg.contains(part), "{part}: {msg}");
        }
    }
    // Without the limit the same request is met.
    drop(rt.alloc(Target::HostNode(node), MIB).unwrap());
}
