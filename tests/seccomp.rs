//! The test helper's seccomp filter (`tests/common/seccomp.rs`) refuses
//! exactly the six NUMA calls on x86_64 (and x32) and aarch64, lets every
//! other call and architecture through, and, installed in a child, is what
//! the kernel applies: the calls fail with the errno asked for while
//! `sched_setaffinity` still works.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

mod common;

use common::seccomp::{
    build_filter, docker_default, evaluate, install, AUDIT_ARCH_AARCH64, AUDIT_ARCH_X86_64,
    NUMA_CALLS, RET_ALLOW, RET_ERRNO, X32_SYSCALL_BIT,
};
use common::{assert_child_passed, in_child, run_child};
use numapin::system::{numa_calls as probe_calls, CallState};

/// Every call number below 1024 on both architectures, x32 numbers, and
/// other architectures: refused exactly when it is one of the six.
#[test]
fn the_filter_refuses_exactly_the_six_calls() {
    let p = docker_default();
    let eperm = RET_ERRNO | libc::EPERM as u32;
    for nr in 0..1024u32 {
        let x86 = NUMA_CALLS.iter().any(|c| c.1 == nr);
        let arm = NUMA_CALLS.iter().any(|c| c.2 == nr);
        let want = |hit: bool| Some(if hit { eperm } else { RET_ALLOW });
        assert_eq!(
            evaluate(&p, nr, AUDIT_ARCH_X86_64),
            want(x86),
            "x86_64 {nr}"
        );
        assert_eq!(
            evaluate(&p, nr, AUDIT_ARCH_AARCH64),
            want(arm),
            "aarch64 {nr}"
        );
        // i386 (0x40000003) and anything else pass untouched.
        assert_eq!(evaluate(&p, nr, 0x4000_0003), Some(RET_ALLOW), "i386 {nr}");
    }
    // x32: move_pages has its own number; the others are the common ones.
    let x32_move_pages = X32_SYSCALL_BIT | 533;
    assert_eq!(evaluate(&p, x32_move_pages, AUDIT_ARCH_X86_64), Some(eperm));
    assert_eq!(
        evaluate(&p, X32_SYSCALL_BIT | 237, AUDIT_ARCH_X86_64),
        Some(eperm)
    );
    // A subset, another errno.
    let p = build_filter(&["move_pages"], libc::ENOSYS as u32);
    assert_eq!(
        evaluate(&p, 279, AUDIT_ARCH_X86_64),
        Some(RET_ERRNO | libc::ENOSYS as u32)
    );
    assert_eq!(evaluate(&p, 237, AUDIT_ARCH_X86_64), Some(RET_ALLOW));
}

/// The numbers in the table are this target's own.
#[test]
fn the_numbers_are_this_targets() {
    let this = |c: &(&str, u32, u32)| {
        if cfg!(target_arch = "aarch64") {
            c.2
        } else {
            c.1
        }
    };
    let libc_numbers = [
        libc::SYS_mbind,
        libc::SYS_set_mempolicy,
        libc::SYS_get_mempolicy,
        libc::SYS_migrate_pages,
        libc::SYS_move_pages,
    ];
    for (c, n) in NUMA_CALLS.iter().zip(libc_numbers) {
        assert_eq!(i64::from(this(c)), n, "{}", c.0);
    }
}

/// Installed in a child (this binary again), the kernel refuses the six
/// calls with EPERM, `/proc/self/status` shows the filter, and binding a
/// thread to a CPU still works.
#[test]
fn installed_the_kernel_refuses_the_calls() {
    let prog = docker_default();
    let Some(out) = run_child("child_filtered", &[], move || install(&prog)) else {
        return;
    };
    assert_child_passed(&out);
}

#[test]
#[ignore = "runs in a child process under the filter: started by installed_the_kernel_refuses_the_calls"]
fn child_filtered() {
    if !in_child("child_filtered") {
        return;
    }
    let status = numapin::system::SecurityStatus::read_self();
    assert_eq!((status.seccomp, status.no_new_privs), (Some(2), Some(true)));
    for (call, state) in probe_calls() {
        assert_eq!(state, CallState::Refused("EPERM".into()), "{call}");
    }
    let cpus = numapin::internals::thread_cpus().unwrap();
    let one = numapin::CpuList::from_iter_unsorted(cpus.first());
    numapin::affinity::bind_current_thread(&one).unwrap();
    assert_eq!(numapin::internals::thread_cpus().unwrap(), one);
}
