//! The checks of where numapin runs inside a container: which NUMA system
//! calls a seccomp profile refuses (`numa_syscalls`) and what suggests a
//! container (`container`). Pure functions of what
//! [`SystemSnapshot`](crate::system::SystemSnapshot) read.

use super::check::Check;
use crate::system::{CallState, ContainerEvidence, SecurityStatus, CAP_IPC_LOCK, CAP_SYS_NICE};

/// The calls numapin itself makes, and what it does when each is refused.
const FALLBACKS: [(&str, &str); 3] = [
    (
        "mbind",
        "arena regions are placed by first touch from threads bound to the node's CPUs",
    ),
    (
        "move_pages",
        "their placement is checked from /proc/self/numa_maps (as exact)",
    ),
    (
        "set_mempolicy",
        "`numapin exec` binds the CPUs only (memory follows first touch; --strict fails instead)",
    ),
];

/// The fix for refused calls under Docker's default profile and the like.
const SYS_NICE_FIX: &str = "give the container CAP_SYS_NICE for mbind and set_mempolicy: `docker run --cap-add SYS_NICE`, Kubernetes `securityContext: {capabilities: {add: [\"SYS_NICE\"]}}`; Docker's default seccomp profile still refuses move_pages and migrate_pages then (numapin reads numa_maps instead), and a profile that allows all six calls (`docker run --security-opt seccomp=PROFILE.json`, Kubernetes `seccompProfile: {type: Localhost}`) gives full placement";

fn seccomp_text(s: &SecurityStatus) -> String {
    match s.seccomp {
        Some(0) => "Seccomp: 0 (no filter)".into(),
        Some(1) => "Seccomp: 1 (strict mode)".into(),
        Some(2) => format!(
            "Seccomp: 2 (filtered, {} filter(s))",
            s.seccomp_filters
                .map_or_else(|| "?".to_string(), |n| n.to_string())
        ),
        Some(n) => format!("Seccomp: {n}"),
        None => "Seccomp: unknown".into(),
    }
}

fn yes_no(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "yes",
        Some(false) => "no",
        None => "unknown",
    }
}

/// The NUMA system calls (`numa_syscalls`): which are refused, the
/// evidence from `/proc/self/status` (`Seccomp:`, `CapEff:`), what numapin
/// does instead, and the fix.
///
/// `ok` when every call numapin makes (mbind, set_mempolicy, get_mempolicy,
/// move_pages) is allowed, or they are only unsupported (ENOSYS) on a
/// machine with one node with memory; `warn` when any is refused or
/// unsupported otherwise: numapin works through its fallbacks, and the
/// placement is still verified.
pub(crate) fn numa_syscalls(
    calls: &[(&'static str, CallState)],
    security: &SecurityStatus,
    nodes_with_memory: usize,
) -> Check {
    const NAME: &str = "numa_syscalls";
    let list = calls
        .iter()
        .map(|(n, s)| format!("{n} {}", s.text()))
        .collect::<Vec<_>>()
        .join(", ");
    let mut evidence = format!(
        "{list}; {}; CAP_SYS_NICE {}, CAP_IPC_LOCK {}",
        seccomp_text(security),
        yes_no(security.has_cap(CAP_SYS_NICE)),
        yes_no(security.has_cap(CAP_IPC_LOCK)),
    );
    let state = |n: &str| calls.iter().find(|(c, _)| *c == n).map(|(_, s)| s);
    let used = ["mbind", "set_mempolicy", "get_mempolicy", "move_pages"];
    let unavailable: Vec<&str> = used
        .into_iter()
        .filter(|n| state(n).is_some_and(CallState::unavailable))
        .collect();
    let refused = used
        .iter()
        .any(|n| matches!(state(n), Some(CallState::Refused(_))));
    if unavailable.is_empty() {
        return Check::ok(NAME, evidence);
    }
    if !refused && nodes_with_memory <= 1 {
        evidence.push_str("; no NUMA support, and one node: nothing needs placing");
        return Check::ok(NAME, evidence);
    }
    let instead: Vec<&str> = FALLBACKS
        .iter()
        .filter(|(c, _)| unavailable.contains(c))
        .map(|(_, what)| *what)
        .collect();
    if !instead.is_empty() {
        evidence.push_str(&format!("; numapin falls back: {}", instead.join("; ")));
    }
    let fix = if !refused {
        "the kernel lacks NUMA support (CONFIG_NUMA) or a filter answers ENOSYS: numapin's fallbacks cover this; for full placement run on a kernel with NUMA support".to_string()
    } else if security.seccomp == Some(2) {
        format!("a seccomp profile refuses them: {SYS_NICE_FIX}")
    } else {
        "refused without a seccomp filter: a security module (AppArmor, SELinux) or a sandbox (gVisor) refuses them; check its policy".to_string()
    };
    Check::warn(NAME, evidence, fix)
}

/// What suggests a container (`container`): always `ok`, with the evidence
/// (`/.dockerenv`, `/run/.containerenv`, `KUBERNETES_SERVICE_HOST`,
/// `container=`, runtimes named in the cgroup path). Evidence, not proof:
/// an image exported from Docker keeps `/.dockerenv` wherever it runs.
pub(crate) fn container(e: &ContainerEvidence) -> Check {
    const NAME: &str = "container";
    if !e.likely() {
        let paths = if e.cgroup_paths.is_empty() {
            "no /proc/self/cgroup".to_string()
        } else {
            format!("cgroup {}", e.cgroup_paths.join(" "))
        };
        Check::ok(
            NAME,
            format!("no container evidence (no /.dockerenv, /run/.containerenv, KUBERNETES_SERVICE_HOST or container=; {paths})"),
        )
    } else {
        Check::ok(
            NAME,
            format!("container evidence: {} (evidence, not proof)", e.summary()),
        )
    }
}
