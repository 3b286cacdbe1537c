#![no_main]
//! The machine budget's readers: `NUMAPIN_MACHINE_BUDGET` values (what
//! parses prints back to itself) and the state file's header and records
//! (never panic; what decodes encodes back to itself).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| numapin::internals::fuzz_machine_budget(data));
