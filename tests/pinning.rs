//! Pinning itself: the time of each creation step, the two exact placement
//! checks agreeing, large regions released off the caller's thread (and
//! never outliving the runtime), and the driver backends: a clear error
//! without a driver, and on a GPU machine (`--ignored`) memory on its node
//! that copies to and from the GPU.
// Test data: counts, sizes, indices and byte patterns far inside every type's range.
#![allow(clippy::cast_possible_truncation)]
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

mod common;

use std::sync::{Mutex, MutexGuard};

use numapin::region::{Region, RegionOptions};
use numapin::runtime::{
    Backend, OffNode, Runtime, RuntimeConfig, RuntimeError, Target, VerifiedBy,
};
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
    numapin::internals::locked_bytes()
}

fn options(node: u32, size: usize, backend: Backend) -> RegionOptions {
    RegionOptions {
        node,
        size,
        cpus: numapin::CpuList::new(),
        populate_threads: 2,
        register: true,
        off_node: OffNode::Strict,
        pin_by_registration: None,
        backend,
        huge_pages: numapin::runtime::HugePages::Transparent,
        register_part_bytes: 0,
        pool_root: None,
        shared: None,
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
fn a_region_made_in_parts_is_populated_locked_and_counted_whole() {
    let _g = serial();
    let rt = Runtime::new(topology(CudaMode::Off), RuntimeConfig::default()).unwrap();
    let node = first_node(&rt);
    let before = locked_bytes();
    // 30 MiB in parts of 8 MiB: three whole parts and a short one.
    let o = RegionOptions {
        register_part_bytes: 8 * MIB,
        shared: None,
        ..options(node, 30 * MIB, Backend::Mapped)
    };
    let r = Region::create(&o).unwrap();
    assert_eq!(r.len(), 30 * MIB);
    assert_eq!(r.pages_on_node(), (30 * MIB / 4096) as u64);
    assert_eq!(r.pages_off_node(), 0);
    assert_eq!(r.methods().verified, VerifiedBy::MovePages);
    let times = *r.times();
    assert!(
        !times.populate.is_zero() && !times.verify.is_zero(),
        "{times:?}"
    );
    // Every page is locked (VmLck counts the whole region) and present.
    assert_eq!(locked_bytes() - before, 30 * MIB as u64);
    let counts = r.count_pages_numa_maps().unwrap();
    assert_eq!(counts.on(node), (30 * MIB / 4096) as u64, "{counts:?}");
    // The same options with one part (the region's size) take the usual
    // path and give the same result.
    let whole = Region::create(&RegionOptions {
        register_part_bytes: 30 * MIB,
        shared: None,
        ..o.clone()
    })
    .unwrap();
    assert_eq!(whole.pages_on_node(), r.pages_on_node());
    drop((r, whole));
    assert_eq!(locked_bytes(), before, "parts left locked");
    // A failure after the parts are in leaves nothing locked or mapped.
    let e = Region::create(&RegionOptions {
        shared: None,
        fail_after: Some(numapin::runtime::Step::Populate),
        ..o
    })
    .unwrap_err();
    assert!(e.to_string().contains("failed at Populate"), "{e}");
    assert_eq!(locked_bytes(), before, "a failed region left pages locked");
    assert!(!numapin::internals::is_mapped(
        numapin::internals::last_mapped_addr()
    ));
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
    let a = rt.alloc(Target::HostNode(node), 96 * MIB).unwrap();
    let b = rt.alloc(Target::HostNode(node), 96 * MIB).unwrap();
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
    assert!(numapin::internals::is_mapped(a_addr));
    // Growing waits for it: its budget, memory and locked bytes are free
    // by the time the next region is made.
    let c = rt.alloc(Target::HostNode(node), 200 * MIB).unwrap();
    let s = stats(&rt);
    assert_eq!(s.bytes_releasing, 0, "{s:?}");
    assert_eq!(s.regions, 2, "the kept region and the new one: {s:?}");
    assert!(
        !numapin::internals::is_mapped(a_addr),
        "region a still mapped"
    );
    // Dropping the runtime waits for the release thread: nothing stays
    // locked or mapped afterwards.
    let d = rt.alloc(Target::HostNode(node), 100 * MIB).unwrap();
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
    let e = rt.alloc(Target::HostNode(node), MIB).unwrap_err();
    assert!(matches!(e, RuntimeError::Backend { .. }), "{e:?}");
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

/// This machine's topology and its first GPU's CUDA ordinal, or `None`
/// (said on stderr) without a driver or a GPU: the test then skips.
fn gpu_topology() -> Option<(Topology, numapin::CudaOrdinal)> {
    if !numapin::gpu::available() {
        common::skip(common::Need::Gpu, "no CUDA driver");
        return None;
    }
    let t = topology(CudaMode::Auto);
    let Some(gpu) = t.gpus.iter().find_map(|g| g.cuda_ordinal) else {
        common::skip(common::Need::Gpu, "no GPU");
        return None;
    };
    Some((t, gpu))
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU machine"]
fn gpu_driver_backends_give_placed_memory_that_copies() {
    let _g = serial();
    let Some((t, gpu)) = gpu_topology() else {
        return;
    };
    numapin::gpu::set_device(gpu.get()).unwrap();
    for backend in Backend::ALL {
        let rt = Runtime::new(t.clone(), RuntimeConfig::default().with_backend(backend)).unwrap();
        let n = 64 * MIB;
        let mut src = rt.alloc(Target::Gpu(gpu), n).unwrap();
        let node = src.node();
        src.as_mut_slice_of::<u32>()
            .iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i as u32).wrapping_mul(2654435761));
        let mut dst = rt.alloc(Target::Gpu(gpu), n).unwrap();
        dst.fill(0);
        let dev = numapin::gpu::DeviceBuffer::new(n).unwrap();
        let stream = numapin::gpu::Stream::new().unwrap();
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

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU machine"]
fn gpu_regions_registered_in_parts_copy_across_parts_and_leave_nothing_registered() {
    use numapin::gpu as cuda;
    use numapin::runtime::Step;
    let _g = serial();
    let Some((t, gpu)) = gpu_topology() else {
        return;
    };
    cuda::set_device(gpu.get()).unwrap();
    let rt = Runtime::new(t, RuntimeConfig::default()).unwrap();
    let node = first_node(&rt);
    let part = 8 * MIB;
    let o = RegionOptions {
        register_part_bytes: part,
        shared: None,
        ..options(node, 4 * part, Backend::Mapped)
    };
    // A failure after registering leaves no part registered: the next
    // region (mapped at the same place, as a rule) registers again.
    for step in [Step::Register, Step::Populate] {
        let e = Region::create(&RegionOptions {
            shared: None,
            fail_after: Some(step),
            ..o.clone()
        })
        .unwrap_err();
        assert!(
            e.to_string().contains(&format!("failed at {step:?}")),
            "{e}"
        );
    }
    let r = Region::create(&o).unwrap();
    assert!(r.registered(), "{:?}", r.registration());
    assert!(
        r.notes()
            .iter()
            .any(|n| n.contains("registered in 4 parts")),
        "{:?}",
        r.notes()
    );
    assert_eq!(r.pages_on_node(), (r.len() / 4096) as u64);
    assert_eq!(r.pages_off_node(), 0);
    let times = r.times();
    assert!(!times.populate.is_zero() && !times.register.is_zero() && !times.verify.is_zero());
    let base = r.ptr() as usize;
    for k in 0..4 {
        cuda::host_get_flags((base + k * part) as *const _)
            .unwrap_or_else(|e| panic!("part {k} is not registered: {e}"));
    }
    // A copy inside one part arrives whole; one across two parts is
    // refused by the drivers measured (580: CUDA_ERROR_INVALID_VALUE),
    // which is why the arena registers each region in one call, and if a
    // driver takes it, it must arrive whole too.
    // SAFETY: the region is mapped and writable for its length, owned by
    // `r`, which outlives the slice; nothing else refers to it.
    let mem = unsafe { std::slice::from_raw_parts_mut(r.ptr(), r.len()) };
    mem.iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i % 253) as u8);
    let dev = cuda::DeviceBuffer::new(part).unwrap();
    let mut back = vec![0u8; part];
    let inside = &mem[part..2 * part];
    dev.write(inside).unwrap();
    dev.read(&mut back).unwrap();
    assert!(back == inside, "a copy inside a part differs");
    let across = &mem[part / 2..part / 2 + part];
    match dev.write(across) {
        Ok(()) => {
            dev.read(&mut back).unwrap();
            assert!(back == across, "a copy across parts differs");
            println!("this driver copies across registrations");
        }
        Err(e) => {
            assert_eq!(e.name(), "CUDA_ERROR_INVALID_VALUE", "{e}");
            println!("a copy across registrations is refused: {e}");
        }
    }
    drop(r);
    for k in 0..4 {
        assert!(
            cuda::host_get_flags((base + k * part) as *const _).is_err(),
            "part {k} is still registered after the region was dropped"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU machine"]
fn gpu_buffers_in_both_halves_of_a_region_in_parts_copy_both_ways() {
    use numapin::gpu as cuda;
    let _g = serial();
    let Some((t, gpu)) = gpu_topology() else {
        return;
    };
    cuda::set_device(gpu.get()).unwrap();
    let rt = Runtime::new(
        t,
        RuntimeConfig::default()
            .with_region_bytes(32 * MIB)
            .with_register_in_parts(true),
    )
    .unwrap();
    let n = 12 * MIB;
    let dev = cuda::DeviceBuffer::new(n).unwrap();
    let stream = cuda::Stream::new().unwrap();
    // Two buffers, one in each half (two registrations) of one region.
    let mut bufs: Vec<_> = (0..2)
        .map(|_| rt.alloc(Target::Gpu(gpu), n).unwrap())
        .collect();
    let s = rt.stats().into_iter().find(|s| s.regions > 0).unwrap();
    assert_eq!(s.regions, 1, "{s:?}");
    for (k, b) in bufs.iter_mut().enumerate() {
        b.as_mut_slice_of::<u32>()
            .iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i as u32).wrapping_mul(2654435761).wrapping_add(k as u32));
    }
    for (k, b) in bufs.iter().enumerate() {
        let mut back = rt.alloc(Target::Gpu(gpu), n).unwrap();
        back.fill(0);
        // SAFETY: dev holds n bytes in the current context; neither host
        // buffer is touched before the stream is synchronised.
        unsafe {
            b.copy_to_device_async(dev.ptr(), stream.raw()).unwrap();
            back.copy_from_device_async(dev.ptr(), stream.raw())
                .unwrap();
        }
        stream.synchronize().unwrap();
        assert!(
            back[..] == b[..],
            "half {k}: data differs after the round trip"
        );
    }
}
