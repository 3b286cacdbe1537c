#![no_main]
//! `/proc/self/numa_maps` and `/proc/self/maps` text with an address range
//! (the arena's placement check when `move_pages` is refused): never
//! panics, and what comes back is consistent: bounds are ordered, the
//! minimums fit in the range and the maximums cover it.
use libfuzzer_sys::fuzz_target;
use numapin::internals::numa_maps::{line_policy, placement, task_policy};

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let start = u64::from_le_bytes(data[0..8].try_into().unwrap());
    let end = u64::from_le_bytes(data[8..16].try_into().unwrap());
    let rest = &data[16..];
    // The first 0xff byte splits numa_maps from maps.
    let (numa, maps) = match rest.iter().position(|&b| b == 0xff) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &b""[..]),
    };
    let _ = task_policy(numa);
    for l in numa.split(|&b| b == b'\n') {
        let _ = line_policy(l);
    }
    if let Ok(p) = placement(numa, maps, start..end) {
        let len = end - start;
        let (mut min, mut max) = (p.not_present.min, p.not_present.max);
        assert!(p.not_present.min <= p.not_present.max);
        for b in p.nodes.values() {
            assert!(b.min <= b.max && b.max <= len);
            min += b.min;
            max = max.saturating_add(b.max);
        }
        assert!(min <= len && max >= len);
    }
});
