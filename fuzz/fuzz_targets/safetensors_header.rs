#![no_main]
//! safetensors headers and indexes: parsing never panics; what parses is
//! tensors that do not overlap, lie inside the file after its header and
//! end at its end, and is what the `safetensors` crate reads from the same
//! bytes (numapin never accepts what the crate refuses); what an index
//! parses to names each tensor once and only plain relative files; the
//! rank rule splits any sizes into contiguous shares below the world size.
use libfuzzer_sys::fuzz_target;
use numapin::storage::safetensors::{fuzzing, MAX_DIMS};

fuzz_target!(|data: &[u8]| {
    header(data);
    // The same bytes as a header's JSON, behind a length that fits them.
    let mut file = (data.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(data);
    header(&file);
    index(data);
    ranks(data);
});

fn header(data: &[u8]) {
    let Ok(ts) = fuzzing::parse_file(data) else {
        return;
    };
    let theirs = safetensors::SafeTensors::deserialize(data)
        .expect("numapin reads a header the safetensors crate refuses");
    assert_eq!(ts.len(), theirs.len(), "a different number of tensors");
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for t in &ts {
        let v = theirs
            .tensor(&t.name)
            .expect("a tensor the crate does not see");
        assert_eq!(v.dtype(), t.dtype);
        assert_eq!(v.shape(), &t.shape[..]);
        assert_eq!(v.data().len(), t.len);
        assert!(t.shape.len() <= MAX_DIMS);
        assert!(t.offset >= 8 && t.offset + t.len as u64 <= data.len() as u64);
        let at = v.data().as_ptr() as usize - data.as_ptr() as usize;
        if t.len > 0 {
            assert_eq!(at as u64, t.offset, "the crate's bytes are elsewhere");
        }
        ranges.push((t.offset, t.offset + t.len as u64));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlapping tensors");
    }
    if let Some(last) = ranges.iter().filter(|r| r.1 > r.0).last() {
        assert_eq!(last.1, data.len() as u64, "the data ends at the file's end");
    }
}

fn index(data: &[u8]) {
    let Ok(map) = fuzzing::parse_index(data) else {
        return;
    };
    for f in map.values() {
        let p = std::path::Path::new(f);
        assert!(!f.is_empty() && !p.is_absolute());
        assert!(p
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_))));
    }
}

fn ranks(data: &[u8]) {
    let sizes: Vec<u64> = data
        .chunks(4)
        .map(|c| c.iter().fold(0u64, |a, &b| a * 256 + u64::from(b)))
        .collect();
    let world = usize::from(data.first().copied().unwrap_or(1) % 9) + 1;
    let ranks = fuzzing::shard_ranks(&sizes, world);
    assert_eq!(ranks.len(), sizes.len());
    assert!(
        ranks.windows(2).all(|w| w[0] <= w[1]),
        "shares are contiguous runs"
    );
    assert!(ranks.iter().all(|&r| r < world));
}
