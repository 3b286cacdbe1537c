//! How things are reported to people: errors' [`ErrorKind`] and
//! [`with_causes`], and plain-text tables ([`table`]). A leaf module: every
//! domain uses it, and it uses none of them.

pub mod table;
use std::fmt::Write as _;

/// What kind of failure an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Something the caller gave cannot be used: a file, an environment
    /// variable, a configuration value, a GPU or node that is not there.
    Input,
    /// A pinned-memory budget is spent (buffers must be freed first, or the
    /// budget raised).
    Budget,
    /// The system refused for want of a permission or a limit: the memlock
    /// limit, a system call blocked by a seccomp profile, a cpuset.
    Permission,
    /// The system, hwloc or the CUDA driver failed.
    System,
}

/// The message of `e` followed by each of its causes (`message: cause:
/// cause`), the way a person reads it in one line.
pub fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        // A wrapper that repeats its cause's text adds nothing.
        if !text.is_empty() && !s.ends_with(&text) {
            let _ = write!(s, ": {text}");
        }
        cause = c.source();
    }
    s
}
