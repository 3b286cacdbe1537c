#![no_main]
//! cpulists and CPU masks: parse never panics, and what parses prints back
//! to the same set.
use libfuzzer_sys::fuzz_target;
use numapin::CpuList;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(set) = CpuList::parse(s) {
            assert_eq!(CpuList::parse(&set.to_cpulist()).unwrap(), set);
        }
        let _ = CpuList::parse_mask(s);
    }
});
