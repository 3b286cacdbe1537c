//! Not part of numapin's API: the test hooks numapin's own tests use and
//! the fuzz targets' entry points, compiled only with the `internals`
//! feature (which the tests and `fuzz/` turn on; the command-line tools and
//! the Python package never do). Nothing here is stable.
//!
//! Each hook either makes the library fail or wait where a test needs it
//! to, or reads a fact of this process a test checks the library against
//! (what is mapped, locked, placed); none hands out a platform type.

use crate::cpulist::CpuList;
use crate::runtime::{RuntimeConfig, Step};

/// The TLSF bookkeeping, for the allocator's fuzz target and model test.
pub use crate::arena::alloc;
/// Test hook: the address of the last region mapped by this process.
pub use crate::arena::region::last_mapped_addr;
/// The fuzzing entry points of the topology readers.
pub use crate::topology::fuzzing;

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
        u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
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

/// Test hook: keep the machine budget's state file in `dir` instead of the
/// folder `NUMAPIN_MACHINE_BUDGET_DIR` names (or `/dev/shm`).
pub fn machine_dir(config: &mut RuntimeConfig, dir: Option<std::path::PathBuf>) {
    config.hooks.machine_dir = dir;
}

/// The steps at which [`machine_kill_at`] can kill the process: holding
/// the state file's header lock (`locked`), a record claimed but not
/// written (`claimed`), written with the lock still held (`written`), the
/// lock given back before the region is made (`reserved`), and releasing,
/// the lock taken before the record is rewritten (`releasing`).
pub const MACHINE_KILL_STEPS: [&str; 5] = ["locked", "claimed", "written", "reserved", "releasing"];

/// Test hook: this process kills itself with `SIGKILL` at `step` (one of
/// [`MACHINE_KILL_STEPS`]) the next time it changes the machine budget's
/// state file; `None` turns it off.
///
/// # Panics
///
/// On a step not in [`MACHINE_KILL_STEPS`].
pub fn machine_kill_at(step: Option<&str>) {
    let n = step.map_or(0, |s| {
        crate::arena::machine::KillAt::ALL
            .iter()
            .find(|(_, name)| *name == s)
            .map(|(k, _)| *k as u8)
            .unwrap_or_else(|| panic!("{s} is not one of {MACHINE_KILL_STEPS:?}"))
    });
    crate::arena::machine::KILL_AT.store(n, std::sync::atomic::Ordering::SeqCst);
}

/// Test hook: whether the page holding `addr` is mapped in this process.
pub fn is_mapped(addr: usize) -> bool {
    crate::platform::numa::is_mapped(addr)
}

/// Test hook: bytes this process has locked (`VmLck`).
pub fn locked_bytes() -> u64 {
    crate::platform::sys::locked_bytes()
}

/// Test hook: the CPUs the calling thread may run on.
///
/// # Errors
///
/// The system's error from `sched_getaffinity`.
pub fn thread_cpus() -> std::io::Result<CpuList> {
    crate::platform::sys::sched_getaffinity_self()
}

/// Test hook: binds the calling thread to `cpus` (safe between `fork` and
/// `exec`: one system call, no allocation).
///
/// # Errors
///
/// The system's error from `sched_setaffinity`.
pub fn set_thread_cpus(cpus: &CpuList) -> std::io::Result<()> {
    crate::platform::sys::sched_setaffinity(0, cpus)
}

/// Test hook: a field of `/proc/self/status` (`Seccomp`, `VmLck`, ...).
pub fn proc_status_field(name: &str) -> Option<String> {
    crate::platform::sys::proc_status_field(name)
}

/// Test hook: whether `MADV_POPULATE_WRITE` works on this kernel.
pub fn populate_write_supported() -> bool {
    crate::platform::numa::populate_write_supported()
}

/// Test hook: the node of each 4 KiB page of `bytes` (`move_pages`
/// with no target; a negative errno for a page not present).
///
/// # Errors
///
/// The system's error from `move_pages` (refused under a seccomp profile).
pub fn page_nodes(bytes: &[u8]) -> std::io::Result<Vec<i32>> {
    crate::platform::numa::nodes_of(bytes)
}

/// Fuzz entry point of the `/proc/<pid>/numa_maps` readers: parses `data`
/// (two address words, then `numa_maps` text, `0xff`, `maps` text) and
/// panics when what comes back is inconsistent.
pub fn fuzz_numa_maps(data: &[u8]) {
    crate::platform::numa_maps::fuzz_one(data);
}

/// A ledger of the machine budget's state file in a folder, of its own
/// (two of them on one folder behave as two processes): for the benches'
/// cost of a region's reservation and release.
#[derive(Debug)]
pub struct MachineLedger(crate::arena::machine::Ledger);

impl MachineLedger {
    /// A ledger of the state file in `dir`; touches no file.
    pub fn new(dir: &std::path::Path) -> MachineLedger {
        MachineLedger(crate::arena::machine::Ledger::new(dir))
    }

    /// Reserves `bytes` on `node` under `limit`; whether they fit (a file
    /// that cannot be used is a panic: benches run on their own folder).
    ///
    /// # Panics
    ///
    /// When the state file is refused.
    pub fn reserve(&self, node: u32, bytes: u64, limit: u64) -> bool {
        match self.0.reserve(node, bytes, limit) {
            Ok(()) => true,
            Err(crate::arena::machine::Refusal::Short(_)) => false,
            Err(crate::arena::machine::Refusal::State(e)) => panic!("{e}"),
        }
    }

    /// Gives back `bytes` on `node`.
    pub fn release(&self, node: u32, bytes: u64) {
        self.0.release(node, bytes);
    }
}

/// Fuzz entry point of the machine budget's readers: `data` as a
/// `NUMAPIN_MACHINE_BUDGET` value (what parses prints back to itself) and
/// as a state file (the header check and every record block: what decodes
/// encodes back to itself); panics when they disagree.
pub fn fuzz_machine_budget(data: &[u8]) {
    crate::arena::machine::fuzz_one(data);
}

/// What `/proc/self/numa_maps` says of an address range ([`numa_maps_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaMapsView {
    /// VMAs over the range.
    pub vmas: u32,
    /// VMAs that reach past either end of it (merged with a neighbour).
    pub straddling: u32,
    /// Bytes per node, when every count is exact.
    pub exact_nodes: Option<Vec<(u32, u64)>>,
}

/// Test hook: `/proc/self/numa_maps` (and `maps`) read for `start..end`.
///
/// # Errors
///
/// The system's error reading the files, or the text not parsing.
pub fn numa_maps_of(start: u64, end: u64) -> std::io::Result<NumaMapsView> {
    let p = crate::platform::numa_maps::read_self(start..end, 3)?;
    Ok(NumaMapsView {
        vmas: p.vmas,
        straddling: p.straddling,
        exact_nodes: p.exact_nodes().map(|m| m.into_iter().collect()),
    })
}

/// One `/proc/self/numa_maps` line ([`numa_maps_line`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaMapsLine {
    /// The memory policy (`default`, `bind:0`, ...).
    pub policy: Option<String>,
    /// Whether the VMA is hugetlb memory.
    pub hugetlb: bool,
    /// Its page size (`kernelpagesize_kB`), when the line gives it.
    pub page_bytes: Option<u64>,
    /// Pages per node, in its page size.
    pub nodes: Vec<(u32, u64)>,
}

/// Test hook: the `/proc/self/numa_maps` line of the VMA starting at
/// `start`, parsed.
pub fn numa_maps_line(start: u64) -> Option<NumaMapsLine> {
    use crate::platform::numa_maps as nm;
    let text = std::fs::read("/proc/self/numa_maps").ok()?;
    let line = text
        .split(|&c| c == b'\n')
        .find(|l| nm::line_start(l) == Some(start))?;
    let parsed = nm::parse_line(line).ok()?;
    Some(NumaMapsLine {
        policy: nm::line_policy(line),
        hugetlb: parsed.hugetlb,
        page_bytes: parsed.page_bytes,
        nodes: parsed.nodes,
    })
}

/// Test hook: gives the blocks the calling thread has cached for `node`'s
/// arena back to it; returns how many there were (0 without an arena).
pub fn flush_thread_cache(rt: &crate::runtime::Runtime, node: u32) -> usize {
    rt.arena(node).map_or(0, |a| a.flush_thread_cache())
}

/// Test hook: how many file readers (hwloc in a child process) the calling
/// thread has started; a file refused while it was counted, before hwloc
/// read it, leaves this unchanged.
pub fn hwloc_readers_started() -> u64 {
    crate::platform::isolate::readers_started()
}
