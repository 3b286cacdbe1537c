//! Measurements behind `numapin bench`, the criterion benches and the GPU
//! examples, each with a baseline taken in the same run. Reached through
//! [`crate::internals`].

pub mod arena;
pub mod kernels;
pub mod loader;
pub mod pinning;
