//! What the storage tests share: a runtime without CUDA, the calling
//! thread's node as a target, the arena's leak check, byte patterns, every
//! safetensors dtype numapin handles.
// Test data: counts, sizes, indices and byte patterns far inside every type's range.
#![allow(clippy::cast_possible_truncation)]

use numapin::storage::safetensors::Dtype;
use numapin::topology::{CudaMode, ProbeOptions};
use numapin::{Runtime, RuntimeConfig, Target, Topology};

/// A runtime over this machine, without the CUDA driver, with 64 MiB
/// regions.
pub(crate) fn runtime() -> Runtime {
    runtime_with(64 << 20)
}

/// A runtime over this machine, without the CUDA driver, with regions of
/// `region_bytes`.
pub(crate) fn runtime_with(region_bytes: usize) -> Runtime {
    let opts = ProbeOptions::from_process().with_cuda(CudaMode::Off);
    let t = Topology::probe(&opts).expect("the probe");
    Runtime::new(t, RuntimeConfig::default().with_region_bytes(region_bytes)).expect("a runtime")
}

/// The calling thread's node.
pub(crate) fn node(rt: &Runtime) -> Target {
    Target::HostNode(rt.calling_thread_node())
}

/// Nothing lent by the arena is still out.
#[track_caller]
pub(crate) fn assert_no_leak(rt: &Runtime) {
    for s in rt.stats() {
        assert_eq!(s.bytes_in_use, 0, "node {}: {s:?}", s.node);
        assert_eq!(s.allocations, s.frees, "node {}: {s:?}", s.node);
    }
}

/// `len` bytes that differ with `seed` and along the buffer.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

/// Every safetensors dtype numapin makes tensors of, with its size.
pub(crate) const DTYPES: &[(Dtype, usize)] = &[
    (Dtype::BOOL, 1),
    (Dtype::U8, 1),
    (Dtype::I8, 1),
    (Dtype::F8_E5M2, 1),
    (Dtype::F8_E4M3, 1),
    (Dtype::F8_E8M0, 1),
    (Dtype::I16, 2),
    (Dtype::U16, 2),
    (Dtype::F16, 2),
    (Dtype::BF16, 2),
    (Dtype::I32, 4),
    (Dtype::U32, 4),
    (Dtype::F32, 4),
    (Dtype::F64, 8),
    (Dtype::I64, 8),
    (Dtype::U64, 8),
    (Dtype::C64, 8),
];
