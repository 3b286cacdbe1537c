//! Whether a pid still names the process, and the program, it named when
//! its reading began: a process that exits while read and whose pid is
//! given to another, one that `exec`s, and one that changes its user
//! (`setuid`) are told apart from one read whole.

use crate::platform::procfs::{self, StatIdentity};

/// What was seen of a process at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Identity {
    /// From its `stat`: `None` where there is none (a folder of fake
    /// processes) or it is not one.
    stat: Option<StatIdentity>,
    /// The user ids of its `status` (`Uid:`: real, effective, saved,
    /// filesystem); empty where it has none or it could not be read.
    users: Vec<u32>,
}

/// How a process changed between two [`Identity`]s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Change {
    /// The same process running the same program.
    None,
    /// Another process holds the pid (a later start time).
    Reused,
    /// The same process, another program or user: what.
    Changed(&'static str),
}

impl Identity {
    /// From the bytes of a `stat` and a `status` file, or none (a folder
    /// of fake processes may have no `stat`).
    pub(super) fn from_files(stat: Option<&[u8]>, status: Option<&[u8]>) -> Self {
        Self {
            stat: stat.and_then(procfs::stat_identity),
            users: status
                .map(|b| procfs::parse_status(b).uids)
                .unwrap_or_default(),
        }
    }

    /// `later` against `self`.
    pub(super) fn change(&self, later: &Identity) -> Change {
        match (&self.stat, &later.stat) {
            (Some(a), Some(b)) if a.start != b.start => Change::Reused,
            // A `stat` read before and none now while its folder is there
            // again: the pid names a new process (its `stat` not yet
            // readable), never the same one.
            (Some(_), None) => Change::Reused,
            (Some(a), Some(b)) if a.program != b.program => {
                Change::Changed("program (exec or rename)")
            }
            // Real and effective (and saved, filesystem): a `seteuid` too.
            _ if self.users != later.users => Change::Changed("user (setuid)"),
            _ => Change::None,
        }
    }
}
