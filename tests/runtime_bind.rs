//! `Runtime::bind_current_thread`: a thread lands on its GPU's node CPUs,
//! `Runtime::place`'s answer.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

mod common;

use numapin::runtime::{Runtime, RuntimeConfig, Target};
use numapin::topology::{CudaMode, Gpu, Topology, VisibleEntry};

/// This machine, with a stand-in GPU on node 0 visible as CUDA device 0.
fn with_gpu_on_node0() -> Topology {
    let mut t =
        Topology::probe(&numapin::topology::ProbeOptions::default().with_cuda(CudaMode::Off))
            .unwrap();
    t.gpus.clear();
    let node0 = t.numa_nodes[0].clone();
    t.gpus.push(Gpu {
        index: numapin::GpuIndex(0),
        cuda_ordinal: Some(numapin::CudaOrdinal(0)),
        pci_bus_id: "0000:07:00.0".into(),
        name: None,
        uuid: None,
        numa_node: Some(node0.os_index),
        package: node0.package,
        local_cpus: node0.cpus.clone(),
        pcie: None,
        vendor_id: "0x10de".into(),
        device_id: "0x2330".into(),
        class_id: "0x0302".into(),
    });
    t.cuda.ordinals = vec![VisibleEntry {
        ordinal: numapin::CudaOrdinal(0),
        entry: "*".into(),
        gpu: Some(numapin::GpuIndex(0)),
        mig: false,
    }];
    t
}

#[test]
fn thread_binds_to_its_gpus_node() {
    let t = with_gpu_on_node0();
    let expect = t.numa_nodes[0].cpus.intersection(&t.allowed.cpus);
    let rt = Runtime::new(t, RuntimeConfig::default()).unwrap();
    let got = std::thread::scope(|s| {
        s.spawn(|| {
            let site = rt
                .bind_current_thread(Target::Gpu(numapin::CudaOrdinal(0)))
                .unwrap();
            assert_eq!(site.cpus, expect);
            assert_eq!(
                site,
                rt.place(Target::Gpu(numapin::CudaOrdinal(0))).unwrap()
            );
            numapin::internals::thread_cpus().unwrap()
        })
        .join()
        .unwrap()
    });
    assert_eq!(got, expect);
}

#[test]
fn unknown_gpu_is_a_usage_error() {
    let rt = Runtime::new(with_gpu_on_node0(), RuntimeConfig::default()).unwrap();
    let e = rt
        .bind_current_thread(Target::Gpu(numapin::CudaOrdinal(3)))
        .unwrap_err();
    assert_eq!(e.kind(), numapin::ErrorKind::Input, "{e}");
    assert!(e.to_string().contains("GPU 3 (CUDA ordinal)"), "{e}");
    // The same error as the placement's.
    let p = rt.place(Target::Gpu(numapin::CudaOrdinal(3))).unwrap_err();
    assert_eq!(e.to_string(), p.to_string());
}

/// `Runtime::bind_current_process`: every thread onto the placement's CPUs
/// and the memory policy `MPOL_BIND` to its node (in a child process: the
/// binding is the whole process's).
#[test]
fn process_binds_to_the_placements_cpus_and_node() {
    let Some(out) = common::run_child("child_process_binding", &[], || Ok(())) else {
        return;
    };
    common::assert_child_passed(&out);
}

#[test]
#[ignore = "runs in a child process: started by process_binds_to_the_placements_cpus_and_node"]
fn child_process_binding() {
    use numapin::system::{PolicyMode, ThreadPolicy};
    if !common::in_child("child_process_binding") {
        return;
    }
    let rt = Runtime::new(with_gpu_on_node0(), RuntimeConfig::default()).unwrap();
    let gpu = Target::Gpu(numapin::CudaOrdinal(0));
    let want = rt.place(gpu).unwrap();
    // A thread started before the binding, still on the old CPU set, moves too.
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (back, done) = std::sync::mpsc::channel();
    let other = std::thread::spawn(move || {
        wait.recv().unwrap();
        back.send(numapin::internals::thread_cpus().unwrap())
            .unwrap();
    });
    let site = rt.bind_current_process(gpu).unwrap();
    go.send(()).unwrap();
    assert_eq!((site.node, &site.cpus), (want.node, &want.cpus));
    assert_eq!(numapin::internals::thread_cpus().unwrap(), want.cpus);
    assert_eq!(done.recv().unwrap(), want.cpus);
    other.join().unwrap();
    match ThreadPolicy::read_under(std::path::Path::new("/")) {
        Ok(p) if site.warnings.is_empty() => {
            assert_eq!((p.mode, p.nodes), (PolicyMode::Bind, vec![want.node]));
        }
        // A seccomp profile refused set_mempolicy: the site says so.
        _ => assert!(
            site.warnings.iter().any(|w| w.contains("set_mempolicy")),
            "{:?}",
            site.warnings
        ),
    }
}
