//! Applying a plan: CPU affinity, memory policy, and handing the process
//! over to a command.
//!
//! `set_mempolicy(2)` has no wrapper in `nix` or `libc`; it is called here
//! as a raw system call, each `unsafe` block with its `// SAFETY:` comment.

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::cpulist::CpuList;
use crate::error::{Error, Result};

use super::plan::RankPlan;

/// How memory is kept on a plan's nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemPolicy {
    /// `MPOL_BIND`: allocate only on the nodes (an allocation that does not
    /// fit fails rather than going elsewhere).
    #[default]
    Bind,
    /// `MPOL_PREFERRED` (`MPOL_PREFERRED_MANY` for several nodes): try the
    /// nodes first, fall back to others when they are full.
    Preferred,
}

impl MemPolicy {
    /// The name numactl and `/proc/PID/numa_maps` use (`bind`, `prefer`).
    pub fn as_str(&self) -> &'static str {
        match self {
            MemPolicy::Bind => "bind",
            MemPolicy::Preferred => "prefer",
        }
    }
}

const MPOL_PREFERRED: libc::c_int = 1;
const MPOL_BIND: libc::c_int = 2;
/// Linux 5.15 and later.
const MPOL_PREFERRED_MANY: libc::c_int = 5;

fn affinity_error(who: &str, cpus: &CpuList, e: std::io::Error) -> Error {
    Error::System {
        what: format!("binding {who} to CPUs {cpus}"),
        problem: format!("sched_setaffinity failed: {e}"),
        fix: "bind only to CPUs this process may use (see `numapin topo`: a cpuset or taskset may exclude them)".into(),
    }
}

/// Restricts the calling thread to `cpus` (`sched_setaffinity(0)`); threads
/// it starts afterwards inherit the set.
pub fn bind_current_thread(cpus: &CpuList) -> Result<()> {
    crate::sys::sched_setaffinity(0, cpus).map_err(|e| affinity_error("this thread", cpus, e))
}

/// Applies a rank's plan to this process: every thread whose CPU set is the
/// calling thread's (those nobody has bound elsewhere) moves to the plan's
/// CPUs, and the calling thread's memory policy becomes `policy` over the
/// plan's nodes. Threads started afterwards by the calling thread inherit
/// both; a memory policy cannot be set for other, already running threads
/// (Linux keeps it per thread), so call this early, before starting workers.
pub fn bind_current_process(plan: &RankPlan, policy: MemPolicy) -> Result<()> {
    let before = crate::sys::sched_getaffinity_self().map_err(|e| Error::System {
        what: "reading this thread's CPU set".into(),
        problem: format!("sched_getaffinity failed: {e}"),
        fix: "check that /proc and the sched_* system calls are available".into(),
    })?;
    bind_current_thread(&plan.cpus)?;
    let me = nix::unistd::gettid().as_raw();
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if tid == me {
                continue;
            }
            // A thread that exits meanwhile fails harmlessly; one bound by
            // someone else keeps its own set.
            if thread_affinity(tid).is_some_and(|a| a == before) {
                let _ = crate::sys::sched_setaffinity(tid, &plan.cpus);
            }
        }
    }
    set_mempolicy(policy, &plan.mems)
}

fn thread_affinity(tid: i32) -> Option<CpuList> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(tid)).ok()?;
    let max = nix::sched::CpuSet::count();
    Some(
        (0..max)
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .map(|c| c as u32)
            .collect(),
    )
}

/// Sets the calling thread's memory policy over `nodes` (`set_mempolicy(2)`).
/// An empty node list leaves the policy as it is. `Preferred` over several
/// nodes uses `MPOL_PREFERRED_MANY`, and on kernels before 5.15 (which lack
/// it) prefers the first node.
pub fn set_mempolicy(policy: MemPolicy, nodes: &[u32]) -> Result<()> {
    if nodes.is_empty() {
        return Ok(());
    }
    let max = *nodes.iter().max().unwrap_or(&0);
    if max >= crate::cpulist::MAX_CPU {
        return Err(Error::Usage {
            problem: format!("NUMA node {max} is beyond the supported node numbers"),
            fix: "check the topology description".into(),
        });
    }
    let bits = libc::c_ulong::BITS;
    let words = (max / bits) as usize + 1;
    let mut mask = vec![0 as libc::c_ulong; words];
    for &n in nodes {
        mask[(n / bits) as usize] |= 1 << (n % bits);
    }
    let mode = match (policy, nodes.len()) {
        (MemPolicy::Bind, _) => MPOL_BIND,
        (MemPolicy::Preferred, 1) => MPOL_PREFERRED,
        (MemPolicy::Preferred, _) => MPOL_PREFERRED_MANY,
    };
    let mut r = raw_set_mempolicy(mode, &mask);
    if r.is_err() && mode == MPOL_PREFERRED_MANY {
        let first = nodes.iter().min().copied().unwrap_or(0);
        let mut one = vec![0 as libc::c_ulong; words];
        one[(first / bits) as usize] |= 1 << (first % bits);
        r = raw_set_mempolicy(MPOL_PREFERRED, &one);
    }
    r.map_err(|e| {
        let list = nodes.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        Error::System {
            what: format!("setting the memory policy to {} nodes {list}", policy.as_str()),
            problem: format!("set_mempolicy failed: {e}"),
            fix: match e.raw_os_error() {
                Some(libc::EINVAL) => "use nodes that exist on this machine and that the cpuset's mems allow (see `numapin topo`)",
                Some(libc::ENOSYS) | Some(libc::EPERM) => "run where NUMA system calls are allowed (a seccomp profile may block set_mempolicy)",
                _ => "check the node list",
            }
            .into(),
        }
    })
}

fn raw_set_mempolicy(mode: libc::c_int, mask: &[libc::c_ulong]) -> std::io::Result<()> {
    // The kernel reads `maxnode - 1` bits (a historical off-by-one that
    // libnuma also accounts for), so pass one more than the mask holds.
    let maxnode = (mask.len() * libc::c_ulong::BITS as usize + 1) as libc::c_ulong;
    // SAFETY: set_mempolicy reads BITS_TO_LONGS(maxnode - 1) = mask.len()
    // words from `mask`, which is a live, initialised slice of exactly that
    // many c_ulongs; it writes no memory of ours and changes only this
    // thread's memory policy.
    let r = unsafe { libc::syscall(libc::SYS_set_mempolicy, mode, mask.as_ptr(), maxnode) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The calling thread's memory policy mode and nodes (`get_mempolicy(2)`),
/// as `(mode, nodes)`; mode 0 is `MPOL_DEFAULT`, 1 preferred, 2 bind.
pub fn get_mempolicy() -> std::io::Result<(i32, Vec<u32>)> {
    const WORDS: usize = 16; // 1024 nodes, the largest MAX_NUMNODES in distributions' kernels
    let mut mode: libc::c_int = 0;
    let mut mask = [0 as libc::c_ulong; WORDS];
    let maxnode = (WORDS * libc::c_ulong::BITS as usize) as libc::c_ulong;
    // SAFETY: `mode` is a live c_int and `mask` a live array of WORDS words;
    // with maxnode = WORDS * bits-per-word the kernel writes at most that
    // many bits into it. addr = NULL and flags = 0 ask for this thread's
    // policy.
    let r = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            mask.as_mut_ptr(),
            maxnode,
            std::ptr::null_mut::<libc::c_void>(),
            0 as libc::c_ulong,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let bits = libc::c_ulong::BITS as usize;
    let nodes = (0..WORDS * bits)
        .filter(|&i| mask[i / bits] & (1 << (i % bits)) != 0)
        .map(|i| i as u32)
        .collect();
    Ok((mode, nodes))
}

/// Finds `program` the way `execvp` will: a name with a `/` is a path,
/// otherwise each `PATH` entry is tried (glibc's default `/bin:/usr/bin`
/// when `PATH` is unset). The error names the command and what is wrong.
pub fn find_program(program: &OsStr) -> Result<PathBuf> {
    let shown = program.to_string_lossy();
    if program.is_empty() {
        return Err(Error::Usage {
            problem: "the command is empty".into(),
            fix: "give a command after `--`".into(),
        });
    }
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.as_bytes().contains(&b'/') {
        let p = PathBuf::from(program);
        return match std::fs::metadata(&p) {
            Err(e) => Err(Error::Usage {
                problem: format!("command `{shown}` cannot be run: {e}"),
                fix: "check the path".into(),
            }),
            Ok(m) if !m.is_file() => Err(Error::Usage {
                problem: format!("command `{shown}` is not a file"),
                fix: "check the path".into(),
            }),
            Ok(_) if !executable(&p) => Err(Error::Usage {
                problem: format!("command `{shown}` is not executable"),
                fix: format!(
                    "make it executable (chmod +x {shown}) or run it through its interpreter"
                ),
            }),
            Ok(_) => Ok(p),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/bin:/usr/bin"));
    for dir in std::env::split_paths(&path) {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let p = dir.join(program);
        if executable(&p) {
            return Ok(p);
        }
    }
    Err(Error::Usage {
        problem: format!("command `{shown}` not found in PATH"),
        fix: "check the spelling, install it, or give its full path".into(),
    })
}

fn cstring(s: &OsStr, what: &str) -> Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| Error::Usage {
        problem: format!("{what} `{}` contains a NUL byte", s.to_string_lossy()),
        fix: "remove the NUL byte".into(),
    })
}

/// Replaces this process with `argv[0]` run with `argv` and environment
/// `env` (`execvpe`: `PATH` lookup as a shell does). Returns only on failure.
pub fn exec(argv: &[OsString], env: &[(OsString, OsString)]) -> Error {
    let run = || -> Result<std::convert::Infallible> {
        let Some(program) = argv.first() else {
            return Err(Error::Usage {
                problem: "no command given".into(),
                fix: "give a command after `--`".into(),
            });
        };
        find_program(program)?;
        let file = cstring(program, "the command")?;
        let args = argv
            .iter()
            .map(|a| cstring(a, "an argument"))
            .collect::<Result<Vec<_>>>()?;
        let mut envp = Vec::with_capacity(env.len());
        for (k, v) in env {
            let mut kv = k.clone();
            kv.push("=");
            kv.push(v);
            envp.push(cstring(&kv, "an environment variable")?);
        }
        nix::unistd::execvpe(&file, &args, &envp).map_err(|e| Error::Usage {
            problem: format!("cannot run `{}`: {e}", program.to_string_lossy()),
            fix: "check the command".into(),
        })
    };
    match run() {
        Err(e) => e,
        Ok(never) => match never {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_binding_takes_effect_and_is_checked() {
        // Each test runs on its own thread: binding it leaves the others alone.
        let mine = crate::sys::sched_getaffinity_self().unwrap();
        let one = CpuList::from_iter_unsorted(mine.first());
        bind_current_thread(&one).unwrap();
        assert_eq!(crate::sys::sched_getaffinity_self().unwrap(), one);
        let e = bind_current_thread(&CpuList::from_iter_unsorted([4000])).unwrap_err();
        assert!(e.to_string().contains("4000"), "{e}");
        assert!(bind_current_thread(&CpuList::new()).is_err());
    }

    #[test]
    fn mempolicy_bind_and_preferred_are_set() {
        let node = crate::sys::proc_status_field("Mems_allowed_list")
            .and_then(|l| CpuList::parse(&l).ok())
            .and_then(|l| l.first())
            .unwrap_or(0);
        set_mempolicy(MemPolicy::Bind, &[node]).unwrap();
        assert_eq!(get_mempolicy().unwrap(), (MPOL_BIND, vec![node]));
        set_mempolicy(MemPolicy::Preferred, &[node]).unwrap();
        assert_eq!(get_mempolicy().unwrap(), (MPOL_PREFERRED, vec![node]));
        let e = set_mempolicy(MemPolicy::Bind, &[1000]).unwrap_err();
        assert!(e.to_string().contains("1000"), "{e}");
        assert_eq!(
            get_mempolicy().unwrap().0,
            MPOL_PREFERRED,
            "a refused policy leaves the old one"
        );
        // SAFETY: MPOL_DEFAULT with an empty mask resets this thread's policy.
        let r = unsafe {
            libc::syscall(
                libc::SYS_set_mempolicy,
                0,
                std::ptr::null::<libc::c_ulong>(),
                0 as libc::c_ulong,
            )
        };
        assert_eq!(r, 0);
    }

    #[test]
    fn programs_are_found_like_execvp() {
        assert!(find_program(OsStr::new("sh")).unwrap().is_absolute());
        let e = find_program(OsStr::new("no-such-command-numapin")).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("no-such-command-numapin"));
        let plain = tempfile::NamedTempFile::new().unwrap();
        let e = find_program(plain.path().as_os_str()).unwrap_err();
        assert!(e.to_string().contains("not executable"), "{e}");
        assert!(find_program(OsStr::new("/nonexistent/x")).is_err());
        assert!(find_program(OsStr::new("/")).is_err());
    }
}
