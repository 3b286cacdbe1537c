//! Measurements behind `numapin bench`, the criterion benches and the GPU
//! examples, each with a baseline taken in the same run: an expert API,
//! compiled only with the `measure` feature (the command-line tools turn it
//! on; a trainer embedding the library does not carry it).
//!
//! * [`arena`]: allocation and region creation costs, the [`Stats`](arena::Stats)
//!   every figure is summarised by;
//! * [`copy`]: copy rates from pageable, driver-pinned and arena memory;
//! * [`pinning`]: region creation per step, per backend and per setting;
//! * [`cold_pin`]: regions of several GiB made from nothing, by each way of
//!   making them (in parts, pages, threads, faulting in, registration flags);
//! * [`loader`]: loaders and staged copies against their stages alone;
//! * [`kernels`]: the small CUDA kernels the GPU checks run.

pub mod arena;
pub mod cold_pin;
pub mod copy;
pub mod kernels;
pub mod loader;
pub mod pinning;

/// Milliseconds per GiB of `d` spent on `bytes` bytes (how regions and
/// pinned allocations are timed).
pub(crate) fn ms_per_gib(d: std::time::Duration, bytes: usize) -> f64 {
    d.as_secs_f64() * 1e3 * f64::from(1u32 << 30) / crate::num::f64_from_usize(bytes)
}
