//! [`SharedError`]: what can go wrong making, finding or attaching shared
//! pinned memory.

use crate::arena::RuntimeError;
use crate::report::ErrorKind;

/// An error of [`SharedRegion`](super::SharedRegion),
/// [`AttachedRegion`](super::AttachedRegion) or
/// [`SlotPool`](super::SlotPool).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SharedError {
    /// Making the pinned memory failed (budget, memlock limit, placement,
    /// registration).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A name that cannot be used.
    #[error("shared memory name {name:?}: {problem}")]
    Name {
        /// The name given.
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// No process this one may look into holds shared memory of that name.
    #[error("no shared memory named {name:?} in the processes this one may look into")]
    NotFound {
        /// The name asked for.
        name: String,
    },
    /// A path that is not (or no longer) numapin shared memory this
    /// process may open.
    #[error("{path}: {problem}")]
    Attach {
        /// The path given or found.
        path: String,
        /// What is wrong.
        problem: String,
        /// The system's error, when there is one.
        #[source]
        source: Option<std::io::Error>,
    },
    /// A system call failed.
    #[error("{what} failed")]
    System {
        /// What was attempted.
        what: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A slot pool asked to do what it cannot (provisioned twice, from a
    /// process that did not make it, a slot it does not have).
    #[error("slot pool: {problem}")]
    Pool {
        /// What is wrong.
        problem: String,
    },
}

impl SharedError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            SharedError::Runtime(e) => e.kind(),
            SharedError::Attach {
                source: Some(e), ..
            } if e.kind() == std::io::ErrorKind::PermissionDenied => ErrorKind::Permission,
            SharedError::Name { .. }
            | SharedError::NotFound { .. }
            | SharedError::Attach { .. }
            | SharedError::Pool { .. } => ErrorKind::Input,
            SharedError::System { .. } => ErrorKind::System,
        }
    }

    /// What to do about it.
    pub fn fix(&self) -> Option<String> {
        Some(match self {
            SharedError::Runtime(e) => return e.fix(),
            SharedError::Name { .. } => {
                "use 1 to 64 letters, digits, '.', '_' or '-', not a name already in use".into()
            }
            SharedError::NotFound { .. } => "create it first (in a process of the same user that is still running), or wait for it: attach with a timeout".into(),
            SharedError::Attach { .. } => "attach while the process that made it runs, as the same user (or with ptrace access to it: /proc/<pid>/fd links obey ptrace rules)".into(),
            SharedError::System { .. } => "check the process's limits (`ulimit -a`: open files, locked memory) and free memory".into(),
            SharedError::Pool { .. } => "provision a pool once, from the process that created it".into(),
        })
    }

    pub(crate) fn system(what: impl Into<String>, source: std::io::Error) -> Self {
        SharedError::System {
            what: what.into(),
            source,
        }
    }
}
