#![no_main]
//! The arena's sub-allocator bookkeeping driven by arbitrary operations:
//! blocks never overlap, stay aligned and in bounds, the structure's own
//! invariants hold after every step, and the accounting balances.
use libfuzzer_sys::fuzz_target;
use numapin::internals::alloc::Tlsf;

fuzz_target!(|data: &[u8]| {
    let granule = 4096u64;
    let mut t = Tlsf::new(granule);
    let mut live: Vec<numapin::internals::alloc::Block> = Vec::new();
    let mut sizes = Vec::new();
    let mut parts: Vec<(u32, u64)> = Vec::new();
    for chunk in data.chunks(4) {
        let op = chunk[0] % 4;
        let arg = chunk
            .iter()
            .skip(1)
            .fold(0u64, |a, b| a << 8 | u64::from(*b));
        match op {
            0 if t.region_count() < 8 => {
                // Every other region in parts (of 1 to 16 granules).
                let size = (arg % 64 + 1) * granule;
                let part = if arg & 1 << 20 != 0 { (arg >> 8) % 16 * granule } else { 0 };
                let r = t.add_region_in_parts(size, part);
                if part != 0 && part < size {
                    parts.push((r, part));
                }
                sizes.push(r);
            }
            1 | 2 => {
                if let Some(b) = t.alloc(arg % (80 * granule) + 1) {
                    assert_eq!(b.offset % granule, 0);
                    assert!(b.offset + b.size <= t.region_size(b.region).unwrap());
                    if let Some(&(_, part)) = parts.iter().find(|p| p.0 == b.region) {
                        assert_eq!(b.offset / part, (b.offset + b.size - 1) / part, "spans parts");
                    }
                    for o in &live {
                        assert!(
                            o.region != b.region
                                || o.offset + o.size <= b.offset
                                || b.offset + b.size <= o.offset,
                            "overlap"
                        );
                    }
                    live.push(b);
                }
            }
            _ if !live.is_empty() => {
                let b = live.swap_remove(arg as usize % live.len());
                t.free(b.id);
            }
            _ => {}
        }
        t.check().unwrap();
        assert_eq!(t.used_bytes(), live.iter().map(|b| b.size).sum::<u64>());
    }
});
