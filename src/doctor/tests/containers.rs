//! `numa_syscalls` under Docker's default profile, with CAP_SYS_NICE,
//! without a filter, with ENOSYS; `container` and `cgroup_memory`.

use super::assert_contains_all;
use crate::doctor::containers::{container, numa_syscalls};
use crate::doctor::limits::cgroup_memory;
use crate::doctor::Verdict;
use crate::system::{
    CallState, ContainerEvidence, Limit, LimitKind, MemoryLimits, SecurityStatus, CAP_SYS_NICE,
    NUMA_CALLS as CALLS,
};

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
