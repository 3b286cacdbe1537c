//! One region of pinned memory made by hand: the expert layer under the
//! arena.
//!
//! Most programs want a [`Runtime`](crate::Runtime), which makes regions
//! for its arenas, lends buffers from them and checks every budget. A
//! [`Region`] is one such mapping on its own: [`Region::create`] runs the
//! steps (map, advise, bind, populate, lock, register with CUDA, check
//! where every page is) with the options given, records how long each step
//! took ([`StepTimes`]) and how the memory was placed, pinned and checked
//! ([`RegionMethods`]), and undoes everything on drop. `numapin bench
//! --only pinning` measures regions this way; tools that need one mapping
//! with known steps (a probe, a benchmark) use it too. No budget applies:
//! the caller decides how much to pin.

pub use crate::arena::region::{
    thp_enabled, PageCounts, Region, RegionOptions, Registration, SharedFile, Step, StepTimes,
    HUGE_PAGE, PAGE, VERIFY_SPLIT_BYTES, VERIFY_THREADS,
};
pub use crate::arena::{
    Backend, HugePages, PageKind, PinnedBy, PlacedBy, Placement, RegionMethods, VerifiedBy,
};
