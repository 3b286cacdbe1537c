//! The checks of where numapin runs inside a container: which NUMA system
//! calls a seccomp profile refuses (`numa_syscalls`), what suggests a
//! container (`container`) and the memory cgroup's limit (`cgroup_memory`).
//! Pure functions of what [`super::system::SystemView`] read.

use super::Check;
use numapin::internals::cgroup::MemoryLimits;
use numapin::internals::container::ContainerEvidence;
use numapin::internals::fmt_bytes;
use numapin::internals::probe::CallState;
use numapin::internals::sys::{SecurityStatus, CAP_IPC_LOCK, CAP_SYS_NICE};

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
pub(super) const SYS_NICE_FIX: &str = "give the container CAP_SYS_NICE for mbind and set_mempolicy: `docker run --cap-add SYS_NICE`, Kubernetes `securityContext: {capabilities: {add: [\"SYS_NICE\"]}}`; Docker's default seccomp profile still refuses move_pages and migrate_pages then (numapin reads numa_maps instead), and a profile that allows all six calls (`docker run --security-opt seccomp=PROFILE.json`, Kubernetes `seccompProfile: {type: Localhost}`) gives full placement";

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
pub(super) fn numa_syscalls(
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
pub(super) fn container(e: &ContainerEvidence) -> Check {
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

/// The memory cgroup limit (`cgroup_memory`): pinned pages are charged to
/// the cgroup and cannot be reclaimed, so the runtime pins at most
/// `fraction` of the tightest limit over all nodes by default.
///
/// `ok` without a limit, or when the cap leaves room for `need` bytes (one
/// default region per node that needs one, as the memlock check counts
/// them); `warn` when it does not (regions are then cut down to fit, and
/// larger buffers are refused).
pub(super) fn cgroup_memory(limits: &MemoryLimits, fraction: f64, need: u64) -> Check {
    const NAME: &str = "cgroup_memory";
    let Some(t) = limits.tightest() else {
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
        return Check::ok(NAME, ev);
    };
    let cap = (t.bytes as f64 * fraction) as u64;
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
                fmt_bytes((need as f64 / fraction) as u64)
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::{assert_contains_all, Verdict};
    use numapin::internals::cgroup::{Limit, LimitKind};
    use numapin::internals::probe::CALLS;

    const DOCKER: &str =
        "NoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\nCapEff:\t00000000a80425fb\n";

    fn all(s: CallState) -> Vec<(&'static str, CallState)> {
        CALLS.iter().map(|&c| (c, s.clone())).collect()
    }

    #[test]
    fn docker_default_profile_warns_with_the_capability_fix() {
        let c = numa_syscalls(
            &all(CallState::Refused("EPERM".into())),
            &SecurityStatus::parse(DOCKER),
            1,
        );
        assert_eq!(c.verdict, Verdict::Warn);
        assert_contains_all(
            &c.evidence,
            &[
                "mbind refused (EPERM)",
                "move_pages refused (EPERM)",
                "Seccomp: 2 (filtered, 1 filter(s))",
                "CAP_SYS_NICE no",
                "first touch",
                "numa_maps",
                "binds the CPUs only",
            ],
        );
        let fix = c.fix.unwrap();
        assert_contains_all(
            &fix,
            &[
                "--cap-add SYS_NICE",
                "securityContext",
                "SYS_NICE",
                "move_pages",
            ],
        );
    }

    #[test]
    fn with_sys_nice_only_move_pages_falls_back() {
        let mut calls = all(CallState::Allowed(None));
        calls[3].1 = CallState::Refused("EPERM".into());
        calls[4].1 = CallState::Refused("EPERM".into());
        let mut s = SecurityStatus::parse(DOCKER);
        s.cap_eff = s.cap_eff.map(|c| c | 1 << CAP_SYS_NICE);
        let c = numa_syscalls(&calls, &s, 2);
        assert_eq!(c.verdict, Verdict::Warn);
        assert!(c.evidence.contains("CAP_SYS_NICE yes"), "{}", c.evidence);
        assert!(c.evidence.contains("numa_maps") && !c.evidence.contains("first touch"));
    }

    #[test]
    fn allowed_is_ok_and_enosys_matters_only_with_several_nodes() {
        let s = SecurityStatus::parse("Seccomp:\t0\n");
        let c = numa_syscalls(&all(CallState::Allowed(None)), &s, 2);
        assert_eq!((c.verdict, c.fix), (Verdict::Ok, None));
        assert!(c.evidence.contains("Seccomp: 0 (no filter)"));
        assert_eq!(
            numa_syscalls(&all(CallState::Unsupported), &s, 1).verdict,
            Verdict::Ok
        );
        let c = numa_syscalls(&all(CallState::Unsupported), &s, 2);
        assert_eq!(c.verdict, Verdict::Warn);
        assert!(c.fix.unwrap().contains("CONFIG_NUMA"));
        // Refused without a filter: a security module.
        let c = numa_syscalls(&all(CallState::Refused("EACCES".into())), &s, 1);
        assert!(c.fix.unwrap().contains("security module"));
    }

    #[test]
    fn container_evidence_is_reported_as_seen() {
        let c = container(&ContainerEvidence::default());
        assert_eq!(c.verdict, Verdict::Ok);
        assert!(
            c.evidence.starts_with("no container evidence"),
            "{}",
            c.evidence
        );
        let e = ContainerEvidence {
            dockerenv: true,
            kubernetes_env: true,
            cgroup_paths: vec!["/docker/abc".into()],
            cgroup_runtimes: vec!["docker"],
            ..Default::default()
        };
        let c = container(&e);
        assert_contains_all(
            &c.evidence,
            &[
                "/.dockerenv exists",
                "KUBERNETES_SERVICE_HOST",
                "docker",
                "not proof",
            ],
        );
    }

    #[test]
    fn cgroup_limit_caps_what_numapin_pins() {
        let none = MemoryLimits::default();
        let c = cgroup_memory(&none, 0.5, 256 << 20);
        assert_eq!(c.verdict, Verdict::Ok);
        assert!(c.evidence.contains("no memory cgroup limit"));
        let limits = MemoryLimits {
            limits: vec![Limit {
                bytes: 2 << 30,
                kind: LimitKind::V2Max,
                path: "sys/fs/cgroup/job/memory.max".into(),
                usage: Some(100 << 20),
            }],
            ..Default::default()
        };
        let c = cgroup_memory(&limits, 0.5, 256 << 20);
        assert_eq!(c.verdict, Verdict::Ok);
        assert_contains_all(
            &c.evidence,
            &[
                "memory.max = 2 GiB",
                "/sys/fs/cgroup/job/memory.max",
                "100 MiB in use",
                "at most 1 GiB over all nodes",
            ],
        );
        let c = cgroup_memory(&limits, 0.5, 2 << 30);
        assert_eq!(c.verdict, Verdict::Warn);
        assert!(c.fix.unwrap().contains("at least 4 GiB"));
    }
}
