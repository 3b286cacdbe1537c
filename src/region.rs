//! One region of pinned memory made by hand: the expert layer under the
//! arena, for probes and benchmarks. **No budget counts it.**
//!
//! Programs that want pinned memory ask a [`Runtime`](crate::Runtime)
//! ([`Runtime::alloc`](crate::Runtime::alloc), or [`crate::shared`] for
//! memory other processes map): it makes regions for its arenas, lends
//! buffers from them and counts every byte in the node's budget (and the
//! memory cgroup's). A [`Region`] is one such mapping on its own:
//! [`Region::create`] runs the steps (map, advise, bind, populate, lock,
//! register with CUDA, check where every page is) with the options given,
//! records how long each step took ([`StepTimes`]) and how the memory was
//! placed, pinned and checked ([`RegionMethods`]), and undoes everything on
//! drop. `numapin bench --only pinning` and the doctor's pin probe make
//! regions this way. Nothing counts a region made here: no node budget, no
//! cgroup share, no [`NodeStats`](crate::runtime::NodeStats), no `numapin
//! ps` report; only the memlock limit applies. The caller decides how much
//! to pin.
//!
//! A *region*, here and everywhere in numapin, is one mapping of pinned
//! memory made by these steps: the arena carves buffers out of its
//! regions, and a [`SharedRegion`](crate::shared::SharedRegion) is a region
//! over a shared file.

pub use crate::arena::region::{
    thp_enabled, PageCounts, Region, RegionOptions, Registration, SharedFile, Step, StepTimes,
    HUGE_PAGE, PAGE, VERIFY_SPLIT_BYTES, VERIFY_THREADS,
};
pub use crate::arena::{
    Backend, HugePages, OffNode, PageKind, PinnedBy, PlacedBy, RegionMethods, VerifiedBy,
};
