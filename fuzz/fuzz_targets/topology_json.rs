#![no_main]
//! numapin JSON (`topo --json` files): never panics, memory follows what
//! the input is (run with `-rss_limit_mb`: a small file whose CPU lists or
//! counts claim millions is refused before they are built), and what loads
//! is within the limits and consistent.
use libfuzzer_sys::fuzz_target;
use numapin::topology::limits::{MAX_CPUS, MAX_GPUS, MAX_NODES};

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(t) = numapin::internals::fuzzing::load_json_str(s) {
            assert!(t.numa_nodes.len() <= MAX_NODES as usize);
            assert!(t.gpus.len() <= MAX_GPUS);
            assert!(t.all_cpus().iter().all(|c| c < MAX_CPUS));
            for g in &t.gpus {
                if let Some(n) = g.numa_node {
                    assert!(t.node(n).is_some());
                }
            }
            for &n in &t.allowed.numa_nodes {
                assert!(t.node(n).is_some());
            }
            let _ = t.to_text();
        }
    }
});
