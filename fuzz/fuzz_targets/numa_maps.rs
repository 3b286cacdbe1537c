#![no_main]
//! `/proc/self/numa_maps` and `/proc/self/maps` text with an address range
//! (the arena's placement check when `move_pages` is refused): never
//! panics, and what comes back is consistent: bounds are ordered, the
//! minimums fit in the range and the maximums cover it.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| numapin::internals::fuzz_numa_maps(data));
