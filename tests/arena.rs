//! Pinned arenas on this machine: placement, locking, DONTFORK, limits,
//! failure clean-up, budget, concurrency, and (ignored) CUDA.
//!
//! Tests here measure VmLck of the whole process, so they take one lock
//! and run one at a time. Tests that need a fresh process (another user,
//! another memlock limit) re-run this test binary as a child with
//! `NUMAPIN_ARENA_CHILD` set; those child tests are `#[ignore]`d and do
//! nothing unless that variable names them.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

mod common;

use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use numapin::internals::last_mapped_addr;
use numapin::internals::numa::is_mapped;
use numapin::internals::sys::locked_bytes;
use numapin::runtime::{ArenaError, Step};
use numapin::runtime::{Runtime, RuntimeConfig};
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

fn arena_err(e: impl Into<Error>) -> ArenaError {
    match e.into() {
        Error::Arena(a) => a,
        other => panic!("expected an arena error, got {other}"),
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Re-runs this binary's `name` test in a child process with
/// `NUMAPIN_ARENA_CHILD=name`, `pre` run in the child before exec.
fn run_child(
    name: &str,
    pre: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static,
) -> Option<std::process::Output> {
    use std::os::unix::process::CommandExt;
    // A copy any user can run: the child may drop to user `nobody`.
    let (_dir, exe) = common::runnable_by_everyone(&std::env::current_exe().unwrap());
    let mut cmd = Command::new(&exe);
    cmd.current_dir("/");
    cmd.args([
        "--exact",
        name,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("NUMAPIN_ARENA_CHILD", name);
    // SAFETY: `pre` only makes system calls (setrlimit, setgid, setuid).
    unsafe { cmd.pre_exec(pre) };
    match cmd.output() {
        Ok(out) => {
            eprintln!(
                "--- child {name} ---\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            Some(out)
        }
        Err(e) => {
            eprintln!("skipped: cannot start the child test {name}: {e}");
            None
        }
    }
}

fn in_child(name: &str) -> bool {
    if std::env::var("NUMAPIN_ARENA_CHILD").as_deref() == Ok(name) {
        true
    } else {
        eprintln!("skipped: {name} runs in a child process started by its parent test");
        false
    }
}

#[test]
fn region_is_on_its_node_and_locked() {
    let _g = serial();
    let rt = runtime(small());
    let node = first_node(&rt);
    let before = locked_bytes();
    let mut buf = rt.alloc_on_node(node, 5 * MIB + 123).unwrap();
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
    if numapin::internals::cuda::available() {
        eprintln!("skipped: a CUDA driver is present (see the GPU tests)");
        return;
    }
    let rt = runtime(small());
    let buf = rt.alloc_on_node(first_node(&rt), 4096).unwrap();
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
    let mut buf = rt.alloc_on_node(first_node(&rt), 64 * 1024).unwrap();
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
        let e = arena_err(rt.alloc_on_node(node, MIB).unwrap_err());
        assert!(
            matches!(e, ArenaError::System { step: s, .. } if s == step),
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
    let e = arena_err(rt.alloc_on_node(999, 4096).unwrap_err());
    assert!(
        matches!(e, ArenaError::UnknownNode { node: 999, .. }),
        "{e}"
    );
    assert_eq!(e.kind(), numapin::ErrorKind::Input);
    assert!(e.fix().is_some_and(|f| f.contains("numapin topo")));
    let e = rt
        .alloc_for_gpu(numapin::CudaOrdinal(999), 4096)
        .unwrap_err();
    assert_eq!(e.kind(), numapin::ErrorKind::Input);
    assert!(matches!(
        arena_err(e),
        ArenaError::UnknownGpu {
            gpu: numapin::CudaOrdinal(999),
            ..
        }
    ));
    let e = arena_err(rt.alloc_on_node(first_node(&rt), 0).unwrap_err());
    assert!(matches!(e, ArenaError::BadRequest { .. }), "{e}");
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
    let e = arena_err(rt.alloc_on_node(1000, MIB).unwrap_err());
    assert!(matches!(e, ArenaError::NoMemory { node: 1000, .. }), "{e}");
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
    let a = rt.alloc_on_node(node, 40 * MIB).unwrap();
    let b = rt.alloc_on_node(node, 16 * MIB).unwrap();
    assert_eq!(rt.stats()[0].bytes_reserved, 56 * MIB as u64);
    let e = arena_err(rt.alloc_on_node(node, 30 * MIB).unwrap_err());
    match e {
        ArenaError::BudgetExceeded {
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
        rt.alloc_on_node_timeout(node, 30 * MIB, Duration::from_millis(100))
            .unwrap_err(),
    );
    assert!(matches!(e, ArenaError::BudgetExceeded { .. }));
    assert!(t.elapsed() >= Duration::from_millis(100));
    // Another thread frees `a` a little later: the waiting allocation then
    // succeeds (the empty region is given back to make room).
    let freer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        drop(a);
    });
    let c = rt
        .alloc_on_node_timeout(node, 30 * MIB, Duration::from_secs(10))
        .unwrap();
    freer.join().unwrap();
    assert_eq!(c.len(), 30 * MIB);
    let s = &rt.stats()[0];
    assert!(s.bytes_reserved <= 64 * MIB as u64);
    assert_eq!(s.failures, 2);
    drop((b, c));
}

#[test]
fn a_request_larger_than_a_region_gets_a_dedicated_one() {
    let _g = serial();
    let rt = runtime(small());
    let node = first_node(&rt);
    let before = locked_bytes();
    let big = rt.alloc_on_node(node, 20 * MIB + 1).unwrap();
    assert_eq!(rt.stats()[0].bytes_reserved, 22 * MIB as u64);
    assert_eq!(locked_bytes() - before, 22 * MIB as u64);
    let first = big.as_ptr() as usize;
    drop(big);
    // The last dedicated region emptied is kept, and the next large
    // request reuses it instead of making one.
    assert_eq!(rt.stats()[0].regions, 1);
    let again = rt.alloc_on_node(node, 20 * MIB).unwrap();
    assert_eq!(again.as_ptr() as usize, first);
    assert_eq!(rt.stats()[0].regions, 1);
    // Two at once: when both are free, only the last one emptied stays.
    let other = rt.alloc_on_node(node, 30 * MIB).unwrap();
    assert_eq!(rt.stats()[0].regions, 2);
    drop(again);
    drop(other);
    let s = &rt.stats()[0];
    assert_eq!((s.regions, s.bytes_reserved), (1, 30 * MIB as u64));
    assert_eq!(locked_bytes() - before, 30 * MIB as u64);
    // A small request is served from the kept region (no new region), and
    // trim gives it back.
    drop(rt.alloc_on_node(node, MIB).unwrap());
    assert_eq!(rt.stats()[0].regions, 1);
    assert_eq!(rt.trim(), 0);
    assert_eq!(locked_bytes(), before);
}

#[test]
fn typed_views_share_the_bytes() {
    let _g = serial();
    let rt = runtime(small());
    let mut buf = rt.alloc_on_node(first_node(&rt), 4096 + 6).unwrap();
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
                let mut rng = numapin::internals::arena_measure::Rng::new(t + 100);
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
                    let mut buf = rt.alloc_on_node(node, size).unwrap();
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
    if !is_root() {
        eprintln!("skipped: needs root to run a child as user nobody");
        return;
    }
    let Some(out) = run_child("child_unprivileged", || {
        let limit = 8 << 20;
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK, limit, limit)?;
        nix::unistd::setgroups(&[])?;
        nix::unistd::setgid(nix::unistd::Gid::from_raw(65534))?;
        nix::unistd::setuid(nix::unistd::Uid::from_raw(65534))?;
        Ok(())
    }) else {
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed");
    assert!(text.contains("1 passed"), "the child test did not run");
}

#[test]
#[ignore = "runs in a child process as user nobody: started by unprivileged_memlock_limit_gives_a_clear_error"]
fn child_unprivileged() {
    if !in_child("child_unprivileged") {
        return;
    }
    assert!(!numapin::internals::sys::has_cap_ipc_lock());
    assert_eq!(numapin::internals::sys::memlock_limit().unwrap().0, 8 << 20);
    let rt = runtime(small());
    let node = first_node(&rt);
    let before = locked_bytes();
    // Checked before anything is mapped.
    let e = arena_err(rt.alloc_on_node(node, 64 * MIB).unwrap_err());
    let msg = format!(
        "{}\n  fix: {}",
        numapin::error::with_causes(&e),
        e.fix().unwrap()
    );
    println!("{msg}");
    assert!(
        matches!(e, ArenaError::Memlock { node: n, limit, source: None, .. } if n == node && limit == 8 << 20),
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
    let buf = rt4.alloc_on_node(node, MIB).unwrap();
    assert_eq!(locked_bytes() - before, 4 * MIB as u64);
    drop(buf);
    drop(rt4);
    assert_eq!(locked_bytes(), before);

    // mlock itself failing (the check skipped) is the same error, with the
    // system's reason, and the region is gone.
    let mut cfg = small();
    numapin::internals::skip_memlock_check(&mut cfg, true);
    let rt = runtime(cfg);
    let e = arena_err(rt.alloc_on_node(node, 64 * MIB).unwrap_err());
    println!("{e}");
    assert!(
        matches!(
            e,
            ArenaError::Memlock {
                source: Some(_),
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(locked_bytes(), before);
    assert!(
        !is_mapped(last_mapped_addr()),
        "the failed region is still mapped"
    );
}

// ---- GPU tests: run with --ignored on a machine with a CUDA GPU. ----

fn gpu_runtime() -> Option<(Runtime, numapin::CudaOrdinal)> {
    if !numapin::internals::cuda::available() {
        eprintln!("skipped: no CUDA driver");
        return None;
    }
    let t = Topology::probe(&ProbeOptions::from_process()).unwrap();
    let ordinal = t.gpus.iter().find_map(|g| g.cuda_ordinal)?;
    numapin::internals::cuda::set_device(ordinal.get()).unwrap();
    Some((Runtime::new(t, RuntimeConfig::default()).unwrap(), ordinal))
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU machine"]
fn gpu_registration_agrees_with_the_driver() {
    let _g = serial();
    let Some((rt, gpu)) = gpu_runtime() else {
        return;
    };
    let buf = rt.alloc_for_gpu(gpu, 8 * MIB).unwrap();
    assert!(buf.is_registered());
    let flags = numapin::internals::cuda::host_get_flags(buf.as_ptr().cast()).unwrap();
    assert_ne!(
        flags & numapin::internals::cuda::HOST_REGISTER_PORTABLE,
        0,
        "flags {flags:#x}"
    );
    assert_eq!(
        numapin::internals::cuda::host_device_pointer(buf.as_ptr().cast()).unwrap(),
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
    let stream = numapin::internals::cuda::Stream::new().unwrap();
    let dev = numapin::internals::cuda::DeviceBuffer::new(n).unwrap();
    let mut src = rt.alloc_for_gpu(gpu, n).unwrap();
    src.as_mut_slice_of::<u32>()
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = (i as u32).wrapping_mul(2654435761));
    let mut dst = rt.alloc_for_gpu(gpu, n).unwrap();
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
    let other = rt.alloc_for_gpu(gpu, n).unwrap();
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

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU machine"]
fn gpu_h2d_bandwidth_matches_cuda_pinned_memory() {
    let _g = serial();
    let Some((rt, gpu)) = gpu_runtime() else {
        return;
    };
    let n = 256 * MIB;
    let stream = numapin::internals::cuda::Stream::new().unwrap();
    let dev = numapin::internals::cuda::DeviceBuffer::new(n).unwrap();
    let arena = rt.alloc_for_gpu(gpu, n).unwrap();
    let host = numapin::internals::cuda::HostAlloc::new(n).unwrap();
    let time = |src: *const std::ffi::c_void| -> f64 {
        let (a, b) = (
            numapin::internals::cuda::Event::new(true).unwrap(),
            numapin::internals::cuda::Event::new(true).unwrap(),
        );
        let mut best = f64::MAX;
        for _ in 0..10 {
            // SAFETY: both buffers hold n bytes and outlive the copies,
            // which are waited for before the next iteration.
            unsafe {
                a.record(stream.raw()).unwrap();
                numapin::internals::cuda::memcpy_htod_async(dev.ptr(), src, n, stream.raw())
                    .unwrap();
                b.record(stream.raw()).unwrap();
            }
            b.synchronize().unwrap();
            best = best.min(f64::from(b.elapsed_ms_since(&a).unwrap()));
        }
        n as f64 / (best / 1e3) / 1e9
    };
    // Interleave to share any drift in clocks or link state.
    let (mut arena_gbs, mut host_gbs) = (0.0f64, 0.0f64);
    for _ in 0..3 {
        arena_gbs = arena_gbs.max(time(arena.as_ptr().cast()));
        host_gbs = host_gbs.max(time(host.ptr()));
    }
    eprintln!(
        "H2D 256 MiB: arena {arena_gbs:.2} GB/s, cuMemAllocHost {host_gbs:.2} GB/s (node {})",
        arena.node()
    );
    assert!(
        arena_gbs >= 0.97 * host_gbs,
        "arena {arena_gbs:.2} GB/s vs cuMemAllocHost {host_gbs:.2} GB/s"
    );
}

// ---- Thread caches -------------------------------------------------------

use numapin::internals::arena_measure::Rng;
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
            let buf = rt.alloc_on_node(node, size).unwrap();
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
        drop(rt.alloc_on_node(node, 4096).unwrap());
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
        let buf = rt.alloc_on_node(node, 64 << 10).unwrap();
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
    assert_eq!(rt.arena(node).unwrap().flush_thread_cache(), 0);
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
    let arena = rt.arena(node).unwrap().clone();
    let bufs: Vec<_> = (0..5)
        .map(|_| rt.alloc_on_node(node, 8192).unwrap())
        .collect();
    drop(bufs);
    assert_eq!(node_stats(&rt).blocks_cached, 5);
    assert_eq!(arena.flush_thread_cache(), 5);
    let s = node_stats(&rt);
    assert_eq!((s.blocks_cached, s.bytes_cached, s.bytes_in_use), (0, 0, 0));
    // Reused from the cache: the same block again.
    let a = rt.alloc_on_node(node, 8192).unwrap();
    let p = a.as_ptr();
    drop(a);
    let b = rt.alloc_on_node(node, 8000).unwrap();
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
                .map(|_| rt.alloc_on_node(node, 1 << 20).unwrap())
                .collect();
            drop(bufs);
            done.send(()).unwrap();
            wait.recv().unwrap();
            // Its cache was emptied under it; it still works.
            drop(rt.alloc_on_node(node, 1 << 20).unwrap());
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
        .map(|_| rt.alloc_on_node(node, 4 * MIB).unwrap())
        .collect();
    assert!(rt.alloc_on_node(node, 4096).is_err());
    // One goes to this thread's cache; a 3 MiB request (another size)
    // waits for the budget and is served from it.
    drop(bufs.pop());
    assert_eq!(node_stats(&rt).blocks_cached, 1);
    let c = rt
        .alloc_on_node_timeout(node, 3 * MIB, Duration::from_secs(10))
        .unwrap();
    let s = node_stats(&rt);
    assert_eq!((s.blocks_cached, s.regions), (0, 1), "{s:?}");
    drop(c);
    drop(bufs.pop());
    // Without waiting, too.
    let d = rt.alloc_on_node(node, 6 * MIB).unwrap();
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
    let e = rt.alloc_on_node(node, 3 * MIB).unwrap();
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
        .alloc_on_node_timeout(node, 4 * MIB, Duration::from_secs(10))
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
                .map(|_| rt.alloc_on_node(node, 4096).unwrap())
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
                    let buf = rt.alloc_on_node(node, size).unwrap();
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
            let arena = rt.arena(node).unwrap().clone();
            let mut live: Vec<(PinnedBuf, u8)> = Vec::new();
            for (i, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Alloc(n) => {
                        let b = fill(rt.alloc_on_node(node, n).unwrap(), i as u8);
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
                        arena.flush_thread_cache();
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
