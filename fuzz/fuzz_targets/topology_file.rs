#![no_main]
//! Any file given to `--input` (hwloc XML, numapin JSON, NCCL XML, tarball):
//! loading never panics or crashes the process.
use libfuzzer_sys::fuzz_target;
use std::io::Write;

fuzz_target!(|data: &[u8]| {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(data).unwrap();
    let _ = numapin::topology::Topology::load(f.path(), &Default::default());
});
