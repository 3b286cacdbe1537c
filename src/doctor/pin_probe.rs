//! The pin probe: on each NUMA node, a small region made exactly as the
//! arena makes one with the default configuration (the arena's
//! `Region::create`: the pages `HugePages::Auto` picks, a 2 MiB hugetlb
//! page when the node's pool has one free, else MADV_HUGEPAGE when THP
//! allows; mmap, MADV_DONTFORK, `mbind(MPOL_BIND)` to the node, touch,
//! `mlock`, CUDA registration when the driver is loaded), then every 4 KiB
//! page's node read back with `move_pages`, then torn down (unregister,
//! munlock, munmap) before the next node. Where the arena falls back (first
//! touch when `mbind` is refused, registration pinning when RLIMIT_MEMLOCK
//! is too low, `/proc/self/numa_maps` when `move_pages` is refused), so
//! does the probe, and its evidence says which method each step used.
//!
//! Reading placement is retried briefly when some pages report an error
//! (with automatic NUMA balancing, `move_pages` can report `-EFAULT` for
//! pages that are there while the kernel scans them; bound memory normally
//! reads back cleanly). Nodes without memory, or outside the memory nodes
//! the process may use, are skipped with an `ok` saying so: the
//! `gpu_memory_allowed` check judges whether that matters.

use std::time::Duration;

use super::check::Check;
use crate::arena::fmt_bytes;
use crate::arena::region::{Region, RegionOptions, Registration};
use crate::platform::sys;
use crate::report::with_causes;
use crate::runtime::{
    Backend, OffNode, PinnedBy, PlacedBy, RegionMethods, RuntimeConfig, RuntimeError, Step,
};
use crate::topology::{NumaNode, Topology};

/// The probe region's size: one 2 MiB huge page (the arena's smallest
/// region), small enough for an 8 MiB memlock limit.
pub(crate) const DEFAULT_PROBE_BYTES: usize = 2 << 20;
/// How many times placement is read before the probe gives up on pages
/// that report an error.
pub(crate) const READS: u32 = 5;
const NAME: &str = "pin_probe";

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProbeOutcome {
    /// The node probed.
    pub(crate) node: u32,
    /// Bytes of the region.
    pub(crate) bytes: u64,
    /// 4 KiB pages checked.
    pub(crate) pages: u64,
    /// Pages on the node.
    pub(crate) on_node: u64,
    /// Pages on other nodes, per node.
    pub(crate) elsewhere: Vec<(u32, u64)>,
    /// Pages whose placement read back as an error (not present, -EFAULT).
    pub(crate) errors: u64,
    /// CUDA registration: `None` when registered, otherwise why not.
    pub(crate) not_registered: Option<String>,
    /// How many times placement was read.
    pub(crate) reads: u32,
    /// How the region was placed, pinned and verified.
    pub(crate) methods: RegionMethods,
    /// Why a fallback method was used (the region's notes).
    pub(crate) notes: Vec<String>,
}

/// One probe per NUMA node of a live topology.
/// `bytes` is each region's size; `cuda`: register it with CUDA when the
/// driver is loaded.
pub(crate) fn probe_all(t: &Topology, bytes: usize, cuda: bool) -> Vec<Check> {
    if t.numa_nodes.is_empty() {
        return vec![Check::warn(
            NAME,
            "the topology lists no NUMA node, so there is nothing to probe",
            "check `numapin topo`: hwloc found no NUMA node on this machine",
        )];
    }
    t.numa_nodes
        .iter()
        .map(|n| probe_node(t, n, bytes, cuda))
        .collect()
}

/// Whether a node can be probed: `Some(reason)` when it is skipped.
pub(crate) fn skip_reason(t: &Topology, n: &NumaNode) -> Option<String> {
    if n.memory_bytes == 0 {
        return Some(format!(
            "node {}: no memory (a CPU-only or device node), nothing can be pinned there; skipped",
            n.os_index
        ));
    }
    if !t.allowed.numa_nodes.is_empty() && !t.allowed.numa_nodes.contains(&n.os_index) {
        return Some(format!(
            "node {}: not among the memory nodes this process may use (cpuset.mems); skipped",
            n.os_index
        ));
    }
    None
}

/// Probes one node (see the module docs) and judges the result.
pub(crate) fn probe_node(t: &Topology, n: &NumaNode, bytes: usize, cuda: bool) -> Check {
    if let Some(why) = skip_reason(t, n) {
        return Check::ok(NAME, why).for_node(n.os_index);
    }
    judge(n.os_index, run(t, n, bytes, cuda))
}

fn run(t: &Topology, n: &NumaNode, bytes: usize, cuda: bool) -> Result<ProbeOutcome, RuntimeError> {
    let node = n.os_index;
    let region = Region::create(&RegionOptions {
        node,
        size: bytes,
        cpus: n.cpus.intersection(&t.allowed.cpus),
        populate_threads: 1,
        register: cuda,
        off_node: OffNode::Warn,
        pin_by_registration: memlock_too_low(bytes),
        backend: Backend::Mapped,
        huge_pages: RuntimeConfig::default().huge_pages,
        register_part_bytes: 0,
        pool_root: None,
        shared: None,
        fail_after: None,
    })?;
    let mut outcome = ProbeOutcome {
        node,
        bytes: region.len() as u64,
        pages: 0,
        on_node: 0,
        elsewhere: Vec::new(),
        errors: 0,
        not_registered: match region.registration() {
            Registration::Registered => None,
            Registration::Skipped(why) => Some(why.clone()),
        },
        reads: 0,
        methods: region.methods(),
        notes: region.notes().to_vec(),
    };
    for read in 1..=READS {
        let c = region
            .count_pages()
            .map_err(|source| RuntimeError::System {
                node,
                size: region.len() as u64,
                step: Step::Verify,
                source,
            })?;
        outcome.pages = c.pages;
        outcome.on_node = c.on(node);
        outcome.errors = c.missing;
        outcome.elsewhere = c.elsewhere(node);
        outcome.methods.verified = c.by;
        outcome.reads = read;
        if c.missing == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(region);
    Ok(outcome)
}

/// When RLIMIT_MEMLOCK (without CAP_IPC_LOCK) leaves less than `bytes`
/// to lock, the reason, as the arena gives it (the probe is then pinned by
/// CUDA registration when the driver is loaded, as arena regions are).
fn memlock_too_low(bytes: usize) -> Option<String> {
    if sys::has_cap_ipc_lock() {
        return None;
    }
    let soft = sys::memlock_limit().map_or(0, |(s, _)| s);
    let locked = sys::locked_bytes();
    (soft.saturating_sub(locked) < bytes as u64).then(|| {
        format!(
            "RLIMIT_MEMLOCK is {} with {} locked, too low for {}",
            fmt_bytes(soft),
            fmt_bytes(locked),
            fmt_bytes(bytes as u64)
        )
    })
}

/// The verdict on a probe: `ok` when every page is on the node; `fail` when
/// the region could not be made (the arena's error and fix) or a page is
/// elsewhere or unreadable.
pub(crate) fn judge(node: u32, r: Result<ProbeOutcome, RuntimeError>) -> Check {
    let o = match r {
        Ok(o) => o,
        Err(e) => {
            let problem = with_causes(&e);
            return Check::fail(
                NAME,
                format!("node {node}: a pinned region could not be made as the arena makes it: {problem}"),
                e.fix().unwrap_or_else(|| "see the error above".into()),
            )
            .for_node(node);
        }
    };
    let registered = match &o.not_registered {
        None => "registered with CUDA".to_string(),
        Some(why) => format!("not registered with CUDA ({why})"),
    };
    let placed = match o.methods.placed {
        PlacedBy::Mbind => "bound (MPOL_BIND), touched".to_string(),
        PlacedBy::FirstTouch => "placed by first touch".to_string(),
        other => other.as_str().replace('_', " "),
    };
    let pinned = match o.methods.pinned {
        PinnedBy::Mlock => "locked",
        PinnedBy::Registration => "pinned by CUDA registration (not locked)",
        PinnedBy::Hugetlb => "hugetlb (never swapped, not locked)",
        _ => "pinned by the driver",
    };
    let notes = if o.notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", o.notes.join("; "))
    };
    let made = format!(
        "node {node}: {} region of {} mapped, {placed}, {pinned}, {registered}{notes}",
        fmt_bytes(o.bytes),
        o.methods.pages.words()
    );
    let by = o.methods.verified.as_str();
    let reads = if o.reads > 1 {
        format!(" after {} reads", o.reads)
    } else {
        String::new()
    };
    if o.on_node == o.pages && o.errors == 0 {
        return Check::ok(
            NAME,
            format!("{made}; {by}: all {} pages on node {node}{reads}", o.pages),
        )
        .for_node(node);
    }
    let mut where_ = o
        .elsewhere
        .iter()
        .map(|(n, c)| format!("{c} on node {n}"))
        .collect::<Vec<_>>();
    if o.errors > 0 {
        where_.push(format!("{} unreadable (not present or -EFAULT)", o.errors));
    }
    Check::fail(
        NAME,
        format!(
            "{made}; {by}: {} of {} pages on node {node}, {}{reads}",
            o.on_node,
            o.pages,
            where_.join(", ")
        ),
        match o.methods.placed {
            PlacedBy::Mbind => format!("pages bound to node {node} did not stay there: check free memory on the node (`numastat -m`), memory hot-unplug or a cgroup memory limit, and whether something migrates pages (`migratepages`, memory tiering); arenas on this node would be refused"),
            PlacedBy::FirstTouch => format!("first touch did not put the pages on node {node}: the process needs CPUs of node {node} (cpuset), the default memory policy (no `numactl --membind` around the container) and free memory on the node (`numastat -m`); or allow mbind: `docker run --cap-add SYS_NICE`, Kubernetes securityContext.capabilities.add: [\"SYS_NICE\"]; arenas on this node would be refused"),
            _ => format!("the driver did not put the pages on node {node}: check free memory on the node (`numastat -m`)"),
        },
    )
    .for_node(node)
}
