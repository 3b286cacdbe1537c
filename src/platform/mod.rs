//! Platform code: the CUDA driver, Linux system calls, and the helpers that
//! isolate hwloc and cudarc failures. Private to the crate (reached by
//! numapin's own tools and tests through [`crate::internals`]); the only
//! place besides the arena's region and buffer code where `unsafe` appears,
//! each block with a `// SAFETY:` comment.

pub mod cleanup;
pub mod cuda;
pub(crate) mod isolate;
pub mod numa;
pub(crate) mod panic_guard;
pub(crate) mod pci;
pub mod sys;
