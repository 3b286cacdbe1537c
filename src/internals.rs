//! Not part of numapin's API: the internals numapin's own command-line
//! tools, tests, benches, examples and fuzz targets use. Nothing here is
//! stable or documented for other users; it may change in any release.

pub use crate::affinity::apply::{exec, find_program};
pub use crate::arena::alloc;
pub use crate::arena::region::{
    last_mapped_addr, thp_enabled, PageCounts, Region, RegionOptions, Registration, StepTimes,
    HUGE_PAGE, PAGE, VERIFY_SPLIT_BYTES, VERIFY_THREADS,
};
pub use crate::arena::{fmt_bytes, NodeArena};
pub use crate::measure::{arena as arena_measure, kernels, loader as loader_measure, pinning};
pub use crate::platform::{cgroup, cleanup, container, cuda, hugetlb, numa, numa_maps, probe, sys};
pub use crate::report::{quote, shorten, table};
pub use crate::topology::hwloc::export_live_xml;

use crate::runtime::{RuntimeConfig, Step};

/// Test hook: region creation fails right after `step`, as if it had.
pub fn fail_after(config: &mut RuntimeConfig, step: Option<Step>) {
    config.hooks.fail_after = step;
}

/// Test hook: skip the RLIMIT_MEMLOCK check before mlock, so that mlock
/// itself fails.
pub fn skip_memlock_check(config: &mut RuntimeConfig, skip: bool) {
    config.hooks.skip_memlock_check = skip;
}

/// Test hook: the background release thread waits this long before each
/// region it releases (to observe a release in flight).
pub fn release_delay(delay: std::time::Duration) {
    crate::arena::release::DELAY_MS.store(
        delay.as_millis() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// Test hook: read the memory cgroup limits under `root` (a fake
/// filesystem root with `proc/self/cgroup`, `proc/self/mountinfo` and the
/// cgroup files) instead of `/`.
pub fn cgroup_root(config: &mut RuntimeConfig, root: Option<std::path::PathBuf>) {
    config.hooks.cgroup_root = root;
}

/// Test hook: read the huge page pools (`sys/devices/system/node/node*/
/// hugepages`, `sys/kernel/mm/hugepages`) under `root` instead of `/`.
pub fn pool_root(config: &mut RuntimeConfig, root: Option<std::path::PathBuf>) {
    config.hooks.pool_root = root;
}

/// The fuzzing entry points of the topology readers.
pub use crate::topology::fuzzing;
