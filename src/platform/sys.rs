//! Small Linux system interfaces: CPU affinity, limits, capabilities and
//! `/proc/self/status`.
//!
//! Thin, checked wrappers over `nix`; the raw NUMA and memory system calls
//! live in [`super::numa`].

use std::io;

use crate::cpulist::CpuList;

/// The CPUs the calling thread may run on (`sched_getaffinity(0)`).
pub(crate) fn sched_getaffinity_self() -> io::Result<CpuList> {
    let set =
        nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).map_err(io::Error::from)?;
    let max = nix::sched::CpuSet::count();
    Ok((0..max)
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .map(crate::num::u32_saturating)
        .collect())
}

/// Restricts the calling thread (`pid` 0) or process to `cpus`.
pub(crate) fn sched_setaffinity(pid: i32, cpus: &CpuList) -> io::Result<()> {
    if cpus.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty CPU set"));
    }
    let mut set = nix::sched::CpuSet::new();
    for c in cpus.iter() {
        set.set(c as usize).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CPU {c} is beyond the supported CPU count"),
            )
        })?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(pid), &set).map_err(io::Error::from)
}

/// The `(soft, hard)` RLIMIT_MEMLOCK in bytes (`u64::MAX` = unlimited).
pub(crate) fn memlock_limit() -> io::Result<(u64, u64)> {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK)
        .map_err(io::Error::from)
}

/// The first of `RLIMIT_AS` and `RLIMIT_DATA` that a mapping of `len`
/// more bytes would pass (name, soft limit in bytes), judged from what the
/// process maps now (`VmSize`, `VmData`) with 4 MiB to spare for guard
/// pages: a mapping refused with `ENOMEM` under it is the process's limit,
/// not the machine's memory. `None` when no limit is that close (the
/// `ENOMEM` is then `vm.max_map_count`, overcommit or the machine's).
pub(crate) fn address_limit(len: u64) -> Option<(&'static str, u64)> {
    use nix::sys::resource::{getrlimit, Resource};
    [
        ("RLIMIT_AS", Resource::RLIMIT_AS, "VmSize"),
        ("RLIMIT_DATA", Resource::RLIMIT_DATA, "VmData"),
    ]
    .into_iter()
    .find_map(|(name, r, field)| {
        let (soft, _) = getrlimit(r).ok()?;
        if soft == nix::sys::resource::RLIM_INFINITY {
            return None;
        }
        let used = proc_status_bytes(field).unwrap_or(0);
        let wanted = used.saturating_add(len).saturating_add(4 << 20);
        (wanted > soft).then_some((name, soft))
    })
}

/// A `/proc/self/status` field given in kB (`VmSize:  1234 kB`), in bytes.
fn proc_status_bytes(name: &str) -> Option<u64> {
    super::procfs::kb(&proc_status_field(name)?)
}

/// Whether this process has CAP_IPC_LOCK in its effective set (which lets it
/// lock memory beyond RLIMIT_MEMLOCK).
pub(crate) fn has_cap_ipc_lock() -> bool {
    SecurityStatus::read_self().has_cap(CAP_IPC_LOCK) == Some(true)
}

/// A field of `/proc/self/status` (`VmLck`, `Cpus_allowed_list`, ...).
pub(crate) fn proc_status_field(name: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    field(&status, name).map(str::to_string)
}

/// The value of `name` in a `/proc` text of `Name: value` lines, trimmed.
fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == name).then(|| v.trim())
    })
}

/// The machine's memory less its huge page pools, as hwloc counts a
/// node's (`MemTotal` less `Hugetlb` of `/proc/meminfo`), in bytes; `None`
/// when unreadable.
pub(crate) fn mem_total() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_total(&info)
}

/// [`mem_total`] of a `/proc/meminfo` text: `MemTotal` less `Hugetlb`
/// (every pool; before Linux 4.16, `HugePages_Total` x `Hugepagesize`).
pub(crate) fn parse_mem_total(info: &str) -> Option<u64> {
    let field = |name: &str| field(info, name);
    let kb = super::procfs::kb;
    let total = kb(field("MemTotal")?)?;
    let huge = match field("Hugetlb") {
        Some(v) => kb(v)?,
        None => {
            let pages = field("HugePages_Total").map_or(Some(0), |v| v.parse::<u64>().ok())?;
            let size = field("Hugepagesize").map_or(Some(0), kb)?;
            pages.checked_mul(size)?
        }
    };
    total.checked_sub(huge)
}

/// `CAP_IPC_LOCK`: lock memory beyond RLIMIT_MEMLOCK.
pub const CAP_IPC_LOCK: u32 = 14;
/// `CAP_SYS_NICE`: Docker's default seccomp profile allows `mbind`,
/// `set_mempolicy`, `get_mempolicy` and `set_mempolicy_home_node` to
/// holders.
pub const CAP_SYS_NICE: u32 = 23;

/// The fields of `/proc/self/status` that explain refused system calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SecurityStatus {
    /// `Seccomp:` 0 none, 1 strict, 2 filter.
    pub seccomp: Option<u8>,
    /// `Seccomp_filters:` how many filters are stacked (Linux 5.9).
    pub seccomp_filters: Option<u32>,
    /// `NoNewPrivs:`.
    pub no_new_privs: Option<bool>,
    /// `CapEff:` the effective capability set.
    pub cap_eff: Option<u64>,
}

impl SecurityStatus {
    /// The fields from the text of a `status` file (missing or malformed
    /// fields are `None`).
    pub fn parse(text: &str) -> SecurityStatus {
        let mut s = SecurityStatus::default();
        for l in text.lines() {
            let Some((k, v)) = l.split_once(':') else {
                continue;
            };
            let v = v.trim();
            match k {
                "Seccomp" => s.seccomp = v.parse().ok(),
                "Seccomp_filters" => s.seccomp_filters = v.parse().ok(),
                "NoNewPrivs" => s.no_new_privs = v.parse::<u8>().ok().map(|b| b != 0),
                "CapEff" => s.cap_eff = u64::from_str_radix(v, 16).ok(),
                _ => {}
            }
        }
        s
    }

    /// This process's (all `None` when `/proc/self/status` is unreadable).
    pub fn read_self() -> SecurityStatus {
        std::fs::read_to_string("/proc/self/status")
            .map(|t| SecurityStatus::parse(&t))
            .unwrap_or_default()
    }

    /// Whether capability `cap` is effective (`None`: unknown).
    pub fn has_cap(&self, cap: u32) -> Option<bool> {
        self.cap_eff.map(|c| cap < 64 && c & (1u64 << cap) != 0)
    }
}

/// `VmLck` of this process in bytes.
pub(crate) fn locked_bytes() -> u64 {
    proc_status_bytes("VmLck").unwrap_or(0)
}

/// What a person can do about a system error that is this process's or
/// this machine's (an open-file limit, a full disk, memory), for messages.
pub(crate) fn fix_for_io(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EMFILE) | Some(libc::ENFILE) => {
            "raise the open-file limit (`ulimit -n`) or close descriptors this process inherits"
        }
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => {
            "free space where numapin writes (TMPDIR for captures), or point TMPDIR at a folder with room"
        }
        Some(libc::ENOMEM) => "free memory, or raise this process's memory limit",
        Some(libc::EFBIG) => "raise the file-size limit (`ulimit -f`), or write to a place without one",
        _ => "check the machine's limits (`ulimit -a`, dmesg) and try again",
    }
}

/// Fails with the system's error (`EMFILE`, "Too many open files") unless
/// this process can open `n` more files at once.
pub(crate) fn check_free_fds(n: usize) -> io::Result<()> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(std::fs::File::open("/dev/null")?);
    }
    Ok(())
}

/// Whether `path` is on the kernel's own sysfs or procfs (a live system,
/// not a copy of one).
pub(crate) fn is_kernel_fs(path: &std::path::Path) -> bool {
    use nix::sys::statfs::{statfs, PROC_SUPER_MAGIC, SYSFS_MAGIC};
    statfs(path).is_ok_and(|s| {
        let t = s.filesystem_type();
        t == SYSFS_MAGIC || t == PROC_SUPER_MAGIC
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limit far above what a mapping needs is not blamed for its
    /// `ENOMEM` (that is `vm.max_map_count`, overcommit or the machine's);
    /// one the mapping would pass is. The limit set is 1 TiB above what
    /// this process maps, harmless to the tests running beside this one.
    #[test]
    fn only_a_limit_the_mapping_would_pass_is_named() {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let (soft, hard) = getrlimit(Resource::RLIMIT_AS).unwrap();
        let used = proc_status_bytes("VmSize").unwrap();
        let at = used + (1 << 40);
        if hard != nix::sys::resource::RLIM_INFINITY && hard < at {
            return; // cannot raise it that far here
        }
        setrlimit(Resource::RLIMIT_AS, at, hard).unwrap();
        let near = address_limit(1 << 20);
        let past = address_limit(2 << 40);
        setrlimit(Resource::RLIMIT_AS, soft, hard).unwrap();
        if getrlimit(Resource::RLIMIT_DATA).unwrap().0 == nix::sys::resource::RLIM_INFINITY {
            assert_eq!(near, None);
        }
        assert_eq!(past, Some(("RLIMIT_AS", at)));
    }

    #[test]
    fn affinity_matches_proc_status() {
        let mine = sched_getaffinity_self().unwrap();
        let listed = CpuList::parse(&proc_status_field("Cpus_allowed_list").unwrap()).unwrap();
        assert_eq!(mine, listed);
        assert!(!mine.is_empty());
    }

    #[test]
    fn kernel_filesystems_are_recognised() {
        assert!(is_kernel_fs(std::path::Path::new("/proc")));
        assert!(!is_kernel_fs(&std::env::temp_dir()));
    }

    #[test]
    fn security_fields() {
        let s = SecurityStatus::parse(
            "Name:\tcat\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\nCapEff:\t00000000a80425fb\n",
        );
        assert_eq!(
            (s.seccomp, s.seccomp_filters, s.no_new_privs),
            (Some(2), Some(1), Some(true))
        );
        // Docker's default capability set: no SYS_NICE, no IPC_LOCK, CHOWN.
        assert_eq!(s.has_cap(CAP_SYS_NICE), Some(false));
        assert_eq!(s.has_cap(CAP_IPC_LOCK), Some(false));
        assert_eq!(s.has_cap(0), Some(true));
        assert_eq!(SecurityStatus::parse("").has_cap(1), None);
        assert_eq!(SecurityStatus::parse("CapEff: zz").cap_eff, None);
        assert_eq!(
            SecurityStatus::parse("CapEff:\t000001ffffffffff").has_cap(64),
            Some(false)
        );
    }

    #[test]
    fn empty_affinity_is_refused() {
        assert!(sched_setaffinity(0, &CpuList::new()).is_err());
    }
}
