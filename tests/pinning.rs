//! Pinning itself: the time of each creation step, the two exact placement
//! checks agreeing, large regions released off the caller's thread (and
//! never outliving the runtime), and the driver backends: a clear error
//! without a driver, and on a GPU machine (`--ignored`) memory on its node
//! that copies to and from the GPU.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

mod common;

use std::sync::{Mutex, MutexGuard};

use numapin::internals::{Region, RegionOptions};
use numapin::runtime::{ArenaError, Backend, Placement, Runtime, RuntimeConfig, VerifiedBy};
use numapin::topology::{CudaMode, ProbeOptions, Topology};

const MIB: usize = 1 << 20;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn topology(cuda: CudaMode) -> Topology {
    Topology::probe(&ProbeOptions::from_process().with_cuda(cuda)).expect("probe this machine")
}

fn first_node(rt: &Runtime) -> u32 {
    rt.stats().first().expect("a node with memory").node
}

/// VmLck of this process, bytes.
fn locked_bytes() -> u64 {
    numapin::internals::sys::locked_bytes()
}

fn options(node: u32, size: usize, backend: Backend) -> RegionOptions {
    RegionOptions {
        node,
        size,
        cpus: numapin::CpuList::new(),
        populate_threads: 2,
        register: true,
        placement: Placement::Strict,
        pin_by_registration: None,
        backend,
        huge_pages: numapin::runtime::HugePages::Transparent,
        pool_root: None,
        fail_after: None,
    }
}

#[test]
fn every_step_is_timed_and_the_steps_add_up() {
    let _g = serial();
    let rt = Runtime::new(topology(CudaMode::Off), RuntimeConfig::default()).unwrap();
    let node = first_node(&rt);
    let t = std::time::Instant::now();
    let r = Region::create(&options(node, 32 * MIB, Backend::Mapped)).unwrap();
    let wall = t.elapsed();
    let times = *r.times();
    // Faulting in 32 MiB and reading back 8192 pages' nodes take time;
    // an mmap of 32 MiB is never free either.
    for (name, d) in times.steps() {
        if matches!(name, "map" | "populate" | "verify") {
            assert!(!d.is_zero(), "{name} not timed: {times:?}");
        }
    }
    // Register and verify may overlap, so only the serial steps bound the
    // total from below; nothing is counted twice beyond that overlap.
    assert!(times.populate + times.map <= wall, "{times:?} > {wall:?}");
    assert!(
        times.total() <= wall + times.register.min(times.verify),
        "{times:?} vs {wall:?}"
    );
    let counts = r.count_pages().unwrap();
    assert_eq!(counts.pages, (32 * MIB / 4096) as u64);
    assert_eq!(counts.on(node), counts.pages);
}

#[test]
fn move_pages_and_numa_maps_agree_on_every_thread_count() {
    let _g = serial();
    let rt = Runtime::new(topology(CudaMode::Off), RuntimeConfig::default()).unwrap();
    let node = first_node(&rt);
    let r = Region::create(&options(node, 24 * MIB, Backend::Mapped)).unwrap();
    let nm = r.count_pages_numa_maps().unwrap();
    assert_eq!(nm.by, VerifiedBy::NumaMaps);
    for threads in [1, 2, 5, 64] {
        let mp = r.count_pages_move_pages_on(threads).unwrap();
        assert_eq!(mp.by, VerifiedBy::MovePages);
        assert_eq!(
            (mp.pages, mp.missing, mp.nodes.clone()),
            (nm.pages, nm.missing, nm.nodes.clone()),
            "{threads} threads"
        );
    }
    assert_eq!(nm.on(node), (24 * MIB / 4096) as u64);
}

#[test]
fn large_regions_are_released_in_the_background_and_never_outlive_the_runtime() {
    let _g = serial();
    let cfg = RuntimeConfig::default().with_region_bytes(16 * MIB);
    let rt = Runtime::new(topology(CudaMode::Off), cfg).unwrap();
    let node = first_node(&rt);
    let stats = |rt: &Runtime| rt.stats().into_iter().find(|s| s.node == node).unwrap();
    let before = locked_bytes();
    // Two dedicated 96 MiB regions; when both are empty, the one emptied
    // last is kept and the other released.
    let a = rt.alloc_on_node(node, 96 * MIB).unwrap();
    let b = rt.alloc_on_node(node, 96 * MIB).unwrap();
    let a_addr = a.as_ptr() as usize;
    assert_eq!(locked_bytes() - before, 192 * MIB as u64);
    let delay = std::time::Duration::from_millis(400);
    numapin::internals::release_delay(delay);
    drop(a);
    let t = std::time::Instant::now();
    drop(b);
    // The caller did not wait for the release: it is still in flight.
    assert!(t.elapsed() < delay / 2, "the drop took {:?}", t.elapsed());
    let s = stats(&rt);
    assert_eq!(s.bytes_releasing, 96 * MIB as u64, "{s:?}");
    assert!(numapin::internals::numa::is_mapped(a_addr));
    // Growing waits for it: its budget, memory and locked bytes are free
    // by the time the next region is made.
    let c = rt.alloc_on_node(node, 200 * MIB).unwrap();
    let s = stats(&rt);
    assert_eq!(s.bytes_releasing, 0, "{s:?}");
    assert_eq!(s.regions, 2, "the kept region and the new one: {s:?}");
    assert!(
        !numapin::internals::numa::is_mapped(a_addr),
        "region a still mapped"
    );
    // Dropping the runtime waits for the release thread: nothing stays
    // locked or mapped afterwards.
    let d = rt.alloc_on_node(node, 100 * MIB).unwrap();
    drop(c);
    drop(d);
    assert!(stats(&rt).bytes_releasing > 0);
    drop(rt);
    numapin::internals::release_delay(std::time::Duration::ZERO);
    assert_eq!(locked_bytes(), before);
}

#[test]
fn a_driver_backend_without_a_driver_names_the_default_backend() {
    let _g = serial();
    for backend in [Backend::DriverNuma, Backend::HostAllocBound] {
        let mut c = std::process::Command::new(std::env::current_exe().unwrap());
        c.args([
            "--exact",
            "--ignored",
            "child_driver_backend_without_a_driver",
            "--nocapture",
        ])
        .env("NUMAPIN_NO_CUDA", "1")
        .env("NUMAPIN_TEST_BACKEND", backend.as_str());
        let o = c.output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(out.contains("1 passed"), "{out}");
        assert!(
            out.contains(&format!("the {} backend", backend.as_str())),
            "{out}"
        );
    }
}

#[test]
#[ignore = "runs in a child process with NUMAPIN_NO_CUDA=1: started by a_driver_backend_without_a_driver_names_the_default_backend"]
fn child_driver_backend_without_a_driver() {
    let Ok(name) = std::env::var("NUMAPIN_TEST_BACKEND") else {
        return;
    };
    let backend = Backend::ALL
        .into_iter()
        .find(|b| b.as_str() == name)
        .unwrap();
    let cfg = RuntimeConfig::default().with_backend(backend);
    let rt = Runtime::new(topology(CudaMode::Off), cfg).unwrap();
    let node = first_node(&rt);
    let e = rt.alloc_on_node(node, MIB).unwrap_err();
    assert!(matches!(e, ArenaError::Backend { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains(&format!("node {node}")), "{msg}");
    let fix = e.fix().unwrap();
    assert!(fix.contains("Backend::Mapped"), "{fix}");
    assert_eq!(e.kind(), numapin::ErrorKind::System);
    println!("{msg}: fix: {fix}");
    // Nothing was left pinned or counted.
    let s = &rt.stats()[0];
    assert_eq!((s.regions, s.bytes_reserved), (0, 0), "{s:?}");
}

// ---- GPU tests: run with --ignored on a machine with a CUDA GPU. ----

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU machine"]
fn gpu_driver_backends_give_placed_memory_that_copies() {
    let _g = serial();
    if !numapin::internals::cuda::available() {
        eprintln!("skipped: no CUDA driver");
        return;
    }
    let t = topology(CudaMode::Auto);
    let Some(gpu) = t.gpus.iter().find_map(|g| g.cuda_ordinal) else {
        eprintln!("skipped: no GPU");
        return;
    };
    numapin::internals::cuda::set_device(gpu.get()).unwrap();
    for backend in Backend::ALL {
        let rt = Runtime::new(t.clone(), RuntimeConfig::default().with_backend(backend)).unwrap();
        let n = 64 * MIB;
        let mut src = rt.alloc_for_gpu(gpu, n).unwrap();
        let node = src.node();
        src.as_mut_slice_of::<u32>()
            .iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i as u32).wrapping_mul(2654435761));
        let mut dst = rt.alloc_for_gpu(gpu, n).unwrap();
        dst.fill(0);
        let dev = numapin::internals::cuda::DeviceBuffer::new(n).unwrap();
        let stream = numapin::internals::cuda::Stream::new().unwrap();
        // SAFETY: dev holds n bytes in the current context; neither buffer
        // is touched before the stream is synchronised.
        unsafe {
            src.copy_to_device_async(dev.ptr(), stream.raw()).unwrap();
            dst.copy_from_device_async(dev.ptr(), stream.raw()).unwrap();
        }
        stream.synchronize().unwrap();
        assert!(
            dst.as_slice_of::<u32>()
                .iter()
                .enumerate()
                .all(|(i, &x)| x == (i as u32).wrapping_mul(2654435761)),
            "{backend:?}: data differs after the round trip"
        );
        let s = rt.stats().into_iter().find(|s| s.node == node).unwrap();
        assert!(s.regions >= 1, "{s:?}");
        if backend != Backend::Mapped {
            assert_eq!(s.regions_driver, s.regions, "{backend:?}: {s:?}");
            // Pages are verified on the node (or said to be unverifiable).
            assert!(
                s.regions_unverified == s.regions || s.pages_on_node > 0,
                "{backend:?}: {s:?}"
            );
        }
        assert_eq!(s.pages_off_node, 0, "{backend:?}: {s:?}");
        println!("{backend:?}: {}", s.methods());
        drop((src, dst));
        drop(rt);
    }
}
