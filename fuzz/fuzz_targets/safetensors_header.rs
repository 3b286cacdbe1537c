#![no_main]
//! safetensors headers and indexes: parsing never panics; what parses is
//! tensors that do not overlap, lie inside the file after its header and
//! end at its end; the rank rule splits any sizes into contiguous shares
//! below the world size.
use libfuzzer_sys::fuzz_target;
use numapin::storage::safetensors::fuzzing;

fuzz_target!(|data: &[u8]| {
    if let Ok(ts) = fuzzing::parse_file(data) {
        let mut ranges: Vec<(u64, u64)> = ts
            .iter()
            .map(|t| (t.offset, t.offset + t.len as u64))
            .collect();
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            assert!(w[0].1 <= w[1].0, "overlapping tensors");
        }
        if let Some(last) = ranges.iter().filter(|r| r.1 > r.0).last() {
            assert_eq!(last.1, data.len() as u64, "the data ends at the file's end");
        }
        for t in &ts {
            assert!(t.offset >= 8 && t.offset + t.len as u64 <= data.len() as u64);
        }
    }
    let _ = fuzzing::parse_index(data);
    let sizes: Vec<u64> = data
        .chunks(4)
        .map(|c| c.iter().fold(0u64, |a, &b| a * 256 + u64::from(b)))
        .collect();
    let world = usize::from(data.first().copied().unwrap_or(1) % 9) + 1;
    let ranks = fuzzing::shard_ranks(&sizes, world);
    assert_eq!(ranks.len(), sizes.len());
    assert!(ranks.windows(2).all(|w| w[0] <= w[1]), "shares are contiguous runs");
    assert!(ranks.iter().all(|&r| r < world));
});
