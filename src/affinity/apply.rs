//! Applying a plan: CPU affinity, memory policy, and handing the process
//! over to a command.
//!
//! The system calls themselves are in the crate's platform module
//! (`set_mempolicy` among the NUMA calls).

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::AffinityError as Error;
use crate::cpulist::CpuList;

type Result<T, E = Error> = std::result::Result<T, E>;

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

/// What [`bind_current_process`] applied (or, from
/// [`probe_memory_binding`], would apply).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "applies", rename_all = "snake_case")]
#[must_use]
pub enum Binding {
    /// The CPUs and the memory policy.
    CpusAndMemory,
    /// The CPUs only: `set_mempolicy` is refused (a seccomp profile such as
    /// Docker's default without CAP_SYS_NICE, or no NUMA support), so
    /// memory comes from the node of the CPU that first touches it, and
    /// from other nodes when that one is full.
    CpusOnly {
        /// Why, in a sentence for people (the refusal, what follows).
        reason: String,
    },
}

impl Binding {
    fn refused(errno: &str, nodes: &[u32]) -> Binding {
        let list = nodes
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        Binding::CpusOnly {
            reason: format!(
                "set_mempolicy was refused ({errno}; a seccomp profile without CAP_SYS_NICE, such as Docker's default?): the CPUs are bound but memory is not; it comes from the node of the CPU that first touches it (node {list} for the bound CPUs) and from other nodes when that is full"
            ),
        }
    }
}

/// What binding a plan over `nodes` would get in this process: whether
/// `set_mempolicy` is allowed, probed in a thread of its own (which changes
/// nothing of this thread's).
pub fn probe_memory_binding(nodes: &[u32]) -> Binding {
    use crate::platform::probe::{probe_set_mempolicy, CallState};
    match probe_set_mempolicy() {
        CallState::Refused(errno) if !nodes.is_empty() => Binding::refused(&errno, nodes),
        CallState::Unsupported if !nodes.is_empty() => Binding::refused("ENOSYS", nodes),
        _ => Binding::CpusAndMemory,
    }
}

fn affinity_error(who: &str, cpus: &CpuList, source: std::io::Error) -> Error {
    Error::system(format!("binding {who} to CPUs {cpus}: sched_setaffinity failed"), "bind only to CPUs this process may use (see `numapin topo`: a cpuset or taskset may exclude them)", source)
}

/// Restricts the calling thread to `cpus` (`sched_setaffinity(0)`); threads
/// it starts afterwards inherit the set.
///
/// # Errors
///
/// [`AffinityError::System`](Error::System) when `sched_setaffinity` refuses
/// `cpus` (none of them allowed by the cpuset, or beyond the machine's CPUs);
/// its kind is `Permission` for `EPERM`.
pub fn bind_current_thread(cpus: &CpuList) -> Result<()> {
    crate::platform::sys::sched_setaffinity(0, cpus)
        .map_err(|e| affinity_error("this thread", cpus, e))
}

/// Applies a rank's plan to this process: every thread whose CPU set is the
/// calling thread's (those nobody has bound elsewhere) moves to the plan's
/// CPUs, and the calling thread's memory policy becomes `policy` over the
/// plan's nodes. Threads started afterwards by the calling thread inherit
/// both; a memory policy cannot be set for other, already running threads
/// (Linux keeps it per thread), so call this early, before starting workers.
///
/// When `set_mempolicy` is refused (`EPERM`, `EACCES`, `ENOSYS`: Docker's
/// default seccomp profile without CAP_SYS_NICE) the CPUs stay bound and
/// the result is [`Binding::CpusOnly`], saying so; treat that as an error
/// where memory placement is required. Other failures are errors.
///
/// # Errors
///
/// As [`bind_current_process_cpus`]; [`AffinityError::System`](Error::System)
/// when `set_mempolicy` fails for another reason than a refusal (a node the
/// cpuset does not allow: `EINVAL`).
pub fn bind_current_process(plan: &RankPlan, policy: MemPolicy) -> Result<Binding> {
    bind_current_process_cpus(plan)?;
    match set_mempolicy(policy, &plan.mems) {
        Ok(()) => Ok(Binding::CpusAndMemory),
        Err(Error::System(e)) if e.io_error().is_some_and(crate::platform::numa::is_refusal) => {
            let errno = e.io_error().map(crate::platform::numa::errno_name);
            Ok(Binding::refused(
                errno.as_deref().unwrap_or("refused"),
                &plan.mems,
            ))
        }
        Err(e) => Err(e),
    }
}

/// The CPU half of [`bind_current_process`]: every thread whose CPU set is
/// the calling thread's moves to the plan's CPUs; the memory policy is left
/// as it is (memory then comes from the node of the CPU that first touches
/// it, which the binding makes the plan's node).
///
/// # Errors
///
/// [`AffinityError::System`](Error::System) when the calling thread's CPU set
/// cannot be read (`sched_getaffinity`) or set to the plan's CPUs
/// (`sched_setaffinity`).
pub fn bind_current_process_cpus(plan: &RankPlan) -> Result<()> {
    let before = crate::platform::sys::sched_getaffinity_self().map_err(|source| {
        Error::system(
            "reading this thread's CPU set: sched_getaffinity failed",
            "check that /proc and the sched_* system calls are available",
            source,
        )
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
                let _ = crate::platform::sys::sched_setaffinity(tid, &plan.cpus);
            }
        }
    }
    Ok(())
}

fn thread_affinity(tid: i32) -> Option<CpuList> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(tid)).ok()?;
    let max = nix::sched::CpuSet::count();
    Some(
        (0..max)
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .map(crate::num::u32_saturating)
            .collect(),
    )
}

/// Sets the calling thread's memory policy over `nodes` (`set_mempolicy(2)`).
/// An empty node list leaves the policy as it is. `Preferred` over several
/// nodes uses `MPOL_PREFERRED_MANY`, and on kernels before 5.15 (which lack
/// it) prefers the first node.
///
/// # Errors
///
/// [`AffinityError::System`](Error::System) when `set_mempolicy` fails:
/// `EINVAL` for nodes the machine or the cpuset does not have, `EPERM`/`ENOSYS`
/// where a seccomp profile refuses it (kind `Permission`).
pub fn set_mempolicy(policy: MemPolicy, nodes: &[u32]) -> Result<()> {
    use crate::platform::numa::{self, Policy};
    if nodes.is_empty() {
        return Ok(());
    }
    let mode = match (policy, nodes.len()) {
        (MemPolicy::Bind, _) => Policy::Bind,
        (MemPolicy::Preferred, 1) => Policy::Preferred,
        (MemPolicy::Preferred, _) => Policy::PreferredMany,
    };
    let mut r = numa::set_mempolicy(mode, nodes);
    if r.is_err() && mode == Policy::PreferredMany {
        let first = nodes.iter().min().copied().unwrap_or(0);
        r = numa::set_mempolicy(Policy::Preferred, &[first]);
    }
    r.map_err(|source| {
        let list = nodes.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        Error::system(format!(
                "setting the memory policy to {} nodes {list}: set_mempolicy failed",
                policy.as_str()
            ), match source.raw_os_error() {
                Some(libc::EINVAL) => "use nodes that exist on this machine and that the cpuset's mems allow (see `numapin topo`)",
                Some(libc::ENOSYS) | Some(libc::EPERM) => "run where NUMA system calls are allowed (a seccomp profile may block set_mempolicy)",
                _ if source.kind() == std::io::ErrorKind::InvalidInput => "check the topology description",
                _ => "check the node list",
            }
            , source)
    })
}

/// The calling thread's memory policy mode and nodes (`get_mempolicy(2)`),
/// as `(mode, nodes)`; mode 0 is `MPOL_DEFAULT`, 1 preferred, 2 bind.
///
/// # Errors
///
/// The system's error from `get_mempolicy` (`EPERM` or `ENOSYS` where a seccomp
/// profile refuses it).
pub fn get_mempolicy() -> std::io::Result<(i32, Vec<u32>)> {
    crate::platform::numa::get_mempolicy()
}

/// Finds `program` the way `execvp` will: a name with a `/` is a path,
/// otherwise each `PATH` entry is tried (glibc's default `/bin:/usr/bin`
/// when `PATH` is unset). The error names the command and what is wrong.
///
/// # Errors
///
/// [`AffinityError::Request`](Error::Request) for an empty command, a path that
/// does not exist, is not a file or is not executable, or a name no `PATH`
/// entry holds.
pub fn find_program(program: &OsStr) -> Result<PathBuf> {
    let shown = program.to_string_lossy();
    if program.is_empty() {
        return Err(Error::Request {
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
            Err(e) => Err(Error::Request {
                problem: format!("command `{shown}` cannot be run: {e}"),
                fix: "check the path".into(),
            }),
            Ok(m) if !m.is_file() => Err(Error::Request {
                problem: format!("command `{shown}` is not a file"),
                fix: "check the path".into(),
            }),
            Ok(_) if !executable(&p) => Err(Error::Request {
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
    Err(Error::Request {
        problem: format!("command `{shown}` not found in PATH"),
        fix: "check the spelling, install it, or give its full path".into(),
    })
}

fn cstring(s: &OsStr, what: &str) -> Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| Error::Request {
        problem: format!("{what} `{}` contains a NUL byte", s.to_string_lossy()),
        fix: "remove the NUL byte".into(),
    })
}

/// Replaces this process with `argv[0]` run with `argv` and environment
/// `env` (`execvpe`: `PATH` lookup as a shell does). Returns only on failure.
///
/// The command starts with the signal state a shell would give it: SIGPIPE
/// at its default action (Rust's runtime ignores it, and an ignored signal
/// survives `execvp`) and the signal mask the process started with.
pub fn exec(argv: &[OsString], env: &[(OsString, OsString)]) -> Error {
    let run = || -> Result<std::convert::Infallible> {
        let Some(program) = argv.first() else {
            return Err(Error::Request {
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
        crate::platform::cleanup::restore_for_exec().map_err(|source| {
            Error::system(
                "restoring the signal mask before running the command",
                "report this as a bug",
                source,
            )
        })?;
        nix::unistd::execvpe(&file, &args, &envp).map_err(|e| Error::Request {
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
        let mine = crate::platform::sys::sched_getaffinity_self().unwrap();
        let one = CpuList::from_iter_unsorted(mine.first());
        bind_current_thread(&one).unwrap();
        assert_eq!(crate::platform::sys::sched_getaffinity_self().unwrap(), one);
        let e = bind_current_thread(&CpuList::from_iter_unsorted([4000])).unwrap_err();
        assert!(e.to_string().contains("4000"), "{e}");
        assert!(bind_current_thread(&CpuList::new()).is_err());
    }

    #[test]
    fn mempolicy_bind_and_preferred_are_set() {
        let node = crate::platform::sys::proc_status_field("Mems_allowed_list")
            .and_then(|l| CpuList::parse(&l).ok())
            .and_then(|l| l.first())
            .unwrap_or(0);
        set_mempolicy(MemPolicy::Bind, &[node]).unwrap();
        assert_eq!(get_mempolicy().unwrap(), (libc::MPOL_BIND, vec![node]));
        set_mempolicy(MemPolicy::Preferred, &[node]).unwrap();
        assert_eq!(get_mempolicy().unwrap(), (libc::MPOL_PREFERRED, vec![node]));
        let e = set_mempolicy(MemPolicy::Bind, &[1000]).unwrap_err();
        assert!(e.to_string().contains("1000"), "{e}");
        assert_eq!(
            get_mempolicy().unwrap().0,
            libc::MPOL_PREFERRED,
            "a refused policy leaves the old one"
        );
        crate::platform::numa::set_default_mempolicy().unwrap();
        assert_eq!(get_mempolicy().unwrap().0, libc::MPOL_DEFAULT);
    }

    #[test]
    fn programs_are_found_like_execvp() {
        assert!(find_program(OsStr::new("sh")).unwrap().is_absolute());
        let e = find_program(OsStr::new("no-such-command-numapin")).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Input);
        assert!(e.to_string().contains("no-such-command-numapin"));
        let plain = tempfile::NamedTempFile::new().unwrap();
        let e = find_program(plain.path().as_os_str()).unwrap_err();
        assert!(e.to_string().contains("not executable"), "{e}");
        assert!(find_program(OsStr::new("/nonexistent/x")).is_err());
        assert!(find_program(OsStr::new("/")).is_err());
    }
}
