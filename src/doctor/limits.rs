//! The limits on what numapin may pin: RLIMIT_MEMLOCK and CAP_IPC_LOCK
//! (`memlock`), and the memory cgroup's limit (`cgroup_memory`).

use super::check::Check;
use super::words::{memory_nodes, nodes_text, visible_gpu_nodes, visible_gpus};
use crate::arena::fmt_bytes;
use crate::runtime::DEFAULT_REGION_BYTES;
use crate::system::{MemlockError, MemlockLimit, MemoryLimits};
use crate::topology::Topology;

/// What numapin needs locked, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemlockNeed {
    /// Bytes.
    pub(crate) bytes: u64,
    /// How many default arena regions that is.
    pub(crate) regions: u64,
    /// The sentence that says where the number comes from.
    pub(crate) basis: String,
}

/// What numapin needs RLIMIT_MEMLOCK to allow: one default arena region
/// ([`DEFAULT_REGION_BYTES`], 256 MiB) on each NUMA node that holds a GPU
/// this process sees (plus one for GPUs whose node is unknown); with no
/// visible GPU, one on each node with memory this process may use. That is
/// what the first pinned buffer on each of those nodes takes.
pub(crate) fn memlock_need(t: &Topology) -> MemlockNeed {
    let region = fmt_bytes(DEFAULT_REGION_BYTES as u64);
    let gpu_nodes = visible_gpu_nodes(t);
    let unknown = visible_gpus(t).filter(|g| g.numa_node.is_none()).count();
    let (regions, basis) = if gpu_nodes.is_empty() && unknown == 0 {
        let nodes = memory_nodes(t);
        (
            nodes.len().max(1) as u64,
            format!(
                "one {region} arena region on each node with memory ({}; no GPU visible)",
                nodes_text(&nodes)
            ),
        )
    } else {
        let mut basis = format!(
            "one {region} arena region on each node with a GPU ({})",
            nodes_text(&gpu_nodes)
        );
        if unknown > 0 {
            basis.push_str(&format!(
                " and one for the {unknown} GPU(s) whose node is unknown"
            ));
        }
        (gpu_nodes.len() as u64 + u64::from(unknown > 0), basis)
    };
    MemlockNeed {
        bytes: regions * DEFAULT_REGION_BYTES as u64,
        regions,
        basis,
    }
}

/// RLIMIT_MEMLOCK (soft, hard) and CAP_IPC_LOCK against [`memlock_need`].
///
/// `ok` with CAP_IPC_LOCK (the limit does not apply), an unlimited soft
/// limit, or a soft limit at least the need; below it, `fail` without the
/// CUDA driver (the arena checks the soft limit before locking, so the
/// first buffer on a node fails) and `warn` with it (`driver`: regions
/// are then pinned by CUDA registration alone, which the limit does not
/// cover); `warn` when the limit cannot be read.
pub(crate) fn memlock(
    t: &Topology,
    limit: &Result<MemlockLimit, MemlockError>,
    cap_ipc_lock: bool,
    driver: bool,
) -> Check {
    const NAME: &str = "memlock";
    let need = memlock_need(t);
    let MemlockLimit { soft, hard } = match limit {
        Ok(l) => *l,
        Err(e) => {
            return Check::warn(
                NAME,
                e.to_string(),
                "check the limit with `ulimit -l` in the shell that starts the job",
            )
        }
    };
    let evidence = format!(
        "RLIMIT_MEMLOCK soft {}, hard {}; {}; numapin needs {}: {}",
        fmt_bytes(soft),
        fmt_bytes(hard),
        if cap_ipc_lock {
            "CAP_IPC_LOCK (the limit does not apply)"
        } else {
            "no CAP_IPC_LOCK"
        },
        fmt_bytes(need.bytes),
        need.basis
    );
    if cap_ipc_lock || soft >= need.bytes {
        return Check::ok(NAME, evidence);
    }
    let fix = memlock_fix(need.bytes, hard);
    if driver {
        return Check::warn(
            NAME,
            format!("{evidence}; below it, arena regions are not locked: CUDA registration pins them (the driver's pins do not count against RLIMIT_MEMLOCK)"),
            fix,
        );
    }
    Check::fail(NAME, evidence, fix)
}

/// How to raise the limit to `need` bytes when the hard limit is `hard`.
fn memlock_fix(need: u64, hard: u64) -> String {
    let kib = need / 1024;
    let hard_note = if hard < need {
        format!(
            " (the hard limit, {}, is too low as well: raise it as root first, e.g. `* - memlock unlimited` in /etc/security/limits.conf, then log in again)",
            fmt_bytes(hard)
        )
    } else {
        String::new()
    };
    format!(
        "raise the memlock limit of the process to at least {kib} KiB (unlimited is usual on GPU servers): `ulimit -l unlimited` (or `ulimit -l {kib}`) in the shell that starts it{hard_note}; `LimitMEMLOCK=infinity` in its systemd unit; `docker run --ulimit memlock=-1` for a container; or give the process CAP_IPC_LOCK"
    )
}

/// The memory cgroup limit (`cgroup_memory`): pinned pages are charged to
/// the cgroup and cannot be reclaimed, so the runtime pins at most
/// `fraction` of the tightest limit over all nodes by default.
///
/// `ok` without a limit, or when the cap leaves room for `need` bytes (one
/// default region per node that needs one, as the memlock check counts
/// them); `warn` when it does not (regions are then cut down to fit, and
/// larger buffers are refused).
pub(crate) fn cgroup_memory(limits: &MemoryLimits, fraction: f64, need: u64) -> Check {
    const NAME: &str = "cgroup_memory";
    let Some(t) = limits.tightest() else {
        return Check::ok(NAME, no_cgroup_limit(limits));
    };
    let cap = crate::num::share(t.bytes, fraction);
    let usage = t
        .usage
        .map(|u| format!(", {} in use", fmt_bytes(u)))
        .unwrap_or_default();
    let ev = format!(
        "{} = {} (/{}{usage}); pinned pages count against it, so numapin pins at most {} over all nodes by default (budget_fraction {fraction}); it needs {}",
        t.kind.file(),
        fmt_bytes(t.bytes),
        t.path.display(),
        fmt_bytes(cap),
        fmt_bytes(need)
    );
    if cap >= need {
        Check::ok(NAME, ev)
    } else {
        Check::warn(
            NAME,
            ev,
            format!(
                "raise the memory limit of the container to at least {} (`docker run --memory`, Kubernetes resources.limits.memory): regions are cut to fit under it and larger buffers are refused",
                fmt_bytes(crate::num::u64_saturating(crate::num::f64_from(need) / fraction))
            ),
        )
    }
}

/// The evidence when no cgroup limit applies: the cgroups looked at and
/// the notes of the reader.
fn no_cgroup_limit(limits: &MemoryLimits) -> String {
    let dirs = limits
        .cgroup_dirs
        .iter()
        .map(|d| format!("/{}", d.display()))
        .collect::<Vec<_>>();
    let mut ev = "no memory cgroup limit".to_string();
    if !dirs.is_empty() {
        ev.push_str(&format!(" over {}", dirs.join(", ")));
    }
    if !limits.notes.is_empty() {
        ev.push_str(&format!(" ({})", limits.notes.join("; ")));
    }
    ev.push_str(": the default budget is budget_fraction of each node's memory");
    ev
}
