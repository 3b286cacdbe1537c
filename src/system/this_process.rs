//! What this process may do: its memlock limit, its security status and
//! its memory policy.

use std::io;
use std::path::Path;

use crate::cpulist::CpuList;
use crate::platform::sys::SecurityStatus;
use crate::platform::{numa, numa_maps};

/// `proc/self/status` under `root` (all `None` when unreadable).
pub(super) fn security_under(root: &Path) -> SecurityStatus {
    std::fs::read_to_string(root.join("proc/self/status"))
        .map(|t| SecurityStatus::parse(&t))
        .unwrap_or_default()
}

/// RLIMIT_MEMLOCK: how many bytes this process may lock (`u64::MAX` is
/// unlimited). A process with CAP_IPC_LOCK is not held to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemlockLimit {
    /// The soft limit, the one enforced.
    pub soft: u64,
    /// The hard limit, the most the soft one can be raised to without
    /// privilege.
    pub hard: u64,
}

impl MemlockLimit {
    /// The value meaning "unlimited".
    pub const UNLIMITED: u64 = u64::MAX;

    /// This process's limit.
    ///
    /// # Errors
    ///
    /// [`MemlockError`] when `getrlimit` fails (it does not on Linux for
    /// this resource; the error keeps the system's reason).
    pub fn read() -> Result<Self, MemlockError> {
        crate::platform::sys::memlock_limit()
            .map(|(soft, hard)| MemlockLimit { soft, hard })
            .map_err(|source| MemlockError { source })
    }
}

/// `getrlimit(RLIMIT_MEMLOCK)` failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot read RLIMIT_MEMLOCK: {source}")]
pub struct MemlockError {
    /// The system's error.
    #[source]
    pub(crate) source: io::Error,
}

impl MemlockError {
    /// The system's error.
    pub fn cause(&self) -> &io::Error {
        &self.source
    }
}

/// A memory policy mode, as `get_mempolicy(2)` numbers them (the mode
/// flags in the high bits set aside).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PolicyMode {
    /// `MPOL_DEFAULT` (0): the node of the CPU that first touches a page.
    Default,
    /// `MPOL_PREFERRED` (1): one node first, others when it is full.
    Preferred,
    /// `MPOL_BIND` (2): only these nodes.
    Bind,
    /// `MPOL_INTERLEAVE` (3): pages spread over these nodes.
    Interleave,
    /// `MPOL_LOCAL` (4): the node of the CPU that allocates.
    Local,
    /// `MPOL_PREFERRED_MANY` (5): these nodes first.
    PreferredMany,
    /// `MPOL_WEIGHTED_INTERLEAVE` (6): spread by per-node weights.
    WeightedInterleave,
    /// A mode this version of numapin does not know (its number).
    Other(i32),
}

impl PolicyMode {
    /// The mode of a raw `get_mempolicy` mode (flags such as
    /// `MPOL_F_STATIC_NODES` ignored).
    pub fn from_raw(mode: i32) -> Self {
        match mode & 0xff {
            0 => PolicyMode::Default,
            1 => PolicyMode::Preferred,
            2 => PolicyMode::Bind,
            3 => PolicyMode::Interleave,
            4 => PolicyMode::Local,
            5 => PolicyMode::PreferredMany,
            6 => PolicyMode::WeightedInterleave,
            n => PolicyMode::Other(n),
        }
    }

    /// The name `numactl` uses (`default`, `bind`, `preferred-many`, ...;
    /// `unknown` for [`PolicyMode::Other`]).
    pub fn as_str(&self) -> &'static str {
        match self {
            PolicyMode::Default => "default",
            PolicyMode::Preferred => "preferred",
            PolicyMode::Bind => "bind",
            PolicyMode::Interleave => "interleave",
            PolicyMode::Local => "local",
            PolicyMode::PreferredMany => "preferred-many",
            PolicyMode::WeightedInterleave => "weighted-interleave",
            PolicyMode::Other(_) => "unknown",
        }
    }
}

impl std::fmt::Display for PolicyMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a [`ThreadPolicy`] was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicySource {
    /// `get_mempolicy(2)`.
    GetMempolicy,
    /// The main thread's `stack` line of `proc/self/numa_maps`, because
    /// `get_mempolicy` was refused (the error's name: `EPERM`, ...).
    NumaMaps {
        /// Why `get_mempolicy` could not be used.
        refused: String,
    },
}

/// The calling thread's memory policy.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ThreadPolicy {
    /// The mode.
    pub mode: PolicyMode,
    /// The policy's nodes (empty for `default` and `local`).
    pub nodes: Vec<u32>,
    /// Where it was read from.
    pub source: PolicySource,
}

impl ThreadPolicy {
    /// The calling thread's policy, from `get_mempolicy(2)`; when a seccomp
    /// profile or security module refuses that call, the main thread's
    /// from `proc/self/numa_maps` under `root` (`/` for this process).
    ///
    /// # Errors
    ///
    /// [`MempolicyError::Refused`] when the call is refused and
    /// `numa_maps` shows no policy; [`MempolicyError::Failed`] when the
    /// call failed otherwise.
    pub fn read_under(root: &Path) -> Result<Self, MempolicyError> {
        match numa::get_mempolicy() {
            Ok((mode, nodes)) => Ok(ThreadPolicy {
                mode: PolicyMode::from_raw(mode),
                nodes,
                source: PolicySource::GetMempolicy,
            }),
            Err(e) if numa::is_refusal(&e) => {
                let errno = numa::errno_name(&e);
                std::fs::read(root.join("proc/self/numa_maps"))
                    .ok()
                    .and_then(|t| numa_maps::task_policy(&t))
                    .and_then(|p| parse_policy(&p))
                    .map(|(mode, nodes)| ThreadPolicy {
                        mode,
                        nodes,
                        source: PolicySource::NumaMaps {
                            refused: errno.clone(),
                        },
                    })
                    .ok_or(MempolicyError::Refused { errno })
            }
            Err(source) => Err(MempolicyError::Failed { source }),
        }
    }
}

/// Why the memory policy could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MempolicyError {
    /// `get_mempolicy` was refused and `proc/self/numa_maps` shows no
    /// policy either.
    #[error("get_mempolicy refused ({errno}) and /proc/self/numa_maps shows no policy")]
    Refused {
        /// The refusal's error name (`EPERM`, `EACCES`, `ENOSYS`).
        errno: String,
    },
    /// `get_mempolicy` failed for another reason.
    #[error("{source}")]
    Failed {
        /// The system's error.
        #[source]
        source: io::Error,
    },
}

/// A policy as `numa_maps` prints it (`default`, `bind:0-1`,
/// `prefer (many)=static:1`); `None` for text it does not know.
pub(crate) fn parse_policy(text: &str) -> Option<(PolicyMode, Vec<u32>)> {
    let (name, nodes) = match text.split_once(':') {
        Some((n, l)) => (n, CpuList::parse(l).ok()?.iter().collect()),
        None => (text, Vec::new()),
    };
    // Mode flags (`=static`, `=relative`) follow the name.
    let name = name.split('=').next().unwrap_or(name);
    let mode = match name {
        "default" => PolicyMode::Default,
        "prefer" => PolicyMode::Preferred,
        "bind" => PolicyMode::Bind,
        "interleave" => PolicyMode::Interleave,
        "local" => PolicyMode::Local,
        "prefer (many)" => PolicyMode::PreferredMany,
        "weighted interleave" => PolicyMode::WeightedInterleave,
        _ => return None,
    };
    Some((mode, nodes))
}
