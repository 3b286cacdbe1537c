#![no_main]
//! CUDA_VISIBLE_DEVICES: parse and resolve never panic; a resolved list
//! never names a GPU twice unless it is a MIG instance.
use libfuzzer_sys::fuzz_target;
use numapin::topology::VisibleDevices;

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let n = (data[0] % 9) as u32;
    if let Ok(s) = std::str::from_utf8(&data[1..]) {
        if let Ok(v) = VisibleDevices::parse(s) {
            let order: Vec<u32> = (0..n).collect();
            let uuids: Vec<Option<String>> = (0..n)
                .map(|i| Some(format!("GPU-{i:08x}-0000-0000-0000-000000000000")))
                .collect();
            if let Ok((entries, _)) = v.resolve(&order, &uuids) {
                let mut seen = std::collections::HashSet::new();
                for e in entries.iter().filter(|e| !e.mig) {
                    if let Some(g) = e.gpu {
                        assert!(seen.insert(g), "GPU {g} listed twice");
                        assert!(g.get() < n);
                    }
                }
            }
        }
    }
});
