#![no_main]
//! Capture archives (`.tar`, `.tar.gz`, `.tar.bz2` given to `--input`):
//! surveying, unpacking and checking never panics, never writes outside
//! the temporary folder, and stays within the limits on entries and bytes
//! actually written (run with `-rss_limit_mb`, and a small `TMPDIR`); the
//! temporary folder is always removed.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = numapin::internals::fuzzing::unpack_capture(data);
});
