//! What the storage tests share: a CPU-only runtime, the calling thread's
//! node as a target, and the check that nothing lent is still out.

use numapin::topology::{CudaMode, ProbeOptions};
use numapin::{Runtime, RuntimeConfig, Target, Topology};

/// A runtime of this machine without CUDA, with regions of `region_bytes`.
pub(crate) fn runtime(region_bytes: usize) -> Runtime {
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
