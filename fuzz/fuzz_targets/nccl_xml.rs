#![no_main]
//! NCCL topology XML: never panics; what loads is self-consistent.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(t) = numapin::internals::fuzzing::load_nccl_str(s) {
            for g in &t.gpus {
                if let Some(n) = g.numa_node {
                    assert!(t.node(n).is_some());
                }
            }
            // Every NIC relates to every GPU, and the pairing covers them.
            for n in &t.nics {
                assert_eq!(n.gpu_relations.len(), t.gpus.len());
            }
            assert_eq!(t.nic_pairing().len(), t.gpus.len());
        }
    }
});
