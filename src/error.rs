//! Errors for code and for people.
//!
//! Each domain has its own error enum, named for the module that returns
//! it ([`TopologyError`], [`AffinityError`], [`RuntimeError`],
//! [`LoaderError`], [`StagedError`], [`StorageError`], [`SharedError`],
//! [`ProcessError`]); the parts several of them share are written once
//! here and wrapped ([`SystemError`]: a system or driver failure;
//! [`EnvError`]: an environment variable that cannot be used). Every one
//! of them:
//!
//! * says in its message what it read (a file, an environment variable, a
//!   node, a GPU) and what is wrong with it;
//! * keeps the cause it came from ([`std::io::Error`], a
//!   [`CudaError`](crate::gpu::CudaError)) as its
//!   [`source`](std::error::Error::source), never as text only;
//! * tells what to do through `fix()`, and what kind of failure it is
//!   through `kind()` ([`ErrorKind`]), so a program can tell bad input from
//!   a refused limit from a system failure without reading the text.
//!
//! [`Error`] holds any of them, for callers that use `?` across domains.

pub use crate::report::{with_causes, BoxError, EnvError, ErrorKind, SystemError};

pub use crate::affinity::AffinityError;
pub use crate::loader::LoaderError;
pub use crate::procs::ProcessError;
pub use crate::runtime::RuntimeError;
pub use crate::shared::SharedError;
pub use crate::staged::StagedError;
pub use crate::storage::StorageError;
pub use crate::topology::TopologyError;

/// Any numapin error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading a machine's topology failed.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// Planning or applying a binding failed.
    #[error(transparent)]
    Affinity(#[from] AffinityError),
    /// The runtime failed: placing work, lending pinned memory, binding.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A loader failed.
    #[error(transparent)]
    Loader(#[from] LoaderError),
    /// A staged copy or a pinned copy failed.
    #[error(transparent)]
    Staged(#[from] StagedError),
    /// Shared pinned memory ([`crate::shared`]).
    #[error(transparent)]
    Shared(#[from] SharedError),
    /// Reading files (a checkpoint, a dataset) failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Reading another process ([`crate::procs`]).
    #[error(transparent)]
    Process(#[from] ProcessError),
}

/// `Result` with numapin's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Topology(e) => e.kind(),
            Error::Affinity(e) => e.kind(),
            Error::Runtime(e) => e.kind(),
            Error::Loader(e) => e.kind(),
            Error::Staged(e) => e.kind(),
            Error::Shared(e) => e.kind(),
            Error::Storage(e) => e.kind(),
            Error::Process(e) => e.kind(),
        }
    }

    /// What to do about it, when numapin knows.
    pub fn fix(&self) -> Option<String> {
        match self {
            Error::Topology(e) => e.fix(),
            Error::Affinity(e) => e.fix(),
            Error::Runtime(e) => e.fix(),
            Error::Loader(e) => e.fix(),
            Error::Staged(e) => e.fix(),
            Error::Shared(e) => e.fix(),
            Error::Storage(e) => e.fix(),
            Error::Process(e) => e.fix(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_follow_the_message_once() {
        let io = std::io::Error::from_raw_os_error(libc::ENOENT);
        let e = Error::from(TopologyError::Input {
            input: "/x.xml".into(),
            problem: "cannot read it".into(),
            fix: "check the path".into(),
            source: Some(io.into()),
        });
        let text = with_causes(&e);
        assert!(text.starts_with("/x.xml: cannot read it: "), "{text}");
        assert_eq!(text.matches("No such file").count(), 1, "{text}");
        assert_eq!(e.kind(), ErrorKind::Input);
        assert_eq!(e.fix().as_deref(), Some("check the path"));
        assert!(std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some());
    }
}
