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
    /// From the bytes of a `stat` file, or none (a folder of fake
    /// processes has none).
    pub(super) fn from_stat(stat: Option<&[u8]>) -> Self {
        Self {
            stat: stat.and_then(procfs::stat_identity),
        }
    }

    /// `later` against `self`, with the user ids read at each moment.
    pub(super) fn change(
        &self,
        later: &Identity,
        uid: Option<u32>,
        later_uid: Option<u32>,
    ) -> Change {
        match (&self.stat, &later.stat) {
            (Some(a), Some(b)) if a.start != b.start => Change::Reused,
            (Some(a), Some(b)) if a.program != b.program => Change::Changed("program (exec)"),
            _ if uid != later_uid => Change::Changed("user (setuid)"),
            _ => Change::None,
        }
    }
}
