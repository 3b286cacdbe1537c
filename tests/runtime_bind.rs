//! `Runtime::bind_current_thread`: a thread lands on its GPU's node CPUs.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

use numapin::runtime::{Runtime, RuntimeConfig};
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
            let plan = rt.bind_current_thread(numapin::CudaOrdinal(0)).unwrap();
            assert_eq!(plan.cpus, expect);
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
    let e = rt.bind_current_thread(numapin::CudaOrdinal(3)).unwrap_err();
    assert_eq!(e.kind(), numapin::ErrorKind::Input, "{e}");
    assert!(e.to_string().contains("CUDA device 3"), "{e}");
}
