//! A test helper: runs a command under a seccomp filter that refuses the
//! NUMA memory-policy system calls with `EPERM`, as Docker's default
//! profile does in a container without CAP_SYS_NICE (it refuses `move_pages`
//! and `migrate_pages` even with it). Everything else is allowed.
//!
//! | syscall | x86_64 | x32 (bit 30) | aarch64 |
//! | --- | --- | --- | --- |
//! | `mbind` | 237 | 237 | 235 |
//! | `set_mempolicy` | 238 | 238 | 237 |
//! | `get_mempolicy` | 239 | 239 | 236 |
//! | `migrate_pages` | 256 | 256 | 238 |
//! | `move_pages` | 279 | 533 | 239 |
//! | `set_mempolicy_home_node` | 450 | 450 | 450 |
//!
//! A classic-BPF program (no crate needed): it checks `seccomp_data.arch`
//! first, so each architecture gets its own numbers and any other
//! architecture's calls (i386 or arm32 compat) pass untouched. [`evaluate`]
//! runs a program in a small interpreter of the three instructions
//! [`build_filter`] emits, so the verdict for every call can be checked
//! without installing it (`tests/seccomp.rs`).
//!
//! Used from the library's tests (`mod common;`) and the command line's
//! (`#[path = "../../tests/common/seccomp.rs"]`).
#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::process::Command;

/// `AUDIT_ARCH_X86_64`.
pub(crate) const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
/// `AUDIT_ARCH_AARCH64`.
pub(crate) const AUDIT_ARCH_AARCH64: u32 = 0xC000_00B7;
/// `__X32_SYSCALL_BIT`.
pub(crate) const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// `SECCOMP_RET_ALLOW`.
pub(crate) const RET_ALLOW: u32 = 0x7fff_0000;
/// `SECCOMP_RET_ERRNO`; the low 16 bits carry the errno.
pub(crate) const RET_ERRNO: u32 = 0x0005_0000;

// struct seccomp_data { int nr; __u32 arch; ... }
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
// BPF_LD | BPF_W | BPF_ABS, BPF_JMP | BPF_JEQ | BPF_K, BPF_RET | BPF_K.
const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const RET_K: u16 = 0x06;

/// The six calls, as `(name, x86_64, aarch64)`; x32 numbers are the
/// x86_64 ones with bit 30 set, except `move_pages` (533).
pub(crate) const NUMA_CALLS: [(&str, u32, u32); 6] = [
    ("mbind", 237, 235),
    ("set_mempolicy", 238, 237),
    ("get_mempolicy", 239, 236),
    ("migrate_pages", 256, 238),
    ("move_pages", 279, 239),
    ("set_mempolicy_home_node", 450, 450),
];

fn x32(name: &str, x86_64: u32) -> u32 {
    X32_SYSCALL_BIT | if name == "move_pages" { 533 } else { x86_64 }
}

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The filter: the calls of [`NUMA_CALLS`] named in `denied` return
/// `-errno` on x86_64 (and x32) and aarch64; all else is allowed.
pub(crate) fn build_filter(denied: &[&str], errno: u32) -> Vec<libc::sock_filter> {
    assert!((1..=4095).contains(&errno), "errno {errno} out of range");
    let calls: Vec<_> = NUMA_CALLS
        .iter()
        .filter(|(n, _, _)| denied.contains(n))
        .collect();
    let x86: Vec<u32> = calls
        .iter()
        .flat_map(|(n, x, _)| [*x, x32(n, *x)])
        .collect();
    let arm: Vec<u32> = calls.iter().map(|(_, _, a)| *a).collect();
    // Layout: [0] load arch; [1] x86? ; [2] arm? ; [3] allow;
    // x86 block: load nr, one jeq per number, allow;
    // arm block: load nr, one jeq per number, allow; deny.
    let x86_at = 4;
    let arm_at = x86_at + 1 + x86.len() + 1;
    let deny_at = arm_at + 1 + arm.len() + 1;
    let rel = |from: usize, to: usize| u8::try_from(to - from - 1).expect("a short filter");
    let mut p = vec![
        insn(LD_W_ABS, 0, 0, OFF_ARCH),
        insn(JEQ_K, rel(1, x86_at), 0, AUDIT_ARCH_X86_64),
        insn(JEQ_K, rel(2, arm_at), 0, AUDIT_ARCH_AARCH64),
        insn(RET_K, 0, 0, RET_ALLOW),
    ];
    for (block, at) in [(&x86, x86_at), (&arm, arm_at)] {
        p.push(insn(LD_W_ABS, 0, 0, OFF_NR));
        for (i, nr) in block.iter().enumerate() {
            p.push(insn(JEQ_K, rel(at + 1 + i, deny_at), 0, *nr));
        }
        p.push(insn(RET_K, 0, 0, RET_ALLOW));
    }
    p.push(insn(RET_K, 0, 0, RET_ERRNO | errno));
    assert_eq!(p.len(), deny_at + 1);
    p
}

/// The filter refusing all six calls with `EPERM` (Docker's default
/// profile, as far as numapin is concerned).
pub(crate) fn docker_default() -> Vec<libc::sock_filter> {
    let all: Vec<&str> = NUMA_CALLS.iter().map(|(n, _, _)| *n).collect();
    build_filter(&all, libc::EPERM as u32)
}

/// Runs `prog` on a call `nr` of architecture `arch`: the action, or
/// `None` for an instruction [`build_filter`] never emits or a program
/// that runs off its end.
pub(crate) fn evaluate(prog: &[libc::sock_filter], nr: u32, arch: u32) -> Option<u32> {
    let (mut acc, mut pc) = (0u32, 0usize);
    for _ in 0..=prog.len() {
        let i = prog.get(pc)?;
        pc += 1;
        match i.code {
            LD_W_ABS => {
                acc = match i.k {
                    OFF_NR => nr,
                    OFF_ARCH => arch,
                    _ => return None,
                }
            }
            JEQ_K => pc += usize::from(if acc == i.k { i.jt } else { i.jf }),
            RET_K => return Some(i.k),
            _ => return None,
        }
    }
    None
}

/// Installs `prog` on the calling thread (inherited by its children and
/// across `execve`): `PR_SET_NO_NEW_PRIVS`, then `PR_SET_SECCOMP`. Makes
/// only the two `prctl` calls, so it may run between `fork` and `exec`.
pub(crate) fn install(prog: &[libc::sock_filter]) -> std::io::Result<()> {
    // The kernel takes at most 4,096 instructions (BPF_MAXINSNS).
    let len =
        u16::try_from(prog.len()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let fprog = libc::sock_fprog {
        len,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel
    // copies the program before returning.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::c_ulong::from(libc::SECCOMP_MODE_FILTER),
            &fprog as *const libc::sock_fprog,
            0,
            0,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Makes `cmd` run under [`docker_default`] (installed in the child before
/// `exec`).
pub(crate) fn under_filter(cmd: &mut Command) -> &mut Command {
    let prog = docker_default();
    // SAFETY: the closure runs in the forked child before exec and only
    // makes two prctl calls on a program built before the fork (no
    // allocation, no locks).
    unsafe { cmd.pre_exec(move || install(&prog)) }
}
